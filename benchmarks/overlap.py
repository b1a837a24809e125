"""How much of the communication ParallelType.stream hides behind the matmul, through meshfuse.

    mpirun -np 2 .venv/bin/python benchmarks/overlap.py [--sizes 1024 2048] [--json out.json]

For each pattern (allgather_linear, linear_reduce_scatter: benchmarks/overlap_patterns.py), every
backend, every size m = k = n and every chunk count s, it times (median over repeats of the slowest
rank; every run starts on all ranks together after a barrier, and each repeat runs every variant
once, interleaved, so that the machine's load changing over time biases none of them):
  time      the stream-split program with s chunks
  comm      the pattern's communication alone (an allgather of x / a reduce-scatter of the partial
            result, less the time of the local sum that makes the Partial in that fusion)
  compute   this rank's matmul alone (a local linear, no mesh)
and prints speedup = time(first s) / time(s) and fraction of ideal = max(comm, compute) / time (1.0: the
shorter of the two is completely hidden behind the longer one; below max/(comm+compute): worse than
not overlapping at all). Every chunked result is checked against s=1 before it is timed.

--device cuda (needs torch with CUDA): torch tensors on this rank's GPU in, torch tensors out; backends
cuda/nccl/ucc/mpi. With cuda and nccl the C++ stream loop queues chunk i on CUDA stream i % streams, so
chunk i+1's communication runs on the GPU while chunk i's matmul computes; mpi stages through the
host. nccl needs one GPU per rank and the cuda backend has no reduce-scatter: such combinations are
skipped with a note. Ranks that share one GPU also share its multiprocessors (and, without MPS, take
turns on it), so there the compute of the ranks cannot overlap with each other. float32 products run
on TF32 tensor cores here (MESHFUSE_MATMUL_TF32=1 unless set otherwise), as the recorded numbers did.
"""
import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

# float32 matmuls on TF32 tensor cores, as the numbers in BENCHMARKS.md were measured (the library's
# default is full fp32); set before meshfuse reads it at its first CUDA product.
os.environ.setdefault("MESHFUSE_MATMUL_TF32", "1")

import meshfuse  # noqa: E402
from meshfuse import CommunicatorBackend, DataType  # noqa: E402
from meshfuse.multidevice import Communicator, DeviceMesh, shard_tensor  # noqa: E402
from timing import positive_int  # noqa: E402
from overlap_patterns import (PATTERNS, OverlapProgram, communication_only, local_linear,  # noqa: E402
                              local_part_of_communication_only)

DTYPES = {"float32": DataType.Float, "float64": DataType.Double, "bfloat16": DataType.BFloat16}
CPU_BACKENDS = (CommunicatorBackend.mpi, CommunicatorBackend.gloo, CommunicatorBackend.ucc)
CUDA_BACKENDS = (CommunicatorBackend.cuda, CommunicatorBackend.nccl, CommunicatorBackend.ucc, CommunicatorBackend.mpi)
GPU_NOTE = ("note: cuda/nccl chunks run on asynchronous CUDA streams; ranks sharing a GPU also share its "
            "multiprocessors, so compute alone is measured with every rank computing at once")


def skip_reason(pattern, backend, device, ranks):
    """Why a (pattern, backend) pair cannot run here, or None."""
    if device != "cuda":
        if backend in (CommunicatorBackend.nccl, CommunicatorBackend.cuda):
            return f"the {backend.name} backend carries CUDA tensors only (--device cuda)"
        return None
    if backend == CommunicatorBackend.cuda and pattern == "linear_reduce_scatter":
        return "the cuda backend has no reduce-scatter"
    if backend == CommunicatorBackend.nccl:
        import torch

        if torch.cuda.device_count() < ranks:
            return f"nccl needs one GPU per rank ({ranks} ranks, {torch.cuda.device_count()} GPU(s))"
    return None


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--sizes", type=positive_int, nargs="+", help="m = k = n (default: 1024 2048 4096 on cpu, "
                   "1024 4096 8192 on cuda)")
    p.add_argument("--chunks", type=positive_int, nargs="+", default=[1, 2, 4, 8])
    p.add_argument("--patterns", nargs="+", choices=PATTERNS, default=list(PATTERNS))
    p.add_argument("--backends", nargs="+", help="default: every available one of mpi gloo ucc (cpu), cuda nccl ucc mpi (cuda)")
    p.add_argument("--dtype", choices=list(DTYPES), default="float32", help="bfloat16 needs torch tensors")
    p.add_argument("--streams", type=positive_int, default=2, help="number_of_streams: chunks in flight")
    p.add_argument("--sm-margins", type=int, nargs="+", default=[0],
                   help="CUDA: multiprocessors each chunk's matmul leaves to the communication "
                        "(HostIrEvaluatorParams.overlap_sm_margin; one table block per value)")
    p.add_argument("--repeats", type=positive_int, default=5)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--json", help="write the rows as JSON here (rank 0)")
    p.add_argument("--trace-dir", help="also write one Chrome trace per (pattern, backend, size, s > 1) here")
    return p.parse_args()


class Arrays:
    """Random global inputs as numpy arrays, or torch tensors on this rank's GPU."""

    def __init__(self, device, dtype_name):
        self.device, self.dtype_name = device, dtype_name
        self.torch = None
        if device == "cuda" or dtype_name == "bfloat16":
            import torch  # noqa: F401  (meshfuse returns torch tensors for torch inputs)

            self.torch = torch
            if device == "cuda":
                torch.cuda.set_device(Communicator.instance().local_rank % torch.cuda.device_count())
        self.rng = np.random.default_rng(1234)  # the same global arrays on every rank

    def random(self, shape):
        a = self.rng.uniform(-1, 1, shape).astype(np.float64 if self.dtype_name == "float64" else np.float32)
        if self.torch is None:
            return a
        t = self.torch.from_numpy(a).to(getattr(self.torch, self.dtype_name))
        return t.to("cuda") if self.device == "cuda" else t

    def sync(self):
        if self.device == "cuda":
            self.torch.cuda.synchronize()

    def close(self, a, b):
        if self.torch is not None:
            a, b = a.float().cpu().numpy(), b.float().cpu().numpy()
        tol = {"float64": 1e-10, "float32": 1e-3, "bfloat16": 5e-2}[self.dtype_name]
        return np.allclose(a, b, rtol=tol, atol=tol * np.abs(b).max())


class Timer:
    """Times a callable on every rank at once; the slowest rank's time of each repeat counts."""

    def __init__(self, arrays, repeats, warmup):
        self.arrays, self.repeats, self.warmup = arrays, repeats, warmup
        comm = Communicator.instance()
        self.comm, self.rank, self.size = comm, comm.rank, comm.size
        self._gather = None

    def _slowest(self, times):
        """Per repeat, the maximum over the ranks (through a meshfuse allgather)."""
        if self.size == 1:
            return times
        if self._gather is None:
            mesh = DeviceMesh(range(self.size))
            fd = meshfuse.FusionDefinition(backend_type=CommunicatorBackend.mpi
                                           if CommunicatorBackend.mpi in meshfuse.available_backends()
                                           else CommunicatorBackend.auto)
            t = fd.define_tensor([self.size, self.repeats], DataType.Double)
            everyone = fd.ops.set(t)
            fd.add_output(everyone)
            t.set_device_mesh(mesh)
            everyone.set_device_mesh(mesh)
            t.outer_split(0, self.size)
            t.axis(0).parallelize(meshfuse.ParallelType.mesh_x)
            self._gather = fd
        (all_times,) = self._gather.execute([np.array([times], dtype=np.float64)])
        return list(np.max(all_times, axis=0))

    def medians(self, fns):
        """{name: median seconds} of named callables. Each repeat runs all of them once, one after
        another, so a change in the machine's load over time touches every variant alike."""
        for _ in range(self.warmup):
            for fn in fns.values():
                fn()
        self.arrays.sync()
        times = {name: [] for name in fns}
        for _ in range(self.repeats):
            for name, fn in fns.items():
                self.comm.barrier()
                start = time.perf_counter()
                fn()
                self.arrays.sync()
                times[name].append(time.perf_counter() - start)
        return {name: statistics.median(self._slowest(t)) for name, t in times.items()}


def bench_pattern(pattern, backend, size, args, arrays, timer, trace_dir):
    """One row per chunk count: the stream-split program, its communication and its matmul alone."""
    rank = timer.rank
    dtype = DTYPES[args.dtype]
    x, w = arrays.random((size, size)), arrays.random((size, size))
    fns = {}

    comm_fd, comm_shape, comm_in = communication_only(pattern, size, size, size, dtype=dtype, backend=backend)
    comm_input = shard_tensor(arrays.random(comm_shape), comm_in, rank)
    fns["comm"] = lambda: comm_fd.execute([comm_input])
    local = local_part_of_communication_only(pattern, size, size, dtype=dtype)
    if local is not None:  # the reduce-scatter's fusion first sums its [1, S, N] input locally
        local_fd, local_shape = local
        local_input = arrays.random(local_shape)
        fns["comm_local_part"] = lambda: local_fd.execute([local_input])
    mm_fd, x_shape, w_shape = local_linear(pattern, size, size, size, dtype=dtype)
    mm_inputs = [arrays.random(x_shape), arrays.random(w_shape)]
    fns["compute"] = lambda: mm_fd.execute(mm_inputs)

    programs, first = {}, None
    for s in args.chunks:
        prog = OverlapProgram(pattern, size, size, size, chunks=s, dtype=dtype, backend=backend,
                              number_of_streams=args.streams)
        inputs = prog.local_inputs(x, w, rank)
        y = prog.execute(inputs)
        if first is None:
            first = y
        elif not arrays.close(y, first):
            raise AssertionError(f"rank {rank}: {pattern} {backend.name} size {size}: s={s} differs from "
                                 f"s={args.chunks[0]}")
        programs[s] = (prog, inputs)
        fns[s] = lambda prog=prog, inputs=inputs: prog.execute(inputs)
    t = timer.medians(fns)
    if trace_dir:
        for s, (prog, inputs) in programs.items():
            if s > 1:
                prog.execute(inputs, trace=os.path.join(trace_dir, f"{pattern}_{backend.name}_{size}_s{s}.json"))
    comm_time = max(0.0, t["comm"] - t.get("comm_local_part", 0.0))
    compute_time, baseline = t["compute"], t[args.chunks[0]]
    return [{
        "pattern": pattern, "backend": backend.name, "size": size, "s": s, "time_s": t[s],
        "comm_s": comm_time, "comm_fusion_s": t["comm"], "compute_s": compute_time, "speedup": baseline / t[s],
        "fraction_of_ideal": max(comm_time, compute_time) / t[s],
        "no_overlap_fraction": max(comm_time, compute_time) / (comm_time + compute_time),
    } for s in args.chunks]


TABLE_HEADER = (f"{'backend':<8} {'size':>5} {'s':>2} {'time ms':>9} {'comm ms':>9} {'compute ms':>10} "
                f"{'speedup':>8} {'ideal frac':>10} {'(serial)':>8}")


def print_rows(rows):
    for r in rows:
        print(f"{r['backend']:<8} {r['size']:>5} {r['s']:>2} {1e3 * r['time_s']:>9.2f} {1e3 * r['comm_s']:>9.2f} "
              f"{1e3 * r['compute_s']:>10.2f} {r['speedup']:>8.2f} {r['fraction_of_ideal']:>10.2f} "
              f"{r['no_overlap_fraction']:>8.2f}", flush=True)


def write_json(path, args, ranks, rows):
    with open(path, "w") as f:
        json.dump({"ranks": ranks, "device": args.device, "dtype": args.dtype, "streams": args.streams,
                   "repeats": args.repeats, "note": GPU_NOTE if args.device == "cuda" else "", "rows": rows},
                  f, indent=1)


def main():
    args = parse_args()
    comm = Communicator.instance()
    available = meshfuse.available_backends()
    wanted = ([getattr(CommunicatorBackend, b) for b in args.backends] if args.backends
              else CUDA_BACKENDS if args.device == "cuda" else CPU_BACKENDS)
    backends = [b for b in wanted if b in available]
    if not backends:
        raise SystemExit(f"none of {[b.name for b in wanted]} is available (available: {[b.name for b in available]})")
    sizes = args.sizes or ([1024, 4096, 8192] if args.device == "cuda" else [1024, 2048, 4096])
    for size in sizes:  # every chunk count (the largest alone let 3 through where 8 divides)
        for chunks in args.chunks:
            if size % (comm.size * chunks):
                raise SystemExit(f"size {size} does not split into {comm.size} ranks x {chunks} chunks")
    arrays = Arrays(args.device, args.dtype)
    timer = Timer(arrays, args.repeats, args.warmup)
    if args.trace_dir and comm.rank == 0:
        os.makedirs(args.trace_dir, exist_ok=True)

    leader = comm.rank == 0
    if leader:  # rows are printed (and the JSON rewritten) as they are measured
        print(f"meshfuse overlap benchmark: {comm.size} ranks, device {args.device}, {args.dtype}, "
              f"number_of_streams {args.streams}, median of {args.repeats} repeats (slowest rank)")
        print(f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', '-')} "
              f"OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS', '-')} "
              f"OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', '(unset)')}")
        print("ideal frac = max(comm, compute) / time; (serial) = the same if nothing overlapped")
        if args.device == "cuda":
            print(GPU_NOTE)
            print(f"MESHFUSE_MATMUL_TF32={os.environ['MESHFUSE_MATMUL_TF32']} (float32 products on TF32 tensor cores)")
    rows = []
    for pattern in args.patterns:
        if leader:
            print(f"\n{pattern}\n{TABLE_HEADER}\n{'-' * len(TABLE_HEADER)}", flush=True)
        for backend in backends:
            why = skip_reason(pattern, backend, args.device, comm.size)
            if why:
                if leader:
                    print(f"{backend.name:<8}  skipped: {why}", flush=True)
                continue
            for margin in (args.sm_margins if args.device == "cuda" else [0]):
                # Read by the C++ stream loop at each execute (overlap_sm_margin left at -1).
                os.environ["MESHFUSE_OVERLAP_SM_MARGIN"] = str(margin)
                if leader and len(args.sm_margins) > 1:
                    print(f"{backend.name:<8}  matmul SM margin {margin}", flush=True)
                for size in sizes:
                    new = bench_pattern(pattern, backend, size, args, arrays, timer, args.trace_dir)
                    for r in new:
                        r["sm_margin"] = margin
                    rows += new
                    if leader:
                        print_rows(new)
                    if args.json and leader:
                        write_json(args.json, args, comm.size, rows)


if __name__ == "__main__":
    main()
