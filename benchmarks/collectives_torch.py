"""allgather, allreduce and reduce-scatter through torch.distributed's gloo backend, timed the way
benchmarks/bench_collectives.cpp times meshfuse (float32, 1 KiB .. 64 MiB in x4 steps, size = the
full buffer, the same iteration counts, median of 7 rounds, a round = the slowest rank's mean), so
its table sits next to that one's gloo column.

Debian's python3-torch runs only under Debian's own interpreter; ranks come from mpirun's
environment (or RANK / WORLD_SIZE when set, torchrun style):
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \\
    mpirun --oversubscribe -np 2 /usr/bin/python3 benchmarks/collectives_torch.py [--max-mib 64]
Rows print as they are measured (the whole range takes about 5 minutes on 2 cores; --max-mib 1 under one).
"""

import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist

ROUNDS = 7
WARMUP = 3


def rank_and_size():
    rank = os.environ.get("RANK", os.environ.get("OMPI_COMM_WORLD_RANK"))
    size = os.environ.get("WORLD_SIZE", os.environ.get("OMPI_COMM_WORLD_SIZE"))
    if rank is None or size is None:
        raise SystemExit("run under mpirun, or set RANK and WORLD_SIZE (and MASTER_ADDR/MASTER_PORT)")
    return int(rank), int(size)


def time_once(fn, iters):
    """Mean seconds per call over `iters` calls, the slowest rank's."""
    dist.barrier()
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    mine = torch.tensor([(time.perf_counter() - start) / iters], dtype=torch.float64)
    dist.all_reduce(mine, op=dist.ReduceOp.MAX)
    return mine.item()


def measure(nbytes, fn):
    iters = min(max((256 << 20) // nbytes, 5), 2000)  # as bench_collectives.cpp
    for _ in range(WARMUP):
        fn()
    return statistics.median(time_once(fn, iters) for _ in range(ROUNDS))


def supported(fn):
    """Whether this torch's gloo backend implements the collective (1.13 lacks reduce_scatter)."""
    try:
        fn()
        return True
    except RuntimeError as e:
        if "does not support" in str(e):
            return False
        raise


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-mib", type=int, default=64, choices=[1, 4, 16, 64],
                        help="the largest buffer, in MiB (bench_collectives.cpp takes the same as its argument)")
    args = parser.parse_args()
    rank, size = rank_and_size()
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29561")
    dist.init_process_group("gloo", rank=rank, world_size=size)
    torch.set_num_threads(1)  # one core a rank, like the C++ benchmark; the machine may be shared
    ring = (size - 1) / size

    if rank == 0:
        print(f"collectives_torch: torch {torch.__version__} gloo, {size} ranks, float32, median of {ROUNDS} rounds "
              "(slowest rank per round)")
        print(f"{'size':>10}  {'op':<14}  {'torch_gloo_us':>13}  {'busbw_GB/s':>10}", flush=True)
    nbytes = 1024
    while nbytes <= args.max_mib << 20:
        block = nbytes // 4 // size
        full = torch.ones(block * size, dtype=torch.float32)
        part = torch.ones(block, dtype=torch.float32)
        parts = list(full.chunk(size))  # all_gather's outputs: views of one buffer
        ops = [
            ("allgather", ring, lambda: dist.all_gather(parts, part)),
            ("allreduce", 2 * ring, lambda: dist.all_reduce(full, op=dist.ReduceOp.SUM)),
            ("reduce_scatter", ring, lambda: dist.reduce_scatter(part, list(full.chunk(size)), op=dist.ReduceOp.SUM)),
        ]
        for name, bus, fn in ops:
            seconds = measure(nbytes, fn) if supported(fn) else None
            if rank == 0:
                label = f"{nbytes >> 20} MiB" if nbytes >= 1 << 20 else f"{nbytes >> 10} KiB"
                if seconds is None:
                    print(f"{label:>10}  {name:<14}  {'n/a':>13}  {'n/a':>10}  (not in this torch's gloo backend)",
                          flush=True)
                else:
                    print(f"{label:>10}  {name:<14}  {seconds * 1e6:13.2f}  {nbytes / seconds * bus / 1e9:10.3f}",
                          flush=True)
        nbytes *= 4
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
