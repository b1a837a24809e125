"""The transformer layer (meshfuse.models.transformer), forward and backward, against torch on the
same work, in one table.

CPU, tensor parallel over MPI ranks (one rank per process; torch's side is a Megatron layer with
manual all_reduce over its gloo process group):
    mpirun -np 2 /usr/bin/python3 benchmarks/transformer.py --device cpu --hidden 1024 --sequence 512
(--breakdown 5 adds rank 0's time per segment kind, from traces of five more meshfuse steps, and
every rank's matmul and waiting time, which shows when the machine runs one rank slower than another;
--backend gloo runs meshfuse's communication on Gloo too, as torch's side does, instead of `auto`,
which is MPI under mpirun on the CPU.)
GPU, one device (the GPT-3 layer, causal, dropout 0.1), against torch eager and torch.compile:
    python3 benchmarks/transformer.py --device cuda --batch 1 --sequence 2048 --heads 96 --hidden 12288
With several GPUs (one rank per GPU) the same command under mpirun runs TP over d = world size.

On the CPU both sides are first checked against each other with dropout off (the meshfuse layer in
evaluation mode, torch's with p = 0): the output and the input's gradient must agree to 1e-3, or the
benchmark stops before timing anything.

Times are the median of --iters rounds after --warmup, synchronized (a barrier on CPU, the device on
CUDA). The libraries alternate, each pass called once a round, and each speed-up is the median of the
rounds' ratios (a shared VM's speed drifts by tens of percent within a run, a GPU's clocks with the
GEMMs' power); --order blocks times each library's calls back to back instead, which tells apart,
for passes of a few ms, what a call costs when it follows the other library's. TFLOP/s count the
layer's GEMM and attention FLOPs (fwd: 24 b s e^2 + 4 b s^2 e, halved for causal attention; bwd:
twice the forward's).
"""
import argparse
import contextlib
import dataclasses
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "python"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from meshfuse import CommunicatorBackend, DataType  # noqa: E402
from meshfuse.models import transformer as tf  # noqa: E402
from meshfuse.multidevice import Communicator  # noqa: E402
from meshfuse.torch import TransformerLayer  # noqa: E402
from timing import (best_time, host_device_split, host_trace_summary, kernel_profile, positive_int,  # noqa: E402
                    scoped_env, trace_events)  # (this directory, first on the path of a script run)


def layer_flops(cfg, backward):
    b, s, e = cfg.batch, cfg.sequence, cfg.hidden
    attention = 4 * b * s * s * e * (0.5 if cfg.causal else 1.0)
    forward = 24 * b * s * e * e + attention
    return 2 * forward if backward else forward


def step_flops(cfg):
    """A training step's FLOPs: the forward's and the backward's (twice them)."""
    return layer_flops(cfg, False) + layer_flops(cfg, True)


class _AllReduce(torch.autograd.Function):
    """Megatron's g: allreduce forward, identity backward."""

    @staticmethod
    def forward(ctx, x):
        torch.distributed.all_reduce(x)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad


class _Copy(torch.autograd.Function):
    """Megatron's f: identity forward, allreduce backward."""

    @staticmethod
    def forward(ctx, x):
        return x

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        torch.distributed.all_reduce(grad)
        return grad


def torch_attention(q, k, v, causal, dropout_p=0.0):
    """F.scaled_dot_product_attention where torch has it (2.0+), else the same in three ops."""
    if hasattr(F, "scaled_dot_product_attention"):
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=causal)
    scores = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    if causal:
        s = scores.shape[-1]
        scores = scores.masked_fill(torch.ones(s, s, dtype=torch.bool).triu(1), float("-inf"))
    return F.dropout(torch.softmax(scores, -1), dropout_p) @ v


def torch_layer(x, p, cfg, tp):
    """The same layer in torch on this rank's shards (Megatron TP when tp > 1)."""
    b, s, e = x.shape
    h = cfg.heads // tp
    keep = 1.0 - cfg.dropout_p
    ln0 = F.layer_norm(x, (e,), p["ln0_weight"], p["ln0_bias"], cfg.eps)
    if tp > 1:
        ln0 = _Copy.apply(ln0)
    qkv = F.linear(ln0, p["qkv_weight"], p["qkv_bias"]).view(b, s, h, -1)
    q, k, v = (t.transpose(1, 2) for t in qkv.split(cfg.head_dim, dim=3))
    # Attention dropout as meshfuse's layer applies it: in every training pass, also without grad.
    o = torch_attention(q, k, v, cfg.causal, cfg.sdpa_dropout_p)
    attn = F.linear(o.transpose(1, 2).reshape(b, s, -1), p["out_weight"])
    if tp > 1:
        attn = _AllReduce.apply(attn)
    h1 = x + F.dropout(attn + p["out_bias"], cfg.dropout_p) if keep < 1 else x + attn + p["out_bias"]
    ln1 = F.layer_norm(h1, (e,), p["ln1_weight"], p["ln1_bias"], cfg.eps)
    if tp > 1:
        ln1 = _Copy.apply(ln1)
    fc1 = F.gelu(F.linear(ln1, p["fc1_weight"], p["fc1_bias"]), approximate="tanh")
    fc2 = F.linear(fc1, p["fc2_weight"])
    if tp > 1:
        fc2 = _AllReduce.apply(fc2)
    return h1 + F.dropout(fc2 + p["fc2_bias"], cfg.dropout_p)


def timed_rounds(fns, sync, warmup, iters, blocks=False):
    """{name: [seconds, one per round]}: each of fns (a dict of name -> callable) called once a round,
    in order, synchronized, for `iters` rounds after `warmup`. Alternating the two libraries call by
    call lets a drift in the machine's speed (a shared VM's neighbours, a GPU's clocks under the
    GEMMs' power) weigh on both sides of each round alike, rather than on whichever block of calls
    ran during it; ratios are then taken round by round (round_ratio). blocks=True (--order blocks)
    runs each callable's warm-up and rounds in a block of its own instead: where a pass is short
    enough that a call's speed depends on which library ran just before it (caches, allocators, the
    host's state), the two orders together tell that part from the libraries' own costs."""
    def timed(fn):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        return time.perf_counter() - t0

    if blocks:
        times = {}
        for name, fn in fns.items():
            for _ in range(warmup):
                fn()
            times[name] = [timed(fn) for _ in range(iters)]
        return times
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    times = {name: [] for name in fns}
    for _ in range(iters):
        for name, fn in fns.items():
            times[name].append(timed(fn))
    return times


def round_ratio(numerator, denominator):
    """The median over rounds of numerator[i] / denominator[i] (lists of per-round seconds)."""
    return statistics.median(n / d for n, d in zip(numerator, denominator))


def timed_pair(fn_a, fn_b, sync, warmup, iters, blocks=False):
    """(median a, median b, median of b / a over rounds): timed_rounds of the two."""
    t = timed_rounds({"a": fn_a, "b": fn_b}, sync, warmup, iters, blocks)
    return statistics.median(t["a"]), statistics.median(t["b"]), round_ratio(t["b"], t["a"])


def check_against_torch(layer, x, xt, params, cfg, d, rank):
    """Both sides compute the same layer: with dropout off (the meshfuse layer in evaluation mode,
    torch's with p = 0), the output and the input's gradient agree to 1e-3 (relative to the largest
    value), or the benchmark stops before timing anything. Prints the differences on rank 0."""
    quiet = dataclasses.replace(cfg, dropout_p=0.0, attention_dropout_p=0.0)
    dy = torch.from_numpy(np.random.default_rng(1).standard_normal(tuple(xt.shape)).astype(np.float32))
    layer.eval()
    x_mf = x.detach().clone().requires_grad_(True)
    out_mf = layer(x_mf)
    out_mf.backward(layer.shard_input(dy.numpy()))
    layer.train()
    x_t = xt.detach().clone().requires_grad_(True)
    t_params = {n: p.detach().clone().requires_grad_(True) for n, p in params.items()}
    out_t = torch_layer(x_t, t_params, quiet, d)
    out_t.backward(dy)
    layer.zero_grad(set_to_none=True)

    def rel(a, b):
        a, b = a.detach().double(), b.detach().double()
        return float((a - b).abs().max() / b.abs().max().clamp(min=1e-30))

    expected_out = layer.shard_input(out_t.detach().numpy())
    expected_grad = layer.shard_input(x_t.grad.numpy())
    errors = {"output": rel(out_mf, expected_out), "input gradient": rel(x_mf.grad, expected_grad)}
    if rank == 0:
        print("# checked against torch, dropout off: " + ", ".join(f"{k} max rel. diff {v:.1e}" for k, v in
                                                                   errors.items()), flush=True)
    bad = {k: v for k, v in errors.items() if not v <= 1e-3}
    if bad:
        raise SystemExit(f"rank {rank}: meshfuse and torch disagree ({bad}): the timings would not compare the "
                         "same work")


def run_cpu(args):
    comm = Communicator.instance()
    d, rank = comm.size, comm.rank
    cfg = tf.TransformerConfig(batch=args.batch, sequence=args.sequence, heads=args.heads, hidden=args.hidden,
                               dtype=DataType.Float, dropout_p=args.dropout)
    schedule = "tp" if d > 1 else "none"
    layer = TransformerLayer(cfg, schedule=schedule, backend=getattr(CommunicatorBackend, args.backend))
    rng = np.random.default_rng(0)
    x_global = rng.standard_normal((cfg.batch, cfg.sequence, cfg.hidden)).astype(np.float32)
    x = layer.shard_input(x_global).requires_grad_(True)

    if d > 1:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29533")
        torch.distributed.init_process_group("gloo", rank=rank, world_size=d)
    params = {n: getattr(layer, n).detach().clone().requires_grad_(True) for n in tf.PARAMETERS}
    # torch's row-parallel biases are added after the allreduce: replicated, as in meshfuse.
    for n in ("out_bias", "fc2_bias"):
        params[n] = torch.from_numpy(layer.initial_parameters(cfg, 0)[n]).requires_grad_(True)
    xt = torch.from_numpy(x_global).requires_grad_(True)

    def barrier():
        comm.barrier() if d > 1 else None

    dy = torch.ones(cfg.batch, cfg.sequence, cfg.hidden)
    check_against_torch(layer, x, xt, params, cfg, d, rank)
    rows = []
    with torch.no_grad():
        rows.append(("forward", *timed_pair(lambda: layer(x), lambda: torch_layer(xt, params, cfg, d), barrier,
                                            args.warmup, args.iters, args.order == "blocks")))

    def mf_step():
        layer.zero_grad(set_to_none=True)  # as the torch side's p.grad = None (torch 1.13 would zero-fill)
        layer(x).backward(dy)

    def torch_step():
        for p in params.values():
            p.grad = None
        torch_layer(xt, params, cfg, d).backward(dy)

    rows.append(("forward+backward", *timed_pair(mf_step, torch_step, barrier, args.warmup, args.iters,
                                                 args.order == "blocks")))
    parts = cpu_breakdown(layer, x, dy, args) if args.breakdown else None
    host = {}
    if args.host_breakdown:
        for name, trace in traced_cpu_passes(layer, x, dy, args.trace_dir, trace_host=True):
            host[name] = host_trace_summary(trace) if rank == 0 else None
    floor_ms = gemm_floor_ms(cfg, d)
    if d > 1:  # torch 1.13 aborts at exit when its gloo group's threads outlive the interpreter
        torch.distributed.destroy_process_group()
    if rank == 0:
        print(f"# transformer layer, CPU, {d} rank(s) ({schedule}), b={cfg.batch} s={cfg.sequence} e={cfg.hidden} "
              f"h={cfg.heads} fp32, threads/rank={torch.get_num_threads()}, meshfuse backend {args.backend}, "
              f"calls {'in blocks' if args.order == 'blocks' else 'alternating'}")
        print(f"{'pass':<18}{'meshfuse ms':>13}{'torch gloo ms':>15}{'speed-up':>10}{'GFLOP/s mf':>12}")
        for name, mf, tt, ratio in rows:
            # (Before session 15 the forward+backward row counted the backward's alone, a third low.
            # Before session 19 each side ran its iterations in a block of its own and the speed-up
            # was the ratio of the two medians.)
            flops = (layer_flops(cfg, False) if name == "forward" else step_flops(cfg)) / d
            print(f"{name:<18}{mf * 1e3:>13.2f}{tt * 1e3:>15.2f}{ratio:>9.2f}x{flops / mf / 1e9:>12.1f}")
        floor, rate, shape = floor_ms
        print(f"# GEMM floor: {floor:.1f} ms a step, the layer's FLOPs at meshfuse's matmul rate on its largest "
              f"per-rank product ({rate:.0f} GFLOP/s, {shape}); torch's step / floor = "
              f"{rows[-1][2] * 1e3 / floor:.2f}x, the most any speed-up could reach on this machine")
        for name, kinds in (parts or {}).get(0, {}).items():
            desc = ", ".join(f"{k} {v:.2f}" for k, v in sorted(kinds.items(), key=lambda kv: -kv[1]))
            print(f"# rank 0 {name} ms by segment kind (mean of {args.breakdown} traced steps): {desc}, "
                  f"total {sum(kinds.values()):.2f}")
        if parts and len(parts) > 1:
            print_rank_balance(parts)
        for name, summary in host.items():
            print_host_breakdown(f"rank 0 {name}", summary)


def gemm_floor_ms(cfg, d):
    """(ms, GFLOP/s, shape): a step's FLOPs (forward and backward, per rank) at the rate meshfuse's own
    matmul reaches on the layer's largest per-rank product, fc1's [b s, e] x [e, 4e/d]: the least a step
    could take were it nothing but GEMMs at that rate (smaller products run slower, so it is a bound)."""
    from meshfuse import FusionDefinition
    m, k, n = cfg.batch * cfg.sequence, cfg.hidden, 4 * cfg.hidden // d
    rng = np.random.default_rng(1)
    a, w = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((n, k)).astype(np.float32)
    with FusionDefinition() as fd:
        ta, tw = fd.define_tensor([m, k]), fd.define_tensor([n, k])
        fd.add_output(fd.ops.matmul(ta, fd.ops.permute(tw, [1, 0])))
    # The best of many: the machine's rate when nothing else takes the core.
    rate = 2.0 * m * n * k / best_time(lambda: fd.execute([a, w]), repeat=20)
    return step_flops(cfg) / d / rate * 1e3, rate / 1e9, f"[{m}, {k}] x [{k}, {n}]"


def traced_cpu_passes(layer, x, dy, trace_dir, **trace_options):
    """Runs the layer's forward and backward fusions once each with a trace; yields (pass, trace path)."""
    from meshfuse.torch import _plain
    fwd, bwd = layer.forward_fusion, layer.backward_fusion
    params = [_plain(getattr(layer, n)) for n in tf.PARAMETERS]
    trace = os.path.join(trace_dir, "transformer_cpu_fwd_trace.json")
    outs = dict(zip(tf.FORWARD_OUTPUTS, fwd.execute([_plain(x)] + params, trace=trace, **trace_options)))
    yield "forward", trace
    arrays = dict(outs, x=_plain(x), grad_out=dy, **dict(zip(tf.PARAMETERS, params)))
    trace = os.path.join(trace_dir, "transformer_cpu_bwd_trace.json")
    bwd.execute([arrays[n] for n in bwd.input_names()], trace=trace, **trace_options)
    yield "backward", trace


def cpu_breakdown(layer, x, dy, args):
    """{rank: {pass: {segment kind: ms}}}: each rank's milliseconds per segment kind in the forward and
    backward fusions, from a trace of each over args.breakdown steps (communication wait: mostly
    waiting for the other ranks). Read on rank 0, from the trace file that holds every rank's events."""
    parts = {}
    for _ in range(args.breakdown):
        for name, trace in traced_cpu_passes(layer, x, dy, args.trace_dir):
            if layer.rank != 0:
                continue
            for pid in range(Communicator.instance().size):
                ranks = parts.setdefault(pid, {"forward": {}, "backward": {}})
                for kind, ms in trace_breakdown(trace, pid=pid).items():
                    ranks[name][kind] = ranks[name].get(kind, 0.0) + ms / args.breakdown
    return parts


def print_rank_balance(parts):
    """One line: each rank's matmul and communication wait per pass. The ranks run the same GEMMs, so
    where one rank's matmul takes longer the others wait for it: the machine, not the schedule (two
    vCPUs that share a core, a noisy neighbour), which caps the speed-up below the GEMM floor's."""
    cells = []
    for pid, passes in sorted(parts.items()):
        mm = " / ".join(f"{passes[n].get('matmul', 0.0):.1f}" for n in ("forward", "backward"))
        wait = " / ".join(f"{passes[n].get('communication wait', 0.0):.1f}" for n in ("forward", "backward"))
        cells.append(f"rank {pid} matmul {mm}, waiting {wait}")
    print("# per rank, forward / backward ms: " + "; ".join(cells))


def print_host_breakdown(name, summary):
    program, kinds, slowest, details = summary
    desc = ", ".join(f"{k} {v:.3f}" for k, v in sorted(kinds.items(), key=lambda kv: -kv[1]))
    print(f"# {name} host ms launching its segments (host trace, nothing synchronized): host program "
          f"{program:.3f}; by kind: {desc}; slowest: " + ", ".join(f"{n} {ms * 1e3:.0f} us" for ms, n in slowest))
    if details:
        print(f"# {name} host steps inside the segments, self us (calls): " +
              ", ".join(f"{n} {ms * 1e3:.0f} ({c})" for ms, n, c in details))


def trace_breakdown(path, pid=None):
    """Milliseconds per segment kind in a meshfuse trace (of one rank: pid), and "communication wait":
    the time its compute lane spent in no segment between the first and the last, i.e. waiting for a
    communication (or the host). Communications themselves are not summed: a post's event lasts to the
    end of its wait, which includes the compute it ran beside (host_ir/wait_placement.h)."""
    total, lanes = {}, {}
    for ev in trace_events(path):
        if ev.get("ph") != "X" or ev.get("cat") != "compute" or (pid is not None and ev.get("pid") != pid):
            continue
        kind = ev["name"].split()[0]
        total[kind] = total.get(kind, 0.0) + ev["dur"] / 1e3
        first, last, busy = lanes.get(ev.get("pid"), (ev["ts"], ev["ts"], 0.0))
        lanes[ev.get("pid")] = (min(first, ev["ts"]), max(last, ev["ts"] + ev["dur"]), busy + ev["dur"])
    wait = sum(last - first - busy for first, last, busy in lanes.values()) / 1e3
    if wait > 0.005:
        total["communication wait"] = wait
    return total


def cuda_layer_inputs(cfg, fwd, bwd, rank):
    """Random bf16 weights and input for the layer (the full tensors, on the host), this rank's shards
    of them on its GPU (the forward's inputs), and the backward's inputs from one forward call."""
    gen = torch.Generator().manual_seed(0)
    full = {n: (torch.randn(shape, generator=gen) * 0.02).to(torch.bfloat16)
            for n, shape in cfg.parameter_shapes().items()}
    full["x"] = torch.randn(cfg.batch, cfg.sequence, cfg.hidden, generator=gen).to(torch.bfloat16)
    ins = [t.cuda() for t in tf.shard_inputs(fwd, full, rank)]
    outs = dict(zip(tf.FORWARD_OUTPUTS, fwd.execute(ins)))
    saved = dict(outs, x=ins[0], grad_out=torch.randn_like(outs["out"]), **dict(zip(tf.PARAMETERS, ins[1:])))
    return full, ins, [saved[n] for n in bwd.input_names()]


def run_cuda(args):
    comm = Communicator.instance()
    d, rank = comm.size, comm.rank
    torch.cuda.set_device(rank % torch.cuda.device_count())
    if d > 1:  # torch's Megatron allreduces: NCCL with a GPU per rank, else gloo (a functional run only)
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29534")
        torch_backend = "nccl" if torch.cuda.device_count() >= d else "gloo"
        torch.distributed.init_process_group(torch_backend, rank=rank, world_size=d)
        if torch_backend == "gloo" and rank == 0:
            print(f"# {d} ranks share {torch.cuda.device_count()} GPU(s): torch communicates through gloo and the "
                  f"ranks take turns on the GPU, so the times below check the script, they do not measure TP")
    # Attention dropout is --attention-dropout on both sides (default: --dropout, as in the GPT-3
    # layer; cuDNN draws it in-kernel on both sides by default, and --rngs meshfuse also times
    # meshfuse's Philox mask, the one the CPU draws: runtime/cuda/attention_rng.h), the residual
    # dropouts --dropout on both sides.
    cfg = tf.TransformerConfig(batch=args.batch, sequence=args.sequence, heads=args.heads, hidden=args.hidden,
                               dtype=DataType.BFloat16, dropout_p=args.dropout,
                               attention_dropout_p=args.attention_dropout)
    schedule = "tp" if d > 1 else "none"
    mesh = tf.mesh_for(schedule, d) if d > 1 else None
    fwd = tf.TransformerForward(cfg, mesh, schedule)
    bwd = tf.TransformerBackward(cfg, mesh, schedule)
    full, ins, bwd_ins = cuda_layer_inputs(cfg, fwd, bwd, rank)
    sync = torch.cuda.synchronize
    # meshfuse's two passes also under each dropout-mask width (MESHFUSE_ATTENTION_MASK), backward mask
    # order (MESHFUSE_ATTENTION_BACKWARD_MASK) and attention RNG (MESHFUSE_ATTENTION_RNG) asked for, all
    # read at each execute, in this process. The backward's inputs stay the default's forward
    # outputs: every width drops the same elements, and cuDNN's RNG does the same work whichever
    # mask the forward drew.
    variants = ([("MESHFUSE_ATTENTION_MASK", w) for w in args.mask_widths or []] +
                [("MESHFUSE_ATTENTION_BACKWARD_MASK", o) for o in args.backward_masks or []] +
                [("MESHFUSE_ATTENTION_RNG", r) for r in args.rngs or []])

    # torch's layer takes this rank's shards, as meshfuse's does (TP: the column-parallel weights and
    # biases by output features, the row-parallel weights by input features; all of them at d = 1).
    params = {n: t.detach().clone().requires_grad_(True) for n, t in zip(tf.PARAMETERS, ins[1:])}
    xt = full["x"].cuda().requires_grad_(True)
    dy = torch.randn_like(xt)

    def step(layer_fn):
        for p in params.values():
            p.grad = None
        layer_fn(xt, params, cfg, d).backward(dy)

    def no_grad(fn):
        def run():
            with torch.no_grad():
                fn()
        return run

    def under(env_name, value, fn):
        def run():
            with scoped_env(env_name, value):
                fn()
        return run

    compiled = torch.compile(torch_layer)
    for _ in range(2):  # torch.compile's graphs (inference, training forward, backward) built before timing
        no_grad(lambda: compiled(xt, params, cfg, d))()
        step(compiled)
        compiled(xt, params, cfg, d)
    # torch's forward twice: under no_grad (its inference path: no activations kept, attention
    # without the log-sum-exp), and with autograd on, as a training step runs it. meshfuse's forward
    # fusion is a training forward (it returns what the backward reads), so the table compares it
    # with the latter, and torch's backward is its step minus that, round by round. (Tables before
    # session 10 used the no_grad forward, which moved the training forward's extra work into
    # torch's "backward"; before session 19 each pass ran its iterations in a block of its own.)
    fns = {"mf fwd": lambda: fwd.execute(ins), "mf bwd": lambda: bwd.execute(bwd_ins)}
    for env_name, value in variants:
        fns[f"{env_name}={value} fwd"] = under(env_name, value, lambda: fwd.execute(ins))
        fns[f"{env_name}={value} bwd"] = under(env_name, value, lambda: bwd.execute(bwd_ins))
    fns.update({"eager inf": no_grad(lambda: torch_layer(xt, params, cfg, d)),
                "eager fwd": lambda: torch_layer(xt, params, cfg, d),
                "eager step": lambda: step(torch_layer),
                "compile inf": no_grad(lambda: compiled(xt, params, cfg, d)),
                "compile fwd": lambda: compiled(xt, params, cfg, d),
                "compile step": lambda: step(compiled)})
    t = timed_rounds(fns, sync, args.warmup, args.iters, args.order == "blocks")
    trace = os.path.join(args.trace_dir, "transformer_fwd_trace.json")
    fwd.execute(ins, trace=trace)
    fwd_parts = trace_breakdown(trace, pid=0) if rank == 0 else {}  # rank 0's segments (the file has every rank's)
    trace = os.path.join(args.trace_dir, "transformer_bwd_trace.json")
    bwd.execute(bwd_ins, trace=trace)
    bwd_parts = trace_breakdown(trace, pid=0) if rank == 0 else {}
    host = {}
    if args.host_breakdown:  # after a synchronization, so that the host's spans are its own
        for name, fd, inputs in (("forward", fwd, ins), ("backward", bwd, bwd_ins)):
            sync()
            trace = os.path.join(args.trace_dir, f"transformer_{name}_host_trace.json")
            fd.execute(inputs, trace=trace, trace_host=True)
            host[name] = host_trace_summary(trace) if rank == 0 else None
        sync()
    if args.profile or args.profile_timeline:
        # Every rank runs the profiled calls (at d > 1 they communicate); rank 0 prints.
        with open(os.devnull, "w") as devnull, contextlib.redirect_stdout(devnull if rank else sys.stdout):
            print(f"# {'pass':<10} {'wall ms':>8} {'GPU busy ms':>12}  top kernels by GPU time (torch.profiler, CUPTI)")
            for label, fn in (("mf fwd", lambda: fwd.execute(ins)), ("mf bwd", lambda: bwd.execute(bwd_ins)),
                              ("torch fwd", lambda: torch_layer(xt, params, cfg, d)),
                              ("torch step", lambda: step(torch_layer))):
                with torch.no_grad() if label == "torch fwd" else contextlib.nullcontext():
                    kernel_profile(label, fn, sync, timeline=args.profile_timeline and label.startswith("mf"))
                    host_device_split(label, fn, sync, args.iters)
            for env_name, value in variants:  # meshfuse's passes again under each variant asked for
                with scoped_env(env_name, value):
                    for label, fn in (("mf fwd", lambda: fwd.execute(ins)), ("mf bwd", lambda: bwd.execute(bwd_ins))):
                        label = f"{label} {value}"
                        kernel_profile(label, fn, sync, timeline=args.profile_timeline)
                        host_device_split(label, fn, sync, args.iters)
    if rank != 0:
        return
    print(f"# transformer layer, {torch.cuda.get_device_name()} x{d} ({schedule}), b={cfg.batch} s={cfg.sequence} "
          f"e={cfg.hidden} h={cfg.heads} bf16, causal, dropout {cfg.dropout_p}, attention dropout "
          f"{cfg.sdpa_dropout_p}")
    f_fl, b_fl = layer_flops(cfg, False) / d, layer_flops(cfg, True) / d
    print(f"{'pass':<22}{'meshfuse ms':>12}{'eager ms':>10}{'compile ms':>12}{'vs eager':>10}{'vs compile':>12}"
          f"{'mf TFLOP/s':>12}")
    med = statistics.median

    def plus(a, b):
        return [x + y for x, y in zip(a, b)]

    def torch_bwd(lib):  # the step minus the training forward, round by round
        return [st - fw for st, fw in zip(t[f"{lib} step"], t[f"{lib} fwd"])]

    for name, mf, eager, comp, flops in (("forward", t["mf fwd"], t["eager fwd"], t["compile fwd"], f_fl),
                                         ("backward", t["mf bwd"], torch_bwd("eager"), torch_bwd("compile"), b_fl),
                                         ("forward+backward", plus(t["mf fwd"], t["mf bwd"]), t["eager step"],
                                          t["compile step"], f_fl + b_fl)):
        print(f"{name:<22}{med(mf) * 1e3:>12.2f}{med(eager) * 1e3:>10.2f}{med(comp) * 1e3:>12.2f}"
              f"{round_ratio(eager, mf):>9.2f}x{round_ratio(comp, mf):>11.2f}x{flops / med(mf) / 1e12:>12.1f}")
    for env_name, value in variants:
        w_fwd, w_bwd = t[f"{env_name}={value} fwd"], t[f"{env_name}={value} bwd"]
        w_step = plus(w_fwd, w_bwd)
        print(f"# meshfuse with {env_name}={value}: forward {med(w_fwd) * 1e3:.2f} ms "
              f"({round_ratio(t['compile fwd'], w_fwd):.2f}x compile), backward {med(w_bwd) * 1e3:.2f} ms "
              f"({round_ratio(torch_bwd('compile'), w_bwd):.2f}x), forward+backward {med(w_step) * 1e3:.2f} ms "
              f"({round_ratio(t['compile step'], w_step):.2f}x)")
    print(f"# torch's forward with autograd on (above) / under no_grad: eager {med(t['eager fwd']) * 1e3:.2f} / "
          f"{med(t['eager inf']) * 1e3:.2f} ms, compile {med(t['compile fwd']) * 1e3:.2f} / "
          f"{med(t['compile inf']) * 1e3:.2f} ms; ratios are medians over {args.iters} rounds of one call each"
          f" ({'each library in a block of its own' if args.order == 'blocks' else 'the libraries alternating'})")
    for name, parts in (("forward", fwd_parts), ("backward", bwd_parts)):
        total = sum(parts.values())
        desc = ", ".join(f"{k} {v:.2f} ms ({v / total:.0%})" for k, v in sorted(parts.items(), key=lambda kv: -kv[1]))
        print(f"# {name} by segment kind (synchronized trace): {desc}")
    for name, summary in host.items():
        print_host_breakdown(name, summary)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--sequence", type=int, default=512)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--dropout", type=float, default=0.1)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--iters", type=positive_int, default=5)
    ap.add_argument("--trace-dir", default=os.environ.get("OUT", "/tmp"))
    ap.add_argument("--attention-dropout", type=float, default=None,
                    help="dropout inside attention, both sides (default: --dropout)")
    ap.add_argument("--backend", choices=["auto", "mpi", "gloo", "ucc"], default="auto",
                    help="CPU: meshfuse's communicator backend (torch's side always runs gloo)")
    ap.add_argument("--breakdown", type=int, default=0, metavar="STEPS",
                    help="CPU: also trace STEPS meshfuse steps and print rank 0's time per segment kind")
    ap.add_argument("--order", choices=["alternate", "blocks"], default="alternate",
                    help="alternate (default): the libraries' calls take turns, round by round; blocks: each "
                         "library's calls back to back in a block of its own (timed_rounds says when to use it)")
    ap.add_argument("--host-breakdown", action="store_true",
                    help="also trace one call of each pass with trace_host=True and print the host's time to "
                         "launch its segments, by kind and the slowest (where a host-bound pass goes)")
    ap.add_argument("--mask-widths", nargs="+", default=None, choices=["narrow", "exact"],
                    help="CUDA: also time meshfuse under each MESHFUSE_ATTENTION_MASK width")
    ap.add_argument("--backward-masks", nargs="+", default=None, choices=["key_major", "query_major"],
                    help="CUDA: also time meshfuse under each MESHFUSE_ATTENTION_BACKWARD_MASK order (how the "
                         "backward's dropout mask lies in memory for cuDNN)")
    ap.add_argument("--rngs", nargs="+", default=None, choices=["meshfuse", "cudnn"],
                    help="CUDA: also time meshfuse under each MESHFUSE_ATTENTION_RNG (cudnn, the default: cuDNN's "
                         "in-kernel dropout, a mask the CPU cannot draw; meshfuse: the CPU's Philox mask)")
    ap.add_argument("--profile", action="store_true",
                    help="CUDA: also profile one call of each pass (GPU busy time and top kernels)")
    ap.add_argument("--profile-timeline", action="store_true",
                    help="CUDA: --profile, and list every kernel of meshfuse's two passes in the order they ran")
    args = ap.parse_args()
    if args.device == "cpu":
        run_cpu(args)
    else:
        run_cuda(args)


if __name__ == "__main__":
    main()
