"""Per-execute host overhead of a tiny cached fusion (one process), against numpy doing the same
op (or, with --device cuda, torch eager on torch.cuda tensors), and against the first (lowering)
execute. On CUDA nothing synchronizes inside the loop: both sides only queue a kernel.

    .venv/bin/python benchmarks/host_overhead.py [--iters 20000] [--device cuda]
    .venv/bin/python benchmarks/host_overhead.py --transformer [--iters 2000]

--transformer: the host side of the transformer layer's backward fusion instead (27 inputs: weights,
activations, two bool dropout masks, the attention's 0-dim seed and offset), at a tiny size (b=1,
s=8, e=64, 2 heads) where its kernels take little: a cached execute and, of it, the inputs'
checks and DLPack imports.
"""
import argparse
import time

import numpy as np

from meshfuse import DataType, FusionDefinition, _arrays
from timing import best_time


def best_of(fn, iters):
    return best_time(fn, calls=iters, repeat=5, warmup=False)


def transformer_backward(iters):
    from meshfuse.models import FORWARD_OUTPUTS, PARAMETERS, TransformerBackward, TransformerConfig
    from meshfuse.models import TransformerForward

    cfg = TransformerConfig(batch=1, sequence=8, heads=2, hidden=64, dtype=DataType.Float, dropout_p=0.1)
    rng = np.random.default_rng(0)
    params = {n: (rng.standard_normal(s) * 0.1).astype(np.float32) for n, s in cfg.parameter_shapes().items()}
    x = rng.standard_normal((cfg.batch, cfg.sequence, cfg.hidden)).astype(np.float32)
    outs = dict(zip(FORWARD_OUTPUTS, TransformerForward(cfg).execute([x] + [params[n] for n in PARAMETERS])))
    bwd = TransformerBackward(cfg)
    arrays = dict(outs, x=x, grad_out=x, **params)
    inputs = [arrays[n] for n in bwd.input_names()]
    bwd.execute(inputs)
    print("| what | us per call |")
    print("|---|---|")
    print(f"| cached execute of the layer's backward ({len(inputs)} inputs, b=1 s=8 e=64) | "
          f"{best_of(lambda: bwd.execute(inputs), iters) * 1e6:.1f} |")
    print(f"|   of which: inputs checked and imported | {best_of(lambda: bwd._arguments(inputs), iters) * 1e6:.1f} |")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--iters", type=int, default=20000)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--transformer", action="store_true", help="the transformer backward's host side instead")
    args = parser.parse_args()
    if args.transformer:
        transformer_backward(args.iters)
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
    if args.device == "cuda":
        torch.cuda.synchronize()
        expected = (a + b).cpu().numpy()
        got = fd.execute([a, b])[0]
        got = got.cpu().numpy() if hasattr(got, "cpu") else np.asarray(got)
        assert np.allclose(got, expected), (got, expected)
    # Where the time of one cached execute goes (the same calls execute() makes, one at a time).
    cpp_args, torch_out = fd._arguments([a, b])
    parts = {
        "  of which: inputs checked and imported (DLPack)": best_of(lambda: fd._arguments([a, b]), args.iters),
        "  of which: C++ FusionExecutorCache.execute": best_of(lambda: fd._cache.execute(cpp_args, fd._params), args.iters),
    }
    results = fd._cache.execute(cpp_args, fd._params)
    convert = _arrays.to_torch if torch_out else _arrays.to_numpy
    parts["  of which: output exported (DLPack)"] = best_of(lambda: convert(results[0]), args.iters)
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
