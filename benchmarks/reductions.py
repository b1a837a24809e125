"""Reductions on the CPU: sum, max and mean of a float32 [rows, cols] matrix over the last axis (a
contiguous run per output) and over the first (a column reduction), against numpy and JAX's jit on the
same arrays, each result checked against float64 numpy first. The reduction kernels are in
runtime/cpu/reduction.cpp.

    OMP_NUM_THREADS=1 taskset -c 1 .venv/bin/python benchmarks/reductions.py

Columns: ms of meshfuse, numpy and JAX (best of --repeat runs of --calls calls), meshfuse's GB/s (the
input read once), and the ratios (numpy / meshfuse and jax / meshfuse: above 1, meshfuse is faster).
JAX runs on as many threads as XLA takes (it has no OMP_NUM_THREADS); set
XLA_FLAGS=--xla_cpu_multi_thread_eigen=false for one.
"""
import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from meshfuse import DataType, FusionDefinition  # noqa: E402
from timing import best_time, positive_int  # noqa: E402

try:
    import jax
    import jax.numpy as jnp
except ImportError:  # the table then has no JAX column
    jax = None


def reduction(op, shape, axis):
    with FusionDefinition() as fd:
        x = fd.define_tensor(list(shape), DataType.Float)
        fd.add_output(getattr(fd.ops, op)(x, [axis]))
    return fd


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", nargs="+", default=["2048x2048", "4096x4096"], help="rows x cols of float32")
    ap.add_argument("--calls", type=positive_int, default=3)
    ap.add_argument("--repeat", type=positive_int, default=7)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    print(f"{'case':<28}{'meshfuse':>10}{'numpy':>9}{'jax':>9}{'GB/s':>8}{'np/mf':>8}{'jax/mf':>8}")
    for text in args.shapes:
        shape = tuple(int(v) for v in text.split("x"))
        x = rng.standard_normal(shape).astype(np.float32)
        x[0, shape[1] // 3] = np.nan  # a NaN for max to carry (and sum and mean) in row 0
        x64 = x.astype(np.float64)
        for op in ("sum", "max", "mean"):
            for axis in (1, 0):
                fd = reduction(op, shape, axis)
                got = fd.execute([x])[0]
                np.testing.assert_allclose(got, getattr(np, op)(x64, axis=axis), rtol=1e-5, atol=1e-4,
                                           err_msg=f"{op} axis {axis}")
                t_mf = best_time(lambda: fd.execute([x]), args.calls, args.repeat)
                t_np = best_time(lambda: getattr(np, op)(x, axis=axis), args.calls, args.repeat)
                t_jax = float("nan")
                if jax is not None:
                    jitted = jax.jit(lambda v, op=op, axis=axis: getattr(jnp, op)(v, axis=axis))
                    xj = jnp.asarray(x)
                    t_jax = best_time(lambda: jitted(xj).block_until_ready(), args.calls, args.repeat)
                name = f"{op} axis {axis} {text}"
                print(f"{name:<28}{t_mf * 1e3:>10.3f}{t_np * 1e3:>9.3f}{t_jax * 1e3:>9.3f}"
                      f"{x.nbytes / t_mf / 1e9:>8.1f}{t_np / t_mf:>8.2f}{t_jax / t_mf:>8.2f}", flush=True)


if __name__ == "__main__":
    main()
