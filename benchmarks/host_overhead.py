"""Per-execute host overhead of a tiny cached fusion (one process), against numpy doing the same
op (or, with --device cuda, torch eager on torch.cuda tensors), and against the first (lowering)
execute. On CUDA nothing synchronizes inside the loop: both sides only queue a kernel.

    .venv/bin/python benchmarks/host_overhead.py [--iters 20000] [--device cuda]
    .venv/bin/python benchmarks/host_overhead.py --transformer [--iters 2000] [--device cuda]

--transformer: the host side of the transformer layer's forward and backward fusions instead (the
backward's 28 inputs: weights, activations, two bool dropout masks, the attention's 0-dim seed and
offset), at a tiny size (b=1, s=8, e=64, 2 heads) where its kernels take little: a cached execute
and, of it, the inputs' checks and DLPack imports, the C++ execute and the host program within it,
and the outputs' exports (bf16 torch tensors on CUDA, float32 numpy arrays on the CPU).
"""
import argparse
import os
import tempfile
import time

import numpy as np

from meshfuse import DataType, FusionDefinition
from timing import best_time, host_trace_summary, positive_int


def best_of(fn, iters):
    return best_time(fn, calls=iters, repeat=5, warmup=False)


def transformer_passes(iters, device):
    """The layer's forward and backward at a tiny size, where their kernels take little: each cached
    execute and, of it, the inputs' checks and imports, the C++ execute (of which the host program:
    the segments' launches, from a host trace) and the outputs' exports. On CUDA nothing synchronizes
    in the loop, so the host's time is measured (its queue of kernels stays short at this size)."""
    from meshfuse.models import FORWARD_OUTPUTS, PARAMETERS, TransformerBackward, TransformerConfig
    from meshfuse.models import TransformerForward

    dtype = DataType.BFloat16 if device == "cuda" else DataType.Float
    cfg = TransformerConfig(batch=1, sequence=8, heads=2, hidden=64, dtype=dtype, dropout_p=0.1)
    rng = np.random.default_rng(0)
    params = {n: (rng.standard_normal(s) * 0.1).astype(np.float32) for n, s in cfg.parameter_shapes().items()}
    x = rng.standard_normal((cfg.batch, cfg.sequence, cfg.hidden)).astype(np.float32)
    if device == "cuda":
        import torch

        params = {n: torch.from_numpy(a).to("cuda", torch.bfloat16) for n, a in params.items()}
        x = torch.from_numpy(x).to("cuda", torch.bfloat16)
    fwd = TransformerForward(cfg)
    fwd_inputs = [x] + [params[n] for n in PARAMETERS]
    outs = dict(zip(FORWARD_OUTPUTS, fwd.execute(fwd_inputs)))
    bwd = TransformerBackward(cfg)
    arrays = dict(outs, x=x, grad_out=x, **params)
    bwd_inputs = [arrays[n] for n in bwd.input_names()]
    grads = bwd.execute(bwd_inputs)
    # The passes computed something (their values are the transformer tests' business): whole and finite.
    for name, value in list(zip(FORWARD_OUTPUTS, outs.values())) + [("grad", g) for g in grads]:
        value = value.float().cpu().numpy() if hasattr(value, "cpu") else np.asarray(value)
        if value.dtype.kind == "f" and not np.isfinite(value).all():
            raise SystemExit(f"host_overhead --transformer: {name} is not finite")
    if tuple(outs["out"].shape) != (cfg.batch, cfg.sequence, cfg.hidden):
        raise SystemExit(f"host_overhead --transformer: out has shape {tuple(outs['out'].shape)}")
    print(f"| {device}, b=1 s=8 e=64, us per call | forward ({len(fwd_inputs)} inputs) | backward "
          f"({len(bwd_inputs)} inputs) |")
    print("|---|---|---|")
    rows = {}
    for fd, inputs in ((fwd, fwd_inputs), (bwd, bwd_inputs)):
        cpp_args, torch_out = fd._arguments(inputs)
        results = fd._cache.execute(cpp_args, fd._params)
        parts = {
            "cached execute": lambda: fd.execute(inputs),
            "  of which: inputs checked and imported": lambda: fd._arguments(inputs),
            "  of which: C++ FusionExecutorCache.execute": lambda: fd._cache.execute(cpp_args, fd._params),
            "  of which: outputs exported": lambda: fd._exported(results, torch_out),
        }
        for what, fn in parts.items():
            rows.setdefault(what, []).append(best_of(fn, iters) * 1e6)
        with tempfile.TemporaryDirectory() as tmp:
            trace = os.path.join(tmp, "host.json")
            best = None
            for _ in range(5):  # the fastest of five traced calls
                fd.execute(inputs, trace=trace, trace_host=True)
                us = host_trace_summary(trace)[0] * 1e3
                best = us if best is None else min(best, us)
        # (Traced: each span adds its own cost, so this can exceed the untraced C++ execute above.)
        rows.setdefault("the host program alone, traced (trace_host=True)", []).append(best)
    for what, (fwd_us, bwd_us) in rows.items():
        print(f"| {what} | {fwd_us:.1f} | {bwd_us:.1f} |")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--iters", type=positive_int, default=20000)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--transformer", action="store_true", help="the transformer backward's host side instead")
    args = parser.parse_args()
    if args.transformer:
        transformer_passes(args.iters, args.device)
        return
    if args.device == "cuda":
        import torch

        a, b = torch.rand(8, device="cuda"), torch.rand(8, device="cuda")
        peer_name, peer = "torch.add (eager, cuda)", lambda: torch.add(a, b)
    else:
        a = np.random.rand(8).astype(np.float32)
        b = np.random.rand(8).astype(np.float32)
        peer_name, peer = "numpy.add", lambda: np.add(a, b)
    with FusionDefinition() as fd:
        x = fd.define_tensor(shape=[8], dtype=DataType.Float)
        y = fd.define_tensor(shape=[8], dtype=DataType.Float)
        fd.add_output(fd.ops.add(x, y))
    t0 = time.perf_counter()
    fd.execute([a, b])
    first = time.perf_counter() - t0
    cached = best_of(lambda: fd.execute([a, b]), args.iters)
    baseline = best_of(peer, args.iters)
    # What was timed computes the sum (on either device), before any number is printed.
    if args.device == "cuda":
        torch.cuda.synchronize()
    expected = np.asarray((a + b).cpu()) if args.device == "cuda" else a + b
    got = fd.execute([a, b])[0]
    got = got.cpu().numpy() if hasattr(got, "cpu") else np.asarray(got)
    if not np.array_equal(got, expected):
        raise SystemExit(f"host_overhead: meshfuse's add differs from {peer_name}: {got} vs {expected}")
    # Where the time of one cached execute goes (the same calls execute() makes, one at a time).
    cpp_args, torch_out = fd._arguments([a, b])
    parts = {
        "  of which: inputs checked and imported (DLPack)": best_of(lambda: fd._arguments([a, b]), args.iters),
        "  of which: C++ FusionExecutorCache.execute": best_of(lambda: fd._cache.execute(cpp_args, fd._params), args.iters),
    }
    results = fd._cache.execute(cpp_args, fd._params)
    parts["  of which: output exported (DLPack)"] = best_of(lambda: fd._exported(results, torch_out), args.iters)
    print("| what | us per call |")
    print("|---|---|")
    print(f"| first execute (validate + lower + run) | {first * 1e6:.1f} |")
    print(f"| cached execute of add([8], [8]) on {args.device} | {cached * 1e6:.2f} |")
    for what, seconds in parts.items():
        print(f"| {what} | {seconds * 1e6:.2f} |")
    print(f"| {peer_name} on the same arrays | {baseline * 1e6:.2f} |")
    print(f"| meshfuse / {peer_name.split()[0]} | {cached / baseline:.1f}x |")


if __name__ == "__main__":
    main()
