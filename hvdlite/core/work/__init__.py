"""What travels through the pipeline: a request (and the handle its caller waits on), the response
every rank agreed on, the work item the executor runs, with the dtypes, names, tensor segments and
scope they carry. Below every stage and plane, so those never import each other for these."""
