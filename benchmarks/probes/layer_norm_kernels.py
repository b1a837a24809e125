"""Probe: the transformer layer's normalization kernels on CUDA, per launch.

Runs meshfuse's layer (forward, then backward) under torch.profiler and prints the median time of
each normalization kernel, in launch order, under whatever MESHFUSE_NORM_* settings the
environment has. Sessions 21-24 used it to decide where the normalization split pays
(MESHFUSE_NORM_AUTOTUNE; BENCHMARKS.md, "One H100, session 23" and "session 24"): run it once per
setting.

    MESHFUSE_NORM_AUTOTUNE=0 python3 benchmarks/probes/layer_norm_kernels.py   # never split
    python3 benchmarks/probes/layer_norm_kernels.py          # the default rule: streamed rows split
    MESHFUSE_NORM_AUTOTUNE=1 python3 benchmarks/probes/layer_norm_kernels.py   # each split timed
    python3 benchmarks/probes/layer_norm_kernels.py --sequence 256 --hidden 512 --heads 4 --repeat 3
"""
import argparse
import os
import sys

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir))  # benchmarks/transformer.py
import transformer as layer_benchmark  # noqa: E402 (it puts the checkout's python/ on the path)
from meshfuse import DataType  # noqa: E402
from meshfuse.models import transformer as tf  # noqa: E402


def layer_calls(cfg):
    """Two callables, the layer's forward and its backward on CUDA tensors, on random data (the
    inputs benchmarks/transformer.py times)."""
    fwd, bwd = tf.TransformerForward(cfg), tf.TransformerBackward(cfg)
    _, inputs, backward_inputs = layer_benchmark.cuda_layer_inputs(cfg, fwd, bwd, 0)
    return (lambda: fwd.execute(inputs)), (lambda: bwd.execute(backward_inputs))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sequence", type=int, default=2048, help="tokens (batch 1)")
    parser.add_argument("--hidden", type=int, default=12288)
    parser.add_argument("--heads", type=int, default=96)
    parser.add_argument("--repeat", type=int, default=5, help="profiled steps (the median of each kernel is printed)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("layer_norm_kernels.py needs torch with a CUDA GPU")
    cfg = tf.TransformerConfig(batch=1, sequence=args.sequence, heads=args.heads, hidden=args.hidden,
                               dtype=DataType.BFloat16, dropout_p=0.1)
    forward, backward = layer_calls(cfg)
    for _ in range(3):  # the first calls tune (cuBLASLt algorithms, the normalization split) and compile
        forward()
        backward()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(args.repeat):
            forward()
            backward()
        torch.cuda.synchronize()
    kernels = [e for e in prof.events()
               if e.device_type.name == "CUDA" and "normalization" in e.name and "epilogue" not in e.name]
    per_step = len(kernels) // args.repeat
    if per_step == 0 or len(kernels) % args.repeat:
        raise SystemExit(f"{len(kernels)} normalization kernels over {args.repeat} steps: not one list a step")
    setting = " ".join(f"{k}={v}" for k, v in sorted(os.environ.items()) if k.startswith("MESHFUSE_NORM")) or "default"
    print(f"# normalization kernels a step ({setting}), medians of {args.repeat} profiled steps")
    print("| launch | kernel | us |")
    print("|---|---|---|")
    for i in range(per_step):
        times = sorted(kernels[j * per_step + i].time_range.elapsed_us() for j in range(args.repeat))
        print(f"| {i} | {kernels[i].name[:48]} | {times[args.repeat // 2]:.1f} |")


if __name__ == "__main__":
    main()
