"""Horovod's own ``horovod.spark.run`` / ``run_elastic`` tests (test/integration/test_spark.py and
test_spark_torch.py in horovod/horovod), with only their imports and harness changed: ``horovod`` is
``hvdlite``, and their ``spark_session(...)`` is the suite's shared local cluster (the ``spark``
fixture, ``local-cluster[2,1,1024]``, where Spark runs a failed task up to 4 times; Horovod's
fault-tolerant test asks for ``max_failures=3``). The training function ``fn`` and the expected
values are Horovod's, line for line."""

import io
import logging
import os
import sys

import cloudpickle
import pytest

import hvdlite.spark as horovod_spark

pytestmark = pytest.mark.multirank
torch = pytest.importorskip("torch")
cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.fixture(autouse=True)
def warm_executors(spark):
    """Harness: Horovod's tests give the tasks 5-10 s to start, on a Spark session of their own on an
    idle machine; here the session is shared and the machine busy, so each executor's Python worker
    (which Spark keeps for the next task) is started by a trivial job first."""
    spark.sparkContext.parallelize(range(4), 2).map(lambda value: value).collect()


def happy_fn():
    """The function of Horovod's do_test_happy_run and test_happy_run_elastic (test_spark.py)."""
    import torch

    import hvdlite.torch as hvd

    hvd.init()
    print(f'running fn {hvd.size()}')
    print('error line', file=sys.stderr)
    res = hvd.allgather(torch.tensor([hvd.rank()])).tolist()
    return res, hvd.rank()


def test_happy_run(spark):
    stdout, stderr = io.StringIO(), io.StringIO()
    res = horovod_spark.run(happy_fn, start_timeout=10, use_mpi=False, use_gloo=True,
                            env={'HOROVOD_LOG_LEVEL': 'WARNING'}, stdout=stdout, stderr=stderr, verbose=2)
    assert [([0, 1], 0), ([0, 1], 1)] == res
    assert_regex(stdout.getvalue(), r'\[[01]\]<stdout>:running fn 2\n'
                                    r'\[[01]\]<stdout>:running fn 2\n')
    assert_regex(stderr.getvalue(), r'\[[01]\]<stderr>:error line\n'
                                    r'\[[01]\]<stderr>:error line\n')


def test_happy_run_elastic_prints_as_horovod(spark):
    """test_spark.py's test_happy_run_elastic."""
    stdout, stderr = io.StringIO(), io.StringIO()
    res = horovod_spark.run_elastic(happy_fn, num_proc=2, min_num_proc=2, max_num_proc=2,
                                    env={'HOROVOD_LOG_LEVEL': 'WARNING'}, stdout=stdout, stderr=stderr,
                                    start_timeout=10, verbose=2)
    assert [([0, 1], 0), ([0, 1], 1)] == res
    assert_regex(stdout.getvalue(), r'\[[01]\]<stdout>:running fn 2\n'
                                    r'\[[01]\]<stdout>:running fn 2\n')
    assert_regex(stderr.getvalue(), r'\[[01]\]<stderr>:error line\n'
                                    r'\[[01]\]<stderr>:error line\n')


def test_happy_run_elastic(spark):
    """test_spark_torch.py's test_happy_run_elastic."""
    res = horovod_spark.run_elastic(fn, args=(2, 5, 4), num_proc=2, min_num_proc=2, max_num_proc=2,
                                    start_timeout=10, verbose=2)
    assert [([0, 3, 0, 1, 1, 3, 0, 1], 0), ([0, 3, 0, 1, 1, 3, 0, 1], 1)] == res


def test_happy_run_elastic_fault_tolerant(spark, tmp_path):
    """test_spark_torch.py's test_happy_run_elastic_fault_tolerant: three ranks raise, one at a time,
    rank 0 among them; each time Spark runs the task again and its new rank joins."""
    dir = str(tmp_path)
    # these files make training function fail in given rank, epoch and batch
    with open(os.path.sep.join([dir, 'rank_1_epoch_2_batch_4_fail']), 'w'), \
         open(os.path.sep.join([dir, 'rank_0_epoch_3_batch_1_fail']), 'w'), \
         open(os.path.sep.join([dir, 'rank_1_epoch_4_batch_2_fail']), 'w'):
        pass
    res = horovod_spark.run_elastic(fn, args=(2, 5, 5, dir), env={'HOROVOD_LOG_LEVEL': 'DEBUG'},
                                    num_proc=2, min_num_proc=2, max_num_proc=2, start_timeout=5, verbose=2)
    assert [([0, 4, 0, 4, 1, 4, 0, 4], 0), ([0, 4, 0, 4, 1, 4, 0, 4], 1)] == res


def assert_regex(text, pattern):
    import re

    assert re.search(pattern, text), f"{pattern!r} not in:\n{text}"


def check_fail(dir, rank, epoch, batch):
    if dir:
        fail = os.path.sep.join([dir, 'rank_{}_epoch_{}_batch_{}_fail'.format(rank, epoch, batch)])  # noqa: UP032
        if os.path.exists(fail):
            logging.info('rank %s: failing epoch %s batch %s', rank, epoch, batch)
            os.unlink(fail)
            raise Exception('training failed, restart the task')


def fn(batches_per_commit, batches_per_epoch, epochs, dir=None):
    import torch
    from torch.nn import functional as F

    import hvdlite.torch as hvd
    from hvdlite.torch.elastic import run

    @run
    def train(state, dir):
        state.rendezvous += 1
        logging.info('rank %s: rendezvous %s', hvd.rank(), state.rendezvous)

        for state.epoch in range(state.epoch, epochs):  # noqa: B020 - Horovod's test, as written
            logging.info('rank %s: start epoch %s at batch %s', hvd.rank(), state.epoch, state.batch)

            for state.batch in range(state.batch, batches_per_epoch):  # noqa: B020
                check_fail(dir, hvd.rank(), state.epoch, state.batch)

                optimizer.zero_grad()
                output = model(data)
                loss = F.cross_entropy(output, target)
                loss.backward()
                optimizer.step()

                if state.batch % batches_per_commit == 0:
                    logging.info('rank %s: allgather', hvd.rank())
                    hvd.allgather(torch.tensor([hvd.rank(), state.epoch, state.batch, state.rendezvous]),
                                  'state').tolist()
                    logging.info('rank %s: commit epoch %s batch %s', hvd.rank(), state.epoch, state.batch)
                    state.commits += 1
                    state.commit()

            logging.info('rank %s: allgather', hvd.rank())
            hvd.allgather(torch.tensor([hvd.rank(), state.epoch, state.batch, state.rendezvous]), 'state').tolist()
            logging.info('rank %s: commit epoch %s', hvd.rank(), state.epoch)
            state.commits += 1
            state.commit()
            state.batch = 0

        res = hvd.allgather(torch.tensor([hvd.rank(), state.epoch, state.batch, state.rendezvous]), 'state').tolist()
        logging.info('rank %s: returning', hvd.rank())
        return res, hvd.rank()

    logging.getLogger().setLevel(logging.DEBUG)
    logging.basicConfig(format='%(asctime)-15s %(levelname)1.1s %(filename)s:%(lineno)d %(funcName)s() - %(message)s')

    hvd.init()

    batch_size = 32
    data = torch.randn(batch_size, 2)
    target = torch.LongTensor(batch_size).random_() % 2

    v = 1.0
    model = torch.nn.Sequential(torch.nn.Linear(2, 2))
    model.load_state_dict({
        '0.weight': torch.tensor([[v, v], [v, v]]),
        '0.bias': torch.tensor([v, v])
    })

    optimizer = torch.optim.SGD(model.parameters(), lr=0.001)
    state = hvd.elastic.TorchState(model, optimizer, batch=0, epoch=0, commits=0, rendezvous=0)
    return train(state, dir)


def test_happy_run_elastic_fault_tolerant_fails(spark, tmp_path):
    """test_spark_torch.py's test_happy_run_elastic_fault_tolerant_fails, which Horovod skips ("elastic
    horovod does not support shutdown from the spark driver while elastic driver is waiting for hosts
    to come up"): here the rank in task 1 raises on every attempt, Spark gives the task up after its
    4 attempts (Horovod's test: as many failures as max_failures), and the job fails naming it."""
    from hvdlite.runner.remote.job import RemoteJobError

    dir = str(tmp_path)
    for epoch in range(5):  # more failures than Spark runs the task
        open(os.path.sep.join([dir, f'rank_1_epoch_{epoch}_batch_0_fail']), 'w').close()
    with pytest.raises((RemoteJobError, horovod_spark.SparkJobError), match='training failed, restart the task'):
        horovod_spark.run_elastic(fn, args=(2, 5, 5, dir), num_proc=2, min_num_proc=2, max_num_proc=2,
                                  start_timeout=5, verbose=2)
    assert spark.sparkContext.statusTracker().getActiveJobsIds() == []
