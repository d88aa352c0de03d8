"""JAX GPU arrays through hvdlite, outside jit: results stay on the GPU and equal the host math."""

import jax
import jax.numpy as jnp
import numpy as np

import hvdlite.jax as hvd


def main():
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    gpu = jax.devices("gpu")[hvd.local_rank() % len(jax.devices("gpu"))]
    for dtype in (jnp.float32, jnp.bfloat16, jnp.float16, jnp.int32):
        mine = jax.device_put(jnp.arange(12, dtype=dtype).reshape(3, 4) + rank, gpu)
        total = sum(np.arange(12, dtype=np.float64).reshape(3, 4) + r for r in range(size))
        summed = hvd.allreduce(mine, op=hvd.Sum, name=f"sum.{jnp.dtype(dtype).name}")
        assert summed.devices() == {gpu} and summed.dtype == dtype, (summed.devices(), summed.dtype)
        np.testing.assert_allclose(np.asarray(summed, np.float64), total, rtol=1e-2)
        gathered = hvd.allgather(mine, name=f"gather.{jnp.dtype(dtype).name}")
        assert gathered.shape == (3 * size, 4) and gathered.devices() == {gpu}
        np.testing.assert_array_equal(np.asarray(gathered[3 * rank:3 * rank + 3]), np.asarray(mine))
        root = hvd.broadcast(mine, root_rank=0, name=f"bcast.{jnp.dtype(dtype).name}")
        np.testing.assert_array_equal(np.asarray(root, np.float64), np.arange(12).reshape(3, 4))
    print("ok jax", flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
