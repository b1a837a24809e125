"""Normalization kernels (issue 12): LayerNorm forward, RMSNorm forward, softmax forward and the
LayerNorm backward (dx, dgamma, dbeta), each one meshfuse `normalization` segment, against the
device's usual peers and a plain copy of the array (the memory limit), in one table.

CPU (the default), one thread, [4096, 4096] fp32, against numpy (the usual multi-pass formulas)
and JAX jit (PyPI `jax`, CPU; optional: its rows are left out when it is not installed):

    scripts/setup --bench                      # once: JAX from PyPI into .venv (about 30 s)
    OMP_NUM_THREADS=1 taskset -c 0 .venv/bin/python benchmarks/norms.py --device cpu

The script sets XLA_FLAGS for one XLA thread unless XLA_FLAGS is already set.

Columns: ms (best of --repeat runs, after a warm-up), GB/s (bytes every run must read and write
at least, over time), "x copy" (time over the copy's time: 1.0 is memory speed) and, for meshfuse,
speed-ups over numpy and JAX (their time over meshfuse's).

Adding a device: write `bench_<device>(args)` returning rows of (case, impl, seconds, bytes) and
register it in DEVICES; `main` prints the table. The case definitions (meshfuse fusions and the
float64 references they are checked against) are device independent.
"""
import argparse
import os
import sys

import numpy as np

from meshfuse import DataType, FusionDefinition
from timing import best_time, positive_int

EPS = 1e-5
CASES = ("layernorm", "rmsnorm", "softmax", "layernorm_bwd")


# ---- meshfuse definitions (shared by every device) ---------------------------------------------
def define(case, rows, cols, dtype=DataType.Float):
    """The meshfuse FusionDefinition of a case on [rows, cols] inputs."""
    with FusionDefinition() as fd:
        x = fd.define_tensor([rows, cols], dtype)
        if case == "layernorm":
            w, b = fd.define_tensor([cols], dtype), fd.define_tensor([cols], dtype)
            var, mean = fd.ops.var_mean(x, [1], 0, True)
            y = fd.ops.mul(fd.ops.sub(x, mean), fd.ops.rsqrt(fd.ops.add(var, EPS)))
            fd.add_output(fd.ops.add(fd.ops.mul(y, w), b))
        elif case == "rmsnorm":
            w = fd.define_tensor([cols], dtype)
            ms = fd.ops.mean(fd.ops.mul(x, x), [1], keepdim=True)
            fd.add_output(fd.ops.mul(fd.ops.mul(x, fd.ops.rsqrt(fd.ops.add(ms, EPS))), w))
        elif case == "softmax":
            m = fd.ops.max(x, [1], keepdim=True)
            e = fd.ops.exp(fd.ops.sub(x, m))
            fd.add_output(fd.ops.div(e, fd.ops.sum(e, [1], keepdim=True)))
        elif case == "layernorm_bwd":
            dy = fd.define_tensor([rows, cols], dtype)
            w = fd.define_tensor([cols], dtype)
            mean, rstd = fd.define_tensor([rows, 1], dtype), fd.define_tensor([rows, 1], dtype)
            xhat = fd.ops.mul(fd.ops.sub(x, mean), rstd)
            g = fd.ops.mul(dy, w)
            c1 = fd.ops.mean(g, [1], keepdim=True)
            c2 = fd.ops.mean(fd.ops.mul(g, xhat), [1], keepdim=True)
            dx = fd.ops.mul(rstd, fd.ops.sub(fd.ops.sub(g, c1), fd.ops.mul(xhat, c2)))
            fd.add_output(dx)
            fd.add_output(fd.ops.sum(fd.ops.mul(dy, xhat), [0]))  # dgamma
            fd.add_output(fd.ops.sum(dy, [0]))  # dbeta
        else:
            raise ValueError(f"unknown case {case}")
    return fd


def inputs(case, rows, cols, rng):
    """float32 inputs of a case (numpy)."""
    x = rng.standard_normal((rows, cols), dtype=np.float32)
    w = rng.uniform(0.5, 1.5, cols).astype(np.float32)
    if case == "layernorm":
        return [x, w, rng.standard_normal(cols, dtype=np.float32)]
    if case == "rmsnorm":
        return [x, w]
    if case == "softmax":
        return [x]
    mean = x.mean(1, keepdims=True)
    rstd = (1 / np.sqrt(x.var(1, keepdims=True) + EPS)).astype(np.float32)
    return [x, rng.standard_normal((rows, cols), dtype=np.float32), w, mean, rstd]


def numpy_impl(case, xp=np):
    """The usual multi-pass formulas (numpy; xp=jax.numpy gives the JAX versions)."""
    if case == "layernorm":
        def f(x, w, b):
            mean = x.mean(1, keepdims=True)
            var = ((x - mean) ** 2).mean(1, keepdims=True)
            return (x - mean) / xp.sqrt(var + EPS) * w + b
    elif case == "rmsnorm":
        def f(x, w):
            return x / xp.sqrt((x * x).mean(1, keepdims=True) + EPS) * w
    elif case == "softmax":
        def f(x):
            e = xp.exp(x - x.max(1, keepdims=True))
            return e / e.sum(1, keepdims=True)
    else:
        def f(x, dy, w, mean, rstd):
            xhat = (x - mean) * rstd
            g = dy * w
            dx = rstd * (g - g.mean(1, keepdims=True) - xhat * (g * xhat).mean(1, keepdims=True))
            return dx, (dy * xhat).sum(0), dy.sum(0)
    return f


def reference(case, arrays):
    """float64 results of a case."""
    out = numpy_impl(case)(*[a.astype(np.float64) for a in arrays])
    return list(out) if isinstance(out, tuple) else [out]


def min_bytes(case, rows, cols, itemsize=4):
    """What one run must read and write at least (the row-sized inputs and outputs)."""
    n = rows * cols * itemsize
    return 3 * n if case == "layernorm_bwd" else 2 * n


def best_of(fn, repeat):
    return best_time(fn, repeat=repeat)


def check(case, got, arrays, tol):
    for g, r in zip(got, reference(case, arrays)):
        err = np.max(np.abs(np.asarray(g, dtype=np.float64) - r)) / max(1.0, np.max(np.abs(r)))
        if err > tol:
            raise AssertionError(f"{case}: relative error {err:.2e} > {tol:.0e}")


# ---- CPU ----------------------------------------------------------------------------------------
def bench_cpu(args):
    os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")
    try:
        import jax
        import jax.numpy as jnp
        jax.config.update("jax_platform_name", "cpu")
    except ImportError:
        jax = None
        print("jax is not installed: its rows are left out (scripts/setup --bench installs it)", file=sys.stderr)
    rng = np.random.default_rng(0)
    rows, cols = args.rows, args.cols
    results = []
    x = rng.standard_normal((rows, cols), dtype=np.float32)
    y = np.empty_like(x)
    results.append(("copy", "numpy copyto", best_of(lambda: np.copyto(y, x), args.repeat), 2 * x.nbytes))
    for case in args.cases:
        arrays = inputs(case, rows, cols, rng)
        nbytes = min_bytes(case, rows, cols)
        fd = define(case, rows, cols)
        check(case, fd.execute(arrays), arrays, 1e-4)
        segments = [line for line in fd.host_ir().splitlines() if "LaunchSegment" in line]
        assert len(segments) == 1 and "normalization" in segments[0], fd.host_ir()
        results.append((case, "meshfuse", best_of(lambda: fd.execute(arrays), args.repeat), nbytes))
        f = numpy_impl(case)
        check(case, f(*arrays) if case == "layernorm_bwd" else [f(*arrays)], arrays, 1e-4)
        results.append((case, "numpy", best_of(lambda: f(*arrays), args.repeat), nbytes))
        if jax is not None:
            jf = jax.jit(numpy_impl(case, jnp))
            jarrays = [jax.device_put(a) for a in arrays]

            def run():
                return jax.block_until_ready(jf(*jarrays))
            got = run()
            check(case, got if case == "layernorm_bwd" else [got], arrays, 1e-4)
            results.append((case, "jax jit", best_of(run, args.repeat), nbytes))
    return results


DEVICES = {"cpu": bench_cpu}


def print_table(results, header):
    copy_s = next(s for c, _, s, _ in results if c == "copy")
    by_case = {(c, i): s for c, i, s, _ in results}
    print(header)
    print(f"| case | implementation | ms | GB/s | x copy | meshfuse speed-up |")
    print("|---|---|---:|---:|---:|---|")
    for case, impl, s, nbytes in results:
        speedup = ""
        if impl == "meshfuse":
            peers = [(p, by_case[(case, p)]) for p in ("numpy", "jax jit") if (case, p) in by_case]
            speedup = ", ".join(f"{t / s:.2f}x {p}" for p, t in peers)
        print(f"| {case} | {impl} | {s * 1e3:.1f} | {nbytes / s / 1e9:.1f} | {s / copy_s:.2f} | {speedup} |")


def main():
    argv = sys.argv[1:]
    if "--device=cuda" in argv or any(a == "--device" and b == "cuda" for a, b in zip(argv, argv[1:])):
        # the GPU table: benchmarks/norms_cuda.py (--device cuda and --device=cuda alike)
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import norms_cuda
        return norms_cuda.main(argv)
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu", choices=sorted(DEVICES))
    p.add_argument("--rows", type=positive_int, default=4096)
    p.add_argument("--cols", type=positive_int, default=4096)
    p.add_argument("--repeat", type=positive_int, default=10)
    p.add_argument("--cases", nargs="+", default=list(CASES), choices=CASES)
    args = p.parse_args()
    results = DEVICES[args.device](args)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print_table(results, f"{args.device}: [{args.rows}, {args.cols}] fp32, OMP_NUM_THREADS="
                f"{os.environ.get('OMP_NUM_THREADS', 'unset')}, best of {args.repeat}, load average {load:.1f}")


if __name__ == "__main__":
    main()
