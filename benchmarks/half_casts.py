"""Half and BFloat16 on the CPU: casts to and from float32, a chain of Half pointwise ops and Half
LayerNorm / softmax, each checked against numpy, then timed (best of --repeat runs of --calls calls).
The conversions between 16-bit floats and float32 dominate these, so this is what their
vectorization (runtime/cpu/half_runs.h) is measured by.

    OMP_NUM_THREADS=1 taskset -c 1 .venv/bin/python benchmarks/half_casts.py

meshfuse is imported from the Python path (PYTHONPATH=<checkout>/python to compare two builds).

Columns: ms, and GB/s (bytes read and written at least, over time). numpy has no bfloat16, so the
BFloat16 cast's output stays a meshfuse tensor (it is checked through a float32 round trip).
"""
import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from meshfuse import DataType, FusionDefinition  # noqa: E402
from norms import define as define_norm  # noqa: E402
from timing import best_time, positive_int  # noqa: E402

MB = 1 << 20


def cast_fusion(n, src, dst, back=None):
    """x (n elements of src) cast to dst, and back to `back` in the same fusion when given."""
    with FusionDefinition() as fd:
        y = fd.ops.cast(fd.define_tensor([n], src), dst)
        fd.add_output(fd.ops.cast(y, back) if back is not None else y)
    return fd


def chain_fusion(n, ops=8):
    """`ops` Half pointwise ops in one segment, Half in and out."""
    with FusionDefinition() as fd:
        x = fd.define_tensor([n], DataType.Half)
        y = x
        for k in range(ops):
            y = [lambda v: fd.ops.mul(v, 1.0009765625), lambda v: fd.ops.add(v, 0.25), fd.ops.abs,
                 lambda v: fd.ops.sub(v, 0.125)][k % 4](y)
        fd.add_output(y)
    return fd


def chain_numpy(x, ops=8):
    """chain_fusion in float32 (meshfuse keeps float32 between fused Half ops), rounded to Half once."""
    y = x.astype(np.float32)
    for k in range(ops):
        y = [lambda v: v * np.float32(1.0009765625), lambda v: v + np.float32(0.25), np.abs,
             lambda v: v - np.float32(0.125)][k % 4](y)
    return y.astype(np.float16)


def bf16_round_trip(x):
    """x (float32) rounded to bfloat16 (nearest even) and back, with numpy integer operations."""
    bits = x.view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16 << 16).astype(np.uint32)
    return np.where(np.isnan(x), x, rounded.view(np.float32))


def raw_runner(fd, inputs):
    """A call of fd's executor that keeps its outputs as meshfuse tensors (a BFloat16 output cannot
    become a numpy array, and execute() refuses it up front)."""
    plan, _ = fd._fast_plan()
    fd._plan = (plan, False)  # no BFloat16 output to refuse: it is never exported here
    cache = fd._executor_cache()
    args, _ = fd._arguments(inputs)
    return lambda: cache.execute(args, fd._params)


def special_values(rng, n):
    """float32 values across Half's range: normals, subnormals, overflow, ties, signed zeros, inf, NaN."""
    x = (rng.standard_normal(n) * np.exp2(rng.integers(-26, 17, n))).astype(np.float32)
    x[:8] = [0.0, -0.0, np.inf, -np.inf, np.nan, 65520.0, 2.0 ** -25, 1 + 2.0 ** -11]
    return x


def check(name, got, want, rtol=0.0, atol=0.0):
    if rtol == 0 and atol == 0:
        np.testing.assert_array_equal(got, want, err_msg=name)
    else:
        np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=rtol, atol=atol, err_msg=name)


def cases(rng, sizes):
    """(name, fusion runner, bytes moved) of each case, its result checked against numpy first: the
    casts at each of `sizes` (MB of float32), the rest at the first."""
    for mb in sizes:
        n = int(mb * MB) // 4
        x32 = special_values(rng, n)
        fd = cast_fusion(n, DataType.Float, DataType.Half)
        check("f32->f16", fd.execute([x32])[0], x32.astype(np.float16))
        yield f"cast f32->f16, {mb} MB f32", (lambda fd=fd, x=x32: fd.execute([x])), n * 6
        x16 = x32.astype(np.float16)
        fd = cast_fusion(n, DataType.Half, DataType.Float)
        check("f16->f32", fd.execute([x16])[0], x16.astype(np.float32))
        yield f"cast f16->f32, {mb} MB f32", (lambda fd=fd, x=x16: fd.execute([x])), n * 6
        fd = cast_fusion(n, DataType.Float, DataType.BFloat16)
        yield f"cast f32->bf16, {mb} MB f32", raw_runner(fd, [x32]), n * 6
    mb = sizes[0]
    n = int(mb * MB) // 4
    x32 = special_values(rng, n)
    fd = cast_fusion(n, DataType.Float, DataType.BFloat16, back=DataType.Float)
    check("f32->bf16->f32", fd.execute([x32])[0], bf16_round_trip(x32))
    yield f"cast f32->bf16->f32, {mb} MB f32", (lambda: fd.execute([x32])), n * 8
    n = int(mb * MB) // 2
    x16 = rng.standard_normal(n).astype(np.float16)
    chain = chain_fusion(n)
    # Within an ulp of Half: the compiled kernel may contract a multiply and an add into one FMA.
    check("8 Half ops", chain.execute([x16])[0], chain_numpy(x16), rtol=1e-3, atol=2.0 ** -24)
    yield f"8 Half pointwise ops, {mb} MB f16", (lambda: chain.execute([x16])), n * 4
    cols = 4096
    rows = max(1, int(mb * MB) // (2 * cols))  # mb MB of Half
    x = rng.standard_normal((rows, cols)).astype(np.float16)
    w, b = rng.uniform(0.5, 1.5, cols).astype(np.float16), rng.standard_normal(cols).astype(np.float16)
    ln = define_norm("layernorm", rows, cols, DataType.Half)
    xd = x.astype(np.float64)
    want = (xd - xd.mean(1, keepdims=True)) / np.sqrt(xd.var(1, keepdims=True) + 1e-5) * w + b
    check("Half layernorm", ln.execute([x, w, b])[0], want, rtol=2e-3, atol=4e-3)
    yield f"Half layernorm [{rows}, {cols}]", (lambda: ln.execute([x, w, b])), x.nbytes * 2
    sm = define_norm("softmax", rows, cols, DataType.Half)
    e = np.exp(xd - xd.max(1, keepdims=True))
    check("Half softmax", sm.execute([x])[0], e / e.sum(1, keepdims=True), rtol=2e-3, atol=1e-6)
    yield f"Half softmax [{rows}, {cols}]", (lambda: sm.execute([x])), x.nbytes * 2


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, nargs="+", default=[16, 64], help="sizes of the casts, MB of float32")
    ap.add_argument("--calls", type=positive_int, default=3)
    ap.add_argument("--repeat", type=positive_int, default=7)
    args = ap.parse_args()
    np.seterr(over="ignore")  # numpy's reference casts overflow to inf on purpose (65520 and up)
    rng = np.random.default_rng(0)
    print(f"{'case':<34}{'ms':>9}{'GB/s':>8}")
    for name, fn, nbytes in cases(rng, args.mb):
        t = best_time(fn, args.calls, args.repeat)
        print(f"{name:<34}{t * 1e3:>9.2f}{nbytes / t / 1e9:>8.1f}", flush=True)


if __name__ == "__main__":
    main()
