"""Probe: would the transformer layer's backward gain from a second CUDA stream?

Nothing in the backward's chain waits for the weight-gradient GEMMs, so they could run beside the
input-gradient chain. This times, in torch on the layer's shapes, each (f, g) pair one after the
other and side by side on two streams. Session 23 found 0.95x in all (cuBLASLt's Hopper GEMMs take
every multiprocessor) and left the second stream off (BENCHMARKS.md, "One H100, session 23").

    python3 benchmarks/probes/backward_streams.py                      # the GPT-3 layer's shapes
    python3 benchmarks/probes/backward_streams.py --sequence 256 --hidden 512 --heads 4 --repeat 3
"""
import argparse
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir))  # benchmarks/timing.py
from timing import cuda_event_ms  # noqa: E402


def one_then_other(f, g):
    def run():
        f()
        g()
    return run


def side_by_side(f, g, streams):
    def run():
        current = torch.cuda.current_stream()
        for s in streams:
            s.wait_stream(current)
        with torch.cuda.stream(streams[0]):
            f()
        with torch.cuda.stream(streams[1]):
            g()
        for s in streams:
            current.wait_stream(s)
    return run


def layer_pairs(tokens, hidden, heads, dtype):
    """(name, f, g) for each pair of the backward's kernels that do not depend on each other."""
    def rand(*shape):
        return torch.randn(*shape, device="cuda", dtype=dtype) * 0.02

    pairs = []
    for name, width in (("qkv", 3 * hidden), ("out-projection", hidden), ("fc1", 4 * hidden)):
        dy, x, w = rand(tokens, width), rand(tokens, hidden), rand(width, hidden)
        pairs.append((f"{name} input grad | weight grad", lambda dy=dy, w=w: dy @ w, lambda dy=dy, x=x: dy.t() @ x))
    dy, a, w = rand(tokens, hidden), rand(tokens, 4 * hidden), rand(hidden, 4 * hidden)
    pairs.append(("fc2 input grad | weight grad", lambda: dy @ w, lambda: dy.t() @ a))
    q, k, v = (rand(1, heads, tokens, hidden // heads).requires_grad_() for _ in range(3))
    o = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=0.1)
    grad_o = torch.randn_like(o)
    dyp, xp = rand(tokens, hidden), rand(tokens, hidden)
    pairs.append(("attention bwd | out-proj weight grad",
                  lambda: torch.autograd.grad(o, (q, k, v), grad_o, retain_graph=True), lambda: dyp.t() @ xp))
    xl = rand(tokens, hidden).float().requires_grad_()
    wl = torch.ones(hidden, device="cuda", requires_grad=True)
    yl = F.layer_norm(xl, (hidden,), wl)
    grad_y = torch.randn_like(yl)
    dy1, x1 = rand(tokens, 4 * hidden), rand(tokens, hidden)
    pairs.append(("LayerNorm bwd | fc1 weight grad",
                  lambda: torch.autograd.grad(yl, (xl, wl), grad_y, retain_graph=True), lambda: dy1.t() @ x1))
    return pairs


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sequence", type=int, default=2048, help="tokens (batch 1)")
    parser.add_argument("--hidden", type=int, default=12288)
    parser.add_argument("--heads", type=int, default=96)
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("backward_streams.py needs torch with a CUDA GPU")
    torch.manual_seed(0)
    streams = (torch.cuda.Stream(), torch.cuda.Stream())
    print(f"# torch {torch.__version__}, {torch.cuda.get_device_name()}, bf16, tokens={args.sequence} "
          f"e={args.hidden} h={args.heads}; CUDA events, mean of {args.repeat} after 3 warm-up calls")
    print("| pair (f, g) | f ms | g ms | f then g ms | f beside g ms | gain |")
    print("|---|---|---|---|---|---|")
    serial = parallel = 0.0
    for name, f, g in layer_pairs(args.sequence, args.hidden, args.heads, torch.bfloat16):
        tf, tg = cuda_event_ms(f, args.repeat), cuda_event_ms(g, args.repeat)
        ts = cuda_event_ms(one_then_other(f, g), args.repeat)
        tp = cuda_event_ms(side_by_side(f, g, streams), args.repeat)
        serial, parallel = serial + ts, parallel + tp
        print(f"| {name} | {tf:.3f} | {tg:.3f} | {ts:.3f} | {tp:.3f} | {ts / tp:.2f}x |")
    print(f"| all | | | {serial:.2f} | {parallel:.2f} | {serial / parallel:.2f}x |")


if __name__ == "__main__":
    main()
