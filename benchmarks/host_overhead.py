"""Per-execute host overhead of a tiny cached fusion (one process), against numpy doing the same
op, and against the first (lowering) execute.

    .venv/bin/python benchmarks/host_overhead.py [--iters 20000]
"""
import argparse
import time

import numpy as np

from meshfuse import DataType, FusionDefinition


def best_of(fn, iters, repeats=5):
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        times.append((time.perf_counter() - t0) / iters)
    return min(times)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--iters", type=int, default=20000)
    args = parser.parse_args()
    a = np.random.rand(8).astype(np.float32)
    b = np.random.rand(8).astype(np.float32)
    with FusionDefinition() as fd:
        x = fd.define_tensor(shape=[8], dtype=DataType.Float)
        y = fd.define_tensor(shape=[8], dtype=DataType.Float)
        fd.add_output(fd.ops.add(x, y))
    t0 = time.perf_counter()
    fd.execute([a, b])
    first = time.perf_counter() - t0
    cached = best_of(lambda: fd.execute([a, b]), args.iters)
    numpy_add = best_of(lambda: np.add(a, b), args.iters)
    print("| what | us per call |")
    print("|---|---|")
    print(f"| first execute (validate + lower + run) | {first * 1e6:.1f} |")
    print(f"| cached execute of add([8], [8]) | {cached * 1e6:.2f} |")
    print(f"| numpy.add on the same arrays | {numpy_add * 1e6:.2f} |")
    print(f"| meshfuse / numpy | {cached / numpy_add:.1f}x |")


if __name__ == "__main__":
    main()
