"""A tensor-parallel MLP (Megatron style) on every rank of `mpirun -np N`:

    y = linear(gelu(linear(x, w1, b1)), w2, b2)

w1 is split by rows (column-parallel: each rank computes a slice of the hidden layer) and w2 by
columns (row-parallel: each rank's partial product is summed by an allreduce that meshfuse
inserts). The program is defined once with global shapes; each rank passes its own shards.

    mpirun -np 2 python examples/tp_mlp.py [--backend mpi|gloo|ucc|auto|nccl|cuda] [--batch 8] [--hidden 256]
"""
import argparse

import numpy as np

from meshfuse import CommunicatorBackend, DataType, FusionDefinition, ParallelType
from meshfuse.multidevice import Communicator, DeviceMesh, shard_tensor


def gelu(x):
    from math import erf, sqrt

    return 0.5 * x * (1.0 + np.vectorize(erf)(x / sqrt(2.0)))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", default="auto", choices=[b.name for b in CommunicatorBackend.__members__.values()])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=256)
    args = parser.parse_args()

    comm = Communicator.instance()
    rank, d = comm.rank, comm.size
    b, h = args.batch, args.hidden
    mesh = DeviceMesh(range(d))

    with FusionDefinition(backend_type=getattr(CommunicatorBackend, args.backend)) as fd:
        x = fd.define_tensor(shape=[-1, h], dtype=DataType.Float)  # -1: the batch is bound at execute
        w1 = fd.define_tensor(shape=[4 * h, h], dtype=DataType.Float)
        b1 = fd.define_tensor(shape=[4 * h], dtype=DataType.Float)
        w2 = fd.define_tensor(shape=[h, 4 * h], dtype=DataType.Float)
        b2 = fd.define_tensor(shape=[h], dtype=DataType.Float)
        hidden = fd.ops.gelu(fd.ops.linear(x, w1, b1))
        y = fd.ops.linear(hidden, w2, b2)
        fd.add_output(y)
        for tv in (x, w1, b1, w2, b2, hidden, y):
            tv.set_device_mesh(mesh)
        for tv, axis in ((w1, 0), (b1, 0), (hidden, 1), (w2, 1)):
            tv.outer_split(axis, d)
            tv.axis(axis).parallelize(ParallelType.mesh_x)

    # Every rank makes the same global data (same seed) and keeps its shards.
    rng = np.random.default_rng(0)
    full = {
        "x": rng.standard_normal((b, h), dtype=np.float32),
        "w1": rng.standard_normal((4 * h, h), dtype=np.float32) / np.sqrt(h),
        "b1": rng.standard_normal(4 * h, dtype=np.float32),
        "w2": rng.standard_normal((h, 4 * h), dtype=np.float32) / np.sqrt(4 * h),
        "b2": rng.standard_normal(h, dtype=np.float32),
    }
    full = {k: v.astype(np.float32) for k, v in full.items()}
    tvs = {"x": x, "w1": w1, "b1": b1, "w2": w2, "b2": b2}
    inputs = [shard_tensor(full[name], tvs[name], rank) for name in tvs]

    (y_local,) = fd.execute(inputs)

    f64 = {k: v.astype(np.float64) for k, v in full.items()}
    reference = gelu(f64["x"] @ f64["w1"].T + f64["b1"]) @ f64["w2"].T + f64["b2"]
    error = float(np.max(np.abs(y_local - reference)))
    if rank == 0:
        print(fd.host_ir())
    comm.barrier()
    print(f"rank {rank}/{d}: y {y_local.shape} {y_local.dtype}, max |error| vs float64 reference = {error:.2e}", flush=True)
    if error > 1e-3:
        raise SystemExit(f"rank {rank}: error {error} is too large")


if __name__ == "__main__":
    main()
