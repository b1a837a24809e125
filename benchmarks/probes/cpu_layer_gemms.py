"""Probe: the CPU tensor-parallel transformer layer's GEMMs, one at a time.

Each rank runs, as a one-matmul fusion, every GEMM its shard of the layer runs (the forward
product, the input gradient and the weight gradient of qkv, the out-projection, fc1 and fc2, with
the layer's [tokens, features] shapes divided by the number of ranks as TP divides them), and the
same product in numpy. Session 23 used it to tell whether the layer's GEMMs run slower inside the
layer than alone (they did not; BENCHMARKS.md, "CPU, tensor parallel on 2 ranks").

    mpirun --allow-run-as-root -np 2 -x OPENBLAS_CORETYPE=SkylakeX -x PYTHONPATH=$PWD/python \\
        python3 benchmarks/probes/cpu_layer_gemms.py --hidden 1024 --sequence 512

A single process (no mpirun) times one rank's shapes for --ranks ranks.
"""
import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir, "python"))
from meshfuse import FusionDefinition  # noqa: E402
from meshfuse.multidevice import Communicator  # noqa: E402

# (name, k, n) of each linear of one rank's shard, as fractions of the hidden width e over d ranks:
# column-parallel qkv and fc1 split their outputs, row-parallel out-projection and fc2 their inputs.
LINEARS = (("qkv", lambda e, d: (e, 3 * e // d)), ("out", lambda e, d: (e // d, e)),
           ("fc1", lambda e, d: (e, 4 * e // d)), ("fc2", lambda e, d: (4 * e // d, e)))


def product(kind, m, k, n, rng):
    """A one-matmul fusion of the layer's `kind` of product for a linear [k] -> [n] over m tokens,
    its random operands, and the same product in numpy (operands laid out as the layer has them)."""
    with FusionDefinition() as fd:
        if kind == "forward":  # x [m, k] @ W^T, W [n, k]
            a, b = rng.standard_normal((m, k), dtype=np.float32), rng.standard_normal((n, k), dtype=np.float32)
            ta, tb = fd.define_tensor([m, k]), fd.define_tensor([n, k])
            fd.add_output(fd.ops.matmul(ta, fd.ops.permute(tb, [1, 0])))
            return fd, [a, b], lambda: a @ b.T  # numpy hands BLAS the transpose, no copy
        if kind == "input grad":  # dy [m, n] @ W [n, k]
            a, b = rng.standard_normal((m, n), dtype=np.float32), rng.standard_normal((n, k), dtype=np.float32)
            ta, tb = fd.define_tensor([m, n]), fd.define_tensor([n, k])
            fd.add_output(fd.ops.matmul(ta, tb))
            return fd, [a, b], lambda: a @ b
        # weight grad: dy^T [n, m] @ x [m, k]
        a, b = rng.standard_normal((m, n), dtype=np.float32), rng.standard_normal((m, k), dtype=np.float32)
        ta, tb = fd.define_tensor([m, n]), fd.define_tensor([m, k])
        fd.add_output(fd.ops.matmul(fd.ops.permute(ta, [1, 0]), tb))
        return fd, [a, b], lambda: a.T @ b


def median_seconds(fn, comm, repeat):
    times = []
    for _ in range(repeat):
        if comm is not None:
            comm.barrier()  # the ranks start each call together, as inside the layer
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--sequence", type=int, default=512, help="tokens (batch 1)")
    parser.add_argument("--ranks", type=int, default=0, help="shard for this many ranks (default: the job's)")
    parser.add_argument("--repeat", type=int, default=15)
    args = parser.parse_args()
    comm = Communicator.instance()
    d = args.ranks or comm.size
    if args.hidden % d:
        parser.error(f"--hidden {args.hidden} does not divide over {d} ranks")
    rng = np.random.default_rng(1 + comm.rank)
    m, e = args.sequence, args.hidden
    rows, totals = [], {}
    for name, shape in LINEARS:
        k, n = shape(e, d)
        for kind in ("forward", "input grad", "weight grad"):
            fd, operands, peer = product(kind, m, k, n, rng)
            for _ in range(3):  # warm up: the first call compiles the fusion, the next ones fault pages in
                fd.execute(operands)
                peer()
            mine = median_seconds(lambda fd=fd, operands=operands: fd.execute(operands), comm, args.repeat)
            theirs = median_seconds(peer, comm, args.repeat)
            rows.append((name, kind, (m, k, n), mine, theirs))
            totals[kind] = totals.get(kind, 0.0) + mine
    if comm.rank != 0:
        return
    print(f"# one rank's GEMMs of the TP layer, e={e}, tokens={m}, d={d}, fp32 (medians of {args.repeat})")
    print("| linear | product | m x k x n | meshfuse ms | GFLOP/s | numpy ms | meshfuse / numpy |")
    print("|---|---|---|---|---|---|---|")
    for name, kind, (pm, pk, pn), mine, theirs in rows:
        flops = 2.0 * pm * pk * pn
        print(f"| {name} | {kind} | {pm} x {pk} x {pn} | {mine * 1e3:.2f} | {flops / mine / 1e9:.0f} | "
              f"{theirs * 1e3:.2f} | {theirs / mine:.2f}x |")
    forward = totals["forward"]
    backward = totals["input grad"] + totals["weight grad"]
    print(f"# sum: forward {forward * 1e3:.1f} ms, backward {backward * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
