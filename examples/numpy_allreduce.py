"""Average a NumPy array across ranks with hvdlite's core API.

Run:  hvdliterun -np 2 python examples/numpy_allreduce.py
"""

import numpy as np

import hvdlite as hvd


def main() -> None:
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    local = np.full(4, float(rank), dtype=np.float32)
    average = hvd.allreduce(local, name="values")
    total = hvd.allreduce(local, name="values", op=hvd.Sum)
    gathered = hvd.allgather(np.array([rank]), name="ranks")
    expected = (size - 1) / 2
    assert np.allclose(average, expected), average
    print(f"rank {rank}/{size}: average {average.tolist()} sum {total.tolist()} ranks {gathered.tolist()}")
    hvd.shutdown()


if __name__ == "__main__":
    main()
