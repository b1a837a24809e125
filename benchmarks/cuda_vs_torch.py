"""torch eager on the workloads of bench_cuda_ops (run on the GPU machine, where torch exists):
the 4-op pointwise chain gelu(x*y+0.5)-x (eager: one kernel per op) and a bf16 8192^3 matmul.
Prints a markdown table. Usage: python3 benchmarks/cuda_vs_torch.py [--quick]"""
import sys

import torch


def time_ms(fn, warmup=3, iters=20):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / iters


def main():
    quick = "--quick" in sys.argv
    n = 1 << (24 if quick else 28)
    rows = []
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.full((n,), 0.0115, device="cuda", dtype=dtype)
        y = torch.full((n,), 0.0113, device="cuda", dtype=dtype)
        chain = lambda: torch.nn.functional.gelu(x * y + 0.5) - x  # noqa: E731
        ms = time_ms(chain, iters=5 if quick else 20)
        moved = 3 * n * x.element_size()
        rows.append((f"pointwise chain {dtype} {n >> 20}M, torch eager (GB/s)", moved / ms / 1e6))
    s = 2048 if quick else 8192
    a = torch.full((s, s), 0.0115, device="cuda", dtype=torch.bfloat16)
    b = torch.full((s, s), 0.0115, device="cuda", dtype=torch.bfloat16)
    ms = time_ms(lambda: torch.matmul(a, b.t()), iters=5 if quick else 20)
    rows.append((f"bf16 linear {s}^3, torch.matmul(x, w.t()) (TFLOP/s)", 2 * s**3 / ms / 1e9))
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
    print("| benchmark | torch |\n|---|---|")
    for name, value in rows:
        print(f"| {name} | {value:.1f} |")


if __name__ == "__main__":
    main()
