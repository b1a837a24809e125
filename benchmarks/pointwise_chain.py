"""A long pointwise chain on the CPU: the tanh-GELU backward, dx = dy * gelu'(u), as the tensor-parallel
transformer layer's backward computes it per rank (18 ops, one meshfuse `pointwise` segment, compiled into
one loop by the host's compiler as MESHFUSE_CPU_CODEGEN=auto does at this size, and interpreted), against
numpy (one pass with a temporary per op) and JAX jit (PyPI `jax`, CPU, one XLA thread; optional: its row
is left out when it is not installed), in one table, results checked against float64.

    OMP_NUM_THREADS=1 taskset -c 0 .venv/bin/python benchmarks/pointwise_chain.py

Columns: ms (best of --repeat runs of --calls calls), GB/s (u and dy read, dx written, over time) and
meshfuse's speed-up over each peer (their time over meshfuse's).
"""
import argparse
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "python"))
from meshfuse import FusionDefinition  # noqa: E402
from timing import best_time, positive_int, scoped_env  # noqa: E402

C, A = math.sqrt(2.0 / math.pi), 0.044715


def gelu_backward(xp, u, dy):
    """dy * d/du [0.5 u (1 + tanh(C (u + A u^3)))], written as the layer's backward writes it."""
    t = xp.tanh((u + u * u * u * A) * C)
    left = (t + 1.0) * 0.5
    right = u * 0.5 * (1.0 - t * t) * ((u * u * (3.0 * A) + 1.0) * C)
    return dy * (left + right)


def define(shape):
    with FusionDefinition() as fd:
        u, dy = fd.define_tensor(list(shape)), fd.define_tensor(list(shape))
        ops = fd.ops
        u3 = ops.mul(ops.mul(u, u), u)
        t = ops.tanh(ops.mul(ops.add(u, ops.mul(u3, A)), C))
        left = ops.mul(ops.add(t, 1.0), 0.5)
        dt = ops.sub(1.0, ops.mul(t, t))
        dinner = ops.mul(ops.add(ops.mul(ops.mul(u, u), 3.0 * A), 1.0), C)
        right = ops.mul(ops.mul(ops.mul(u, 0.5), dt), dinner)
        fd.add_output(ops.mul(dy, ops.add(left, right)))
    return fd


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", type=positive_int, nargs=2, default=[512, 2048], help="default: the layer's per-rank [s, 4e/d]")
    ap.add_argument("--calls", type=positive_int, default=20)
    ap.add_argument("--repeat", type=positive_int, default=7)
    args = ap.parse_args()
    os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")
    rng = np.random.default_rng(0)
    u, dy = (rng.standard_normal(args.shape).astype(np.float32) for _ in range(2))
    fd = define(args.shape)
    (got,) = fd.execute([u, dy])
    want = gelu_backward(np, u.astype(np.float64), dy.astype(np.float64))
    err = float(np.abs(got - want).max())
    assert err < 1e-4, f"meshfuse differs from float64 by {err}"
    assert sum("LaunchSegment pointwise" in line for line in fd.host_ir().splitlines()) == 1
    rows = [("meshfuse (1 segment)", best_time(lambda: fd.execute([u, dy]), args.calls, args.repeat))]
    # The same segment through the interpreter (one pass over a tile buffer per op), which the
    # compiled loop (MESHFUSE_CPU_CODEGEN=auto, its default) replaces at this size.
    with scoped_env("MESHFUSE_CPU_CODEGEN", "off"):
        rows.append(("meshfuse interpreted", best_time(lambda: fd.execute([u, dy]), args.calls, args.repeat)))
    rows.append(("numpy", best_time(lambda: gelu_backward(np, u, dy), args.calls, args.repeat)))
    try:
        import jax
        import jax.numpy as jnp
        jax.config.update("jax_platform_name", "cpu")
        jf = jax.jit(lambda a, b: gelu_backward(jnp, a, b))
        ju, jdy = jax.device_put(u), jax.device_put(dy)
        rows.append(("jax jit", best_time(lambda: jf(ju, jdy).block_until_ready(), args.calls, args.repeat)))
    except ImportError:
        print("jax is not installed: its row is left out (scripts/setup --bench installs it)", file=sys.stderr)
    bytes_moved = 3 * u.nbytes
    print(f"tanh-GELU backward, {args.shape} float32, max |error| vs float64 {err:.2e}")
    print(f"{'implementation':<22}{'ms':>9}{'GB/s':>8}  meshfuse speed-up")
    for name, t in rows:
        ratio = "" if name == rows[0][0] else f"{t / rows[0][1]:.2f}x"
        print(f"{name:<22}{t * 1e3:>9.3f}{bytes_moved / t / 1e9:>8.2f}  {ratio}")


if __name__ == "__main__":
    main()
