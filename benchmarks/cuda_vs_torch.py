"""torch eager on the workloads of bench_cuda_ops (run on the GPU machine, where torch exists):
the 4-op pointwise chain gelu(x*y+0.5)-x (eager: one kernel per op) and a bf16 8192^3 matmul.
Prints a markdown table. Usage: python3 benchmarks/cuda_vs_torch.py [--quick]"""
import sys
import time

import torch
from timing import cuda_event_ms as time_ms


def main():
    quick = "--quick" in sys.argv
    n = 1 << (24 if quick else 28)
    rows = []
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.rand(n, device="cuda", dtype=dtype) * 2 - 1  # random, as in bench_cuda_ops
        y = torch.rand(n, device="cuda", dtype=dtype) * 2 - 1
        chain = lambda: torch.nn.functional.gelu(x * y + 0.5) - x  # noqa: E731
        ms = time_ms(chain, iters=5 if quick else 20)
        moved = 3 * n * x.element_size()
        rows.append((f"pointwise chain {dtype} {n >> 20}M, torch eager (GB/s)", moved / ms / 1e6))
    s = 2048 if quick else 8192
    a = torch.rand(s, s, device="cuda", dtype=torch.bfloat16) * 2 - 1
    b = torch.rand(s, s, device="cuda", dtype=torch.bfloat16) * 2 - 1
    ms = time_ms(lambda: torch.matmul(a, b.t()), iters=5 if quick else 20)
    rows.append((f"bf16 linear {s}^3, torch.matmul(x, w.t()) (TFLOP/s)", 2 * s**3 / ms / 1e9))
    # Host time per call of the small 2-op program of bench_cuda_ops (relu(x * 2) on 1024 floats),
    # eager: two kernel launches, no synchronization inside the loop.
    small_x = torch.rand(1024, device="cuda")
    iters = 2000 if quick else 20000
    for _ in range(100):
        torch.relu(small_x * 2.0)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        torch.relu(small_x * 2.0)
    host_us = (time.perf_counter() - t0) / iters * 1e6
    torch.cuda.synchronize()
    rows.append(("host time per call, 2-op eager program of 1024 floats (us)", host_us))
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
    print("| benchmark | torch |\n|---|---|")
    for name, value in rows:
        print(f"| {name} | {value:.1f} |")


if __name__ == "__main__":
    main()
