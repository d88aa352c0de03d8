"""MPI jobs among processes another engine placed: Spark tasks, Ray actors (``hvdlite.spark``, ``hvdlite.ray``).

The engine places and starts one *task* per rank (a Spark barrier task, a Ray actor); hvdlite only
forms the MPI world among them, through the launcher it already has:

- each task runs a :class:`~.task.TaskService` and tells the driver its address;
- the driver runs ``hvdliterun`` with one host alias per task (``task-0``, ``task-1``...) and
  :mod:`.agent` as its remote-start program (the Kubernetes MPI job path: Hydra's
  ``-launcher-exec``). Hydra calls the agent once per alias; the agent has that task run Hydra's
  proxy, which starts the rank, so rank ``i`` runs inside task ``i`` and dies with it;
- every rank runs :mod:`.rank`: it fetches the user's function from its task, runs it and hands
  the result (or the traceback) back to the task, which returns it to the engine;
- :mod:`.job` is the driver's side: it runs the launcher, tells every task when the job is over,
  and turns the tasks' outcomes into results by rank or an error naming the failed rank.
"""
