"""Fused attention benchmark (issue 13).

  python3 benchmarks/attention.py --gpu   # H200: bf16 d=128 fwd/bwd TFLOP/s, meshfuse (cuDNN) vs torch SDPA backends
  python3 benchmarks/attention.py --gpu --dropout 0 0.1 0.2 --shapes 1,96,2048   # with attention dropout
  python3 benchmarks/attention.py --gpu --dropout 0.1 --shapes 1,96,2048 --mask-widths narrow exact   # mask widths
  python3 benchmarks/attention.py --gpu --dropout 0.1 --shapes 1,96,2048 --rngs meshfuse cudnn   # who draws the mask
  python3 benchmarks/attention.py --cpu   # one thread, s=2048: meshfuse's flash kernel vs numpy matmul-softmax-matmul

FLOPs: forward 4*b*h*s*s*d (halved when causal), backward 2.5x the forward (five products against two).
Run the CPU part with OPENBLAS_CORETYPE/OPENBLAS_L2_SIZE unset for that command (BENCHMARKS.md, top)."""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "python"))
from timing import best_time, cuda_event_ms, kernel_profile, positive_int, scoped_env  # noqa: E402 (this directory, first on the path of a script run)


def flops(b, h, s, d, causal, backward=False):
    f = 4.0 * b * h * s * s * d * (0.5 if causal else 1.0)
    return f * (2.5 if backward else 1.0)


def gpu(args):
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from meshfuse import DataType, FusionDefinition

    def timed(fn, iters):  # seconds
        return cuda_event_ms(fn, iters) / 1e3

    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, cudnn {torch.backends.cudnn.version()}")
    # With dropout, cuDNN draws the mask in-kernel on both sides (by default: runtime/cuda/attention_rng.h;
    # --rngs meshfuse also times meshfuse's Philox mask, the CPU's, handed to cuDNN: dropout_mask.h); the
    # two masks differ by design and the error column is left out.
    # torch's forward is timed twice: on inputs that need no gradient (its inference kernels, which
    # skip the log-sum-exp) and on inputs that do (training: the kernel also writes the statistics
    # the backward reads, as meshfuse's sdpfa_fwd always does). "fwd train" is the like-for-like one.
    print(f"{'shape (b,h,s)':>16} {'causal':>6} {'dropout':>7} {'impl':>10} {'fwd TF/s':>9} {'bwd TF/s':>9} "
          f"{'fwd train':>9} {'max|err| vs torch':>18}")
    d = 128
    for (b, h, s), causal, p in ((shape, causal, p) for shape in args.shapes for causal in (False, True)
                                 for p in args.dropout):
        q, k, v, go = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
        with FusionDefinition() as fwd:
            tq, tk, tv = (fwd.define_tensor([b, h, s, d], dtype=DataType.BFloat16) for _ in range(3))
            o, lse, seed, off = fwd.ops.sdpfa_fwd(tq, tk, tv, dropout_p=p, is_causal=causal)
            for t in (o, lse, seed, off):
                fwd.add_output(t)
        out, lse_v, seed_v, off_v = fwd.execute([q, k, v])
        with FusionDefinition() as bwd:
            tg, tq, tk, tv, to = (bwd.define_tensor([b, h, s, d], dtype=DataType.BFloat16) for _ in range(5))
            tl = bwd.define_tensor([b, h, s], dtype=DataType.Float)
            ts, tf = bwd.define_tensor([], dtype=DataType.Int), bwd.define_tensor([], dtype=DataType.Int)
            for g in bwd.ops.sdpfa_bwd(tg, tq, tk, tv, to, tl, p, causal, ts, tf):
                bwd.add_output(g)
        bargs = [go, q, k, v, out, lse_v, seed_v, off_v]
        ref = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        err = f"{(out.float() - ref.float()).abs().max().item():18.4f}" if p == 0 else ""
        # With dropout, one row per mask width (MESHFUSE_ATTENTION_MASK) and attention RNG
        # (MESHFUSE_ATTENTION_RNG) asked for, both read at each execute: compared in one process, on
        # the same inputs.
        variants = ([("MESHFUSE_ATTENTION_MASK", w) for w in args.mask_widths or []] +
                    [("MESHFUSE_ATTENTION_RNG", r) for r in args.rngs or []])
        for env_name, value in (variants or [(None, None)]) if p > 0 else [(None, None)]:
            with scoped_env(env_name or "MESHFUSE_ATTENTION_MASK", value):
                t_f = timed(lambda: fwd.execute([q, k, v]), args.iters)
                t_b = timed(lambda: bwd.execute(bargs), args.iters)
            name = "meshfuse" if value is None else f"mf {value}"
            print(f"{str((b, h, s)):>16} {str(causal):>6} {p:>7} {name:>10} "
                  f"{flops(b, h, s, d, causal) / t_f / 1e12:9.0f} {flops(b, h, s, d, causal, True) / t_b / 1e12:9.0f} "
                  f"{flops(b, h, s, d, causal) / t_f / 1e12:9.0f} {err}", flush=True)
        for name, backend in (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION),
                              ("efficient", SDPBackend.EFFICIENT_ATTENTION)):
            try:
                with sdpa_kernel([backend]):
                    qq, kk, vv = (x.detach().requires_grad_() for x in (q, k, v))
                    t_f = timed(lambda: F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=causal),
                                args.iters)
                    o2 = F.scaled_dot_product_attention(qq, kk, vv, dropout_p=p, is_causal=causal)
                    t_b = timed(lambda: torch.autograd.grad(o2, (qq, kk, vv), go, retain_graph=True), args.iters)
                    t_t = timed(lambda: F.scaled_dot_product_attention(qq, kk, vv, dropout_p=p, is_causal=causal),
                                args.iters)
                print(f"{'':>16} {'':>6} {'':>7} {name:>10} {flops(b, h, s, d, causal) / t_f / 1e12:9.0f} "
                      f"{flops(b, h, s, d, causal, True) / t_b / 1e12:9.0f} "
                      f"{flops(b, h, s, d, causal) / t_t / 1e12:9.0f}", flush=True)
            except RuntimeError as e:
                print(f"{'':>16} {'':>6} {'':>7} {name:>10} unavailable: {str(e).splitlines()[0][:60]}")
        if args.profile:  # one call each under torch.profiler: where meshfuse's time goes against cuDNN's
            sync = torch.cuda.synchronize
            kernel_profile("mf fwd", lambda: fwd.execute([q, k, v]), sync)
            kernel_profile("mf bwd", lambda: bwd.execute(bargs), sync)
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                qq, kk, vv = (x.detach().requires_grad_() for x in (q, k, v))
                kernel_profile("cudnn fwd", lambda: F.scaled_dot_product_attention(qq, kk, vv, dropout_p=p,
                                                                                   is_causal=causal), sync)
        del q, k, v, go, out, lse_v
        torch.cuda.empty_cache()


def cpu(args):
    import numpy as np
    from meshfuse import FusionDefinition

    b, h, s, d = 1, 4, 2048, 64
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal([b, h, s, d]).astype(np.float32) for _ in range(3))

    def numpy_attention(q, k, v, causal):
        sc = (q @ np.swapaxes(k, -1, -2)) * np.float32(1 / np.sqrt(d))
        if causal:
            sc = np.where(np.tri(s, dtype=bool), sc, np.float32(-np.inf))
        sc = np.exp(sc - sc.max(-1, keepdims=True))
        sc /= sc.sum(-1, keepdims=True)
        return sc @ v

    def best(fn, reps):
        return best_time(fn, repeat=reps, warmup=False)

    print(f"CPU one thread, b={b} h={h} s={s} d={d} fp32")
    for causal in (False, True):
        with FusionDefinition() as fd:
            tq, tk, tv = (fd.define_tensor([b, h, s, d]) for _ in range(3))
            o, _, _, _ = fd.ops.sdpfa_fwd(tq, tk, tv, is_causal=causal)
            fd.add_output(o)
        (mine,) = fd.execute([q, k, v])
        ref = numpy_attention(q, k, v, causal)
        t_mf = best(lambda: fd.execute([q, k, v]), args.reps)
        t_np = best(lambda: numpy_attention(q, k, v, causal), args.reps)
        print(f"causal={causal!s:5}: meshfuse {t_mf * 1e3:7.1f} ms ({flops(b, h, s, d, causal) / t_mf / 1e9:5.1f} GFLOP/s)"
              f"  numpy {t_np * 1e3:7.1f} ms  speedup {t_np / t_mf:4.2f}x  max|diff| {np.abs(mine - ref).max():.2e}")


def cpu_dropout(args):
    """What dropout costs the CPU kernels at the TP transformer's per-rank attention (b=1, 8 heads,
    s=512, d=64, causal): sdpfa_fwd and sdpfa_bwd at dropout 0 and 0.1, and fd.ops.uniform over as
    many elements as the [8, 512, 512] mask (Philox draws alone)."""
    import numpy as np
    from meshfuse import DataType, FusionDefinition

    b, h, s, d = 1, 8, 512, 64
    rng = np.random.default_rng(0)
    q, k, v, go = (rng.standard_normal([b, h, s, d]).astype(np.float32) for _ in range(4))

    def best(fn):
        return best_time(fn, repeat=args.reps) * 1e3

    print(f"CPU one thread, dropout cost at b={b} h={h} s={s} d={d} causal fp32")
    for p in (0.0, 0.1):
        with FusionDefinition() as fwd:
            ins = [fwd.define_tensor([b, h, s, d]) for _ in range(3)]
            for t in fwd.ops.sdpfa_fwd(*ins, dropout_p=p, is_causal=True):
                fwd.add_output(t)
        out, lse, seed, offset = fwd.execute([q, k, v])
        with FusionDefinition() as bwd:
            t = [bwd.define_tensor([b, h, s, d]) for _ in range(5)]
            lse_t = bwd.define_tensor([b, h, s])
            seed_t, offset_t = (bwd.define_tensor([], dtype=DataType.Int) for _ in range(2))
            for g in bwd.ops.sdpfa_bwd(t[3], t[0], t[1], t[2], t[4], lse_t, p, True, seed_t, offset_t):
                bwd.add_output(g)
        bwd_args = [q, k, v, go, np.asarray(out), np.asarray(lse), np.asarray(seed), np.asarray(offset)]
        print(f"dropout {p}: sdpfa_fwd {best(lambda: fwd.execute([q, k, v])):6.1f} ms  "
              f"sdpfa_bwd {best(lambda: bwd.execute(bwd_args)):6.1f} ms")
    with FusionDefinition() as fd:
        seed_s, offset_s = fd.define_scalar(dtype=DataType.Int), fd.define_scalar(dtype=DataType.Int)
        fd.add_output(fd.ops.uniform(0.0, 1.0, [h, s, s], DataType.Float, rng_seed=seed_s, rng_offset=offset_s))
    ms = best(lambda: fd.execute([1, 2]))
    print(f"uniform over {h * s * s} elements: {ms:.1f} ms ({ms * 1e6 / (h * s * s):.1f} ns an element)")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpu", action="store_true")
    ap.add_argument("--cpu", action="store_true")
    ap.add_argument("--iters", type=positive_int, default=20)
    ap.add_argument("--reps", type=positive_int, default=5)
    ap.add_argument("--cpu-dropout", action="store_true", help="CPU: what dropout costs the attention kernels")
    ap.add_argument("--dropout", type=float, nargs="+", default=[0.0], help="GPU: attention dropout probabilities")
    ap.add_argument("--profile", action="store_true",
                    help="GPU: a kernel profile of one meshfuse and one torch cuDNN call per row (torch.profiler)")
    ap.add_argument("--mask-widths", nargs="+", default=None, choices=["narrow", "exact"],
                    help="GPU, with dropout: time meshfuse under each MESHFUSE_ATTENTION_MASK width")
    ap.add_argument("--rngs", nargs="+", default=None, choices=["meshfuse", "cudnn"],
                    help="GPU, with dropout: time meshfuse under each MESHFUSE_ATTENTION_RNG (cudnn, the default: "
                         "cuDNN's in-kernel dropout, a mask the CPU cannot draw; meshfuse: the CPU's Philox mask)")
    ap.add_argument("--shapes", nargs="+", default=["1,96,2048", "4,32,4096", "1,32,8192"],
                    help="GPU: b,h,s triples (d = 128)")
    a = ap.parse_args()
    if not (a.cpu or a.cpu_dropout or a.gpu):  # it printed nothing and exited 0
        ap.error("say what to run: --cpu, --cpu-dropout and/or --gpu")
    a.shapes = [tuple(int(x) for x in t.split(",")) for t in a.shapes]
    if a.cpu or a.cpu_dropout:
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    if a.cpu:
        cpu(a)
    if a.cpu_dropout:
        cpu_dropout(a)
    if a.gpu:
        gpu(a)
