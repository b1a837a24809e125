"""Normalization kernels (issue 12): LayerNorm forward, RMSNorm forward, softmax forward and the
LayerNorm backward (dx, dgamma, dbeta), each written as a meshfuse FusionDefinition from primitive
ops with fp32 compute (cast in, compute, cast back), which lowers to one normalization segment.

    python3 benchmarks/norms.py --device cuda [--shapes 8192x12288,32768x4096] [--iters 50]
    (benchmarks/norms.py --device cpu is the CPU table; norms.py --device cuda runs this file)

CUDA: bf16 on one GPU, against torch eager (F.layer_norm, F.rms_norm, torch.softmax and
aten.native_layer_norm_backward), torch.compile of the same fp32-compute functions, and the device
copy bandwidth (a bf16 tensor of the same size, bytes read plus written), in one table. Times are
medians over CUDA events; GB/s counts each input read once and each output written once.
"""
import argparse
import statistics
import sys

from meshfuse import DataType, FusionDefinition

EPS = 1e-5


# ---- the fusion definitions (shared by both modes) ----------------------------------------------


def define_layer_norm(rows, cols, dtype):
    with FusionDefinition() as fd:
        x = fd.define_tensor(shape=[rows, cols], dtype=dtype)
        w = fd.define_tensor(shape=[cols], dtype=dtype)
        b = fd.define_tensor(shape=[cols], dtype=dtype)
        xf = fd.ops.cast(x, DataType.Float)
        mean = fd.ops.mean(xf, [1])
        xc = fd.ops.sub(xf, fd.ops.broadcast_in_dim(mean, [rows, cols], [0]))
        var = fd.ops.mean(fd.ops.square(xc), [1])
        rstd = fd.ops.rsqrt(fd.ops.add(var, EPS))
        y = fd.ops.mul(xc, fd.ops.broadcast_in_dim(rstd, [rows, cols], [0]))
        y = fd.ops.add(fd.ops.mul(y, fd.ops.cast(w, DataType.Float)), fd.ops.cast(b, DataType.Float))
        fd.add_output(fd.ops.cast(y, dtype))
    return fd


def define_rms_norm(rows, cols, dtype):
    with FusionDefinition() as fd:
        x = fd.define_tensor(shape=[rows, cols], dtype=dtype)
        w = fd.define_tensor(shape=[cols], dtype=dtype)
        xf = fd.ops.cast(x, DataType.Float)
        rstd = fd.ops.rsqrt(fd.ops.add(fd.ops.mean(fd.ops.square(xf), [1]), EPS))
        y = fd.ops.mul(fd.ops.mul(xf, fd.ops.broadcast_in_dim(rstd, [rows, cols], [0])), fd.ops.cast(w, DataType.Float))
        fd.add_output(fd.ops.cast(y, dtype))
    return fd


def define_softmax(rows, cols, dtype):
    with FusionDefinition() as fd:
        x = fd.define_tensor(shape=[rows, cols], dtype=dtype)
        xf = fd.ops.cast(x, DataType.Float)
        m = fd.ops.broadcast_in_dim(fd.ops.max(xf, [1]), [rows, cols], [0])
        e = fd.ops.exp(fd.ops.sub(xf, m))
        s = fd.ops.broadcast_in_dim(fd.ops.sum(e, [1]), [rows, cols], [0])
        fd.add_output(fd.ops.cast(fd.ops.div(e, s), dtype))
    return fd


def define_layer_norm_backward(rows, cols, dtype):
    """Inputs dy, x, mean [rows] and rstd [rows] (fp32, saved by the forward), weight; outputs dx,
    dgamma, dbeta."""
    with FusionDefinition() as fd:
        dy = fd.ops.cast(fd.define_tensor(shape=[rows, cols], dtype=dtype), DataType.Float)
        x = fd.ops.cast(fd.define_tensor(shape=[rows, cols], dtype=dtype), DataType.Float)
        mean = fd.define_tensor(shape=[rows], dtype=DataType.Float)
        rstd = fd.define_tensor(shape=[rows], dtype=DataType.Float)
        w = fd.ops.cast(fd.define_tensor(shape=[cols], dtype=dtype), DataType.Float)
        per_row = lambda v: fd.ops.broadcast_in_dim(v, [rows, cols], [0])  # noqa: E731
        rstd_b = per_row(rstd)
        xhat = fd.ops.mul(fd.ops.sub(x, per_row(mean)), rstd_b)
        g = fd.ops.mul(dy, w)
        c1 = per_row(fd.ops.mean(fd.ops.mul(g, xhat), [1]))
        c2 = per_row(fd.ops.mean(g, [1]))
        dx = fd.ops.mul(fd.ops.sub(fd.ops.sub(g, c2), fd.ops.mul(xhat, c1)), rstd_b)
        fd.add_output(fd.ops.cast(dx, dtype))
        fd.add_output(fd.ops.cast(fd.ops.sum(fd.ops.mul(dy, xhat), [0]), dtype))
        fd.add_output(fd.ops.cast(fd.ops.sum(dy, [0]), dtype))
    return fd


# ---- CUDA mode -----------------------------------------------------------------------------------


def cuda_time_ms(fn, iters, warmup=5):
    """Median over `iters` of one call timed with CUDA events (each call enqueued back to back)."""
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    for s, e in zip(starts, ends):
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends))


def cuda_cases(rows, cols):
    """(name, meshfuse fd, inputs, eager fn, fp32-compute fn for torch.compile, bytes moved)."""
    import torch
    import torch.nn.functional as F

    bf16, dev = torch.bfloat16, "cuda"
    x = torch.randn(rows, cols, device=dev, dtype=bf16)
    w = torch.rand(cols, device=dev, dtype=bf16) + 0.5
    b = torch.randn(cols, device=dev, dtype=bf16)
    dy = torch.randn(rows, cols, device=dev, dtype=bf16)
    elem = rows * cols * 2

    def ln_fp32(x, w, b):
        xf = x.float()
        mean = xf.mean(-1, keepdim=True)
        xc = xf - mean
        rstd = torch.rsqrt((xc * xc).mean(-1, keepdim=True) + EPS)
        return (xc * rstd * w.float() + b.float()).to(x.dtype)

    def rms_fp32(x, w):
        xf = x.float()
        return (xf * torch.rsqrt((xf * xf).mean(-1, keepdim=True) + EPS) * w.float()).to(x.dtype)

    def softmax_fp32(x):
        return torch.softmax(x.float(), dim=-1).to(x.dtype)

    _, mean, rstd = torch.ops.aten.native_layer_norm(x, [cols], w, b, EPS)

    def ln_bwd_eager(dy, x, mean, rstd, w):
        return torch.ops.aten.native_layer_norm_backward(dy, x, [cols], mean, rstd, w, b, [True, True, True])

    def ln_bwd_fp32(dy, x, mean, rstd, w):
        dyf, xf, wf = dy.float(), x.float(), w.float()
        xhat = (xf - mean) * rstd
        g = dyf * wf
        c1 = (g * xhat).mean(-1, keepdim=True)
        c2 = g.mean(-1, keepdim=True)
        dx = (g - c2 - xhat * c1) * rstd
        return dx.to(x.dtype), (dyf * xhat).sum(0).to(x.dtype), dyf.sum(0).to(x.dtype)

    return [
        ("layer_norm fwd", define_layer_norm(rows, cols, DataType.BFloat16), [x, w, b],
         lambda: F.layer_norm(x, (cols,), w, b, EPS), (ln_fp32, (x, w, b)), 2 * elem),
        ("rms_norm fwd", define_rms_norm(rows, cols, DataType.BFloat16), [x, w],
         lambda: F.rms_norm(x, (cols,), w, EPS), (rms_fp32, (x, w)), 2 * elem),
        ("softmax fwd", define_softmax(rows, cols, DataType.BFloat16), [x],
         lambda: torch.softmax(x, dim=-1), (softmax_fp32, (x,)), 2 * elem),
        ("layer_norm bwd", define_layer_norm_backward(rows, cols, DataType.BFloat16),
         [dy, x, mean.view(rows), rstd.view(rows), w],
         lambda: ln_bwd_eager(dy, x, mean, rstd, w), (ln_bwd_fp32, (dy, x, mean, rstd, w)), 3 * elem),
    ]


def max_error(got, ref):
    import torch

    got = got if isinstance(got, (list, tuple)) else [got]
    ref = ref if isinstance(ref, (list, tuple)) else [ref]
    return max(float((g.float() - r.float()).abs().max() / (r.float().abs().max() + 1e-30)) for g, r in zip(got, ref))


def bench_cuda(args):
    import torch

    torch.manual_seed(0)
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    rows_out = []
    for shape in args.shapes.split(","):
        rows, cols = (int(v) for v in shape.split("x"))
        # Device copy bandwidth: a bf16 tensor of the same size, read + written.
        src = torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16)
        dst = torch.empty_like(src)
        copy_ms = cuda_time_ms(lambda: dst.copy_(src), args.iters)
        copy_gbs = 2 * src.numel() * 2 / copy_ms / 1e6
        rows_out.append((f"[{rows}, {cols}] device copy", copy_ms, copy_gbs, None, None, None, ""))
        for name, fd, inputs, eager, (fp32_fn, fp32_args), nbytes in cuda_cases(rows, cols):
            out = fd.execute(inputs)
            segments = str(fd.host_ir()).count("LaunchSegment")
            ref = fp32_fn(*fp32_args)
            err = max_error(out if len(out) > 1 else out[0], ref)
            mf_ms = cuda_time_ms(lambda: fd.execute(inputs), args.iters)
            gbs = nbytes / mf_ms / 1e6
            if args.meshfuse_only:  # A/B runs of the kernel's tuning knobs (MESHFUSE_NORM_*)
                rows_out.append((f"[{rows}, {cols}] {name}", mf_ms, gbs, gbs / copy_gbs, None, None,
                                 f"{segments} segment(s), rel err {err:.1e}"))
                continue
            eager_ms = cuda_time_ms(eager, args.iters)
            compiled = torch.compile(fp32_fn, dynamic=False)
            compiled(*fp32_args)
            tc_ms = cuda_time_ms(lambda: compiled(*fp32_args), args.iters)
            rows_out.append((f"[{rows}, {cols}] {name}", mf_ms, gbs, gbs / copy_gbs, eager_ms / mf_ms, tc_ms / mf_ms,
                             f"eager {eager_ms:.3f} ms, compile {tc_ms:.3f} ms, {segments} segment(s), rel err {err:.1e}"))
    print()
    print(f"{'case (bf16, fp32 compute)':42s} {'meshfuse ms':>11s} {'GB/s':>7s} {'of copy':>7s} {'x eager':>7s} "
          f"{'x compile':>9s}  notes")
    for label, ms, gbs, frac, xe, xc, note in rows_out:
        f = lambda v, w, fmt: (fmt % v).rjust(w) if v is not None else "".rjust(w)  # noqa: E731
        print(f"{label:42s} {ms:11.3f} {gbs:7.0f} {f(frac, 7, '%.2f')} {f(xe, 7, '%.2f')} {f(xc, 9, '%.2f')}  {note}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("cuda",), default="cuda")
    parser.add_argument("--shapes", default="8192x12288,32768x4096", help="CUDA: rows x cols, comma separated")
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--meshfuse-only", action="store_true",
                        help="time meshfuse and the copy only (no torch peers): for A/B runs of MESHFUSE_NORM_* knobs")
    bench_cuda(parser.parse_args(argv))


if __name__ == "__main__":
    main()
