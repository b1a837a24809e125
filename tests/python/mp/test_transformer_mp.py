"""The transformer layer under mpirun -np 2 and -np 4 (scripts/test): for each schedule (TP, SP,
DP×TP) and every CPU backend, the forward outputs and every gradient on every rank equal the
float64 numpy layer's (tests/python/transformer_reference.py) on the global arrays, computed with
the dropout masks the forward returns; the host programs post exactly the communications the
schedule implies; bad schedules fail at definition on every rank."""
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir))

import meshfuse  # noqa: E402
import transformer_reference as ref  # noqa: E402
from attention_reference import dropout_keep  # noqa: E402
from host_ir_lines import communications, launched_while_in_flight  # noqa: E402
from meshfuse import CommunicatorBackend, DataType, FusionDefinition, ParallelType  # noqa: E402
from meshfuse.models import (BACKWARD_OUTPUTS, FORWARD_OUTPUTS, PARAMETERS, TransformerBackward,  # noqa: E402
                             TransformerConfig, TransformerForward, mesh_for, output_shardings,
                             shard_inputs)
from meshfuse.multidevice import Communicator, DeviceMesh, shard_tensor  # noqa: E402

COMM = Communicator.instance()
RANK, WORLD = COMM.rank, COMM.size
BACKENDS = [b for b in (CommunicatorBackend.mpi, CommunicatorBackend.gloo, CommunicatorBackend.ucc)
            if b in meshfuse.available_backends()]
SCHEDULES = ["tp", "sp"] + (["dp_tp"] if WORLD % 2 == 0 else [])


def config(schedule, batch=2):
    tp = WORLD // 2 if schedule == "dp_tp" else WORLD
    return TransformerConfig(batch=batch, sequence=4 * WORLD, heads=2 * tp, hidden=8 * tp, dtype=DataType.Float,
                             dropout_p=0.2, attention_dropout_p=0.0)


def gather(local, tv, mesh, sharding, dtype=None):
    """The global array of an output sharded as `sharding` [(axis, ParallelType)] on `mesh`, by a
    meshfuse allgather program on host arrays of `dtype` (default: the output's); the local shard's
    shape is checked on the way."""
    if not sharding:
        assert list(local.shape) == list(tv.shape), f"{tv.name}: replicated output of shape {local.shape}"
        return local
    expected = list(tv.shape)
    for axis, parallel in sharding:
        expected[axis] //= mesh.size_along(parallel)
    assert list(local.shape) == expected, f"{tv.name}: local shape {list(local.shape)}, expected {expected}"
    with FusionDefinition() as fd:
        x = fd.define_tensor(list(tv.shape), dtype or tv.dtype)
        y = fd.ops.set(x)
        fd.add_output(y)
        x.set_device_mesh(mesh)
        y.set_device_mesh(mesh)
        for axis, parallel in sorted(sharding, reverse=True):  # a split shifts the loop axes after it
            x.outer_split(axis, mesh.size_along(parallel))
            x.axis(axis).parallelize(parallel)
    return fd.execute([local])[0]


def global_inputs(cfg):
    rng = np.random.default_rng(11)
    arrays = {n: (rng.standard_normal(s) * (0.3 if len(s) > 1 else 1.0)).astype(np.float32)
              for n, s in cfg.parameter_shapes().items()}
    arrays["x"] = rng.standard_normal((cfg.batch, cfg.sequence, cfg.hidden)).astype(np.float32)
    arrays["grad_out"] = rng.standard_normal(arrays["x"].shape).astype(np.float32)
    return arrays


# Batch 1 as well for SP: then a [b, s, e] -> [b*s, e] reshape keeps the sequence sharding, and
# propagation once chose an all-to-all and a weight-sized allreduce for a weight gradient there.
@pytest.mark.parametrize("backend", BACKENDS, ids=lambda b: b.name)
@pytest.mark.parametrize("schedule,batch", [(s, 2) for s in SCHEDULES] + [("sp", 1)])
def test_layer_matches_reference_on_every_rank(schedule, batch, backend):
    cfg = config(schedule, batch)
    mesh = mesh_for(schedule, WORLD)
    fwd = TransformerForward(cfg, mesh, schedule, backend_type=backend)
    bwd = TransformerBackward(cfg, mesh, schedule, backend_type=backend)
    arrays = global_inputs(cfg)
    outs = dict(zip(FORWARD_OUTPUTS, fwd.execute(shard_inputs(fwd, arrays, RANK))))
    out_sh, grad_sh = output_shardings(schedule), output_shardings(schedule, backward=True)
    # The models' table of where the outputs live is what execute reports (fd.output_shardings()).
    assert placements(fwd, FORWARD_OUTPUTS) == {n: set(v) for n, v in out_sh.items()}
    full = {n: gather(outs[n], fwd.tensors[n], mesh, out_sh.get(n)) for n in FORWARD_OUTPUTS
            if n not in ("sdpa_seed", "sdpa_offset")}
    m1, m2 = full["attn_dropout_mask"], full["mlp_dropout_mask"]
    p64 = {n: arrays[n].astype(np.float64) for n in PARAMETERS}
    r = ref.forward(arrays["x"].astype(np.float64), p64, m1, m2, cfg)
    for name in ("qkv", "sdpa_out", "attn_out", "fc1_out", "gelu_out", "out"):
        np.testing.assert_allclose(full[name], r[name], rtol=1e-4, atol=1e-4, err_msg=f"rank {RANK}: {name}")

    # The backward takes the forward's outputs as they are (its schedule shards them as the forward
    # produced them) and this rank's shards of the global x, parameters and output gradient.
    local = {n: outs[n] if n in outs else shard_tensor(arrays[n], bwd.tensors[n], RANK) for n in bwd.input_names()}
    grads = dict(zip(BACKWARD_OUTPUTS, bwd.execute([local[n] for n in bwd.input_names()])))
    assert placements(bwd, BACKWARD_OUTPUTS) == {n: set(v) for n, v in grad_sh.items()}
    g = ref.backward(arrays["grad_out"].astype(np.float64), arrays["x"].astype(np.float64), p64, m1, m2, cfg)
    for name in BACKWARD_OUTPUTS:
        got = gather(grads[name], bwd.tensors[name], mesh, grad_sh.get(name))
        np.testing.assert_allclose(got, g[name], rtol=1e-3, atol=1e-3 * np.abs(g[name]).max(),
                                   err_msg=f"rank {RANK}: {name}")

    fwd_comms, bwd_comms = communications(fwd), communications(bwd)
    if schedule == "tp":
        assert fwd_comms == ["Allreduce"] * 2, fwd.host_ir()
        assert bwd_comms == ["Allreduce"] * 2, bwd.host_ir()
        # Each input gradient's allreduce runs beside the weight-gradient GEMM that follows it.
        assert all("matmul" in kinds for kinds in launched_while_in_flight(bwd)), bwd.host_ir()
    elif schedule == "sp":
        assert fwd_comms == ["Allgather", "ReduceScatter"] * 2, fwd.host_ir()
        # Megatron's: one gather each of the gradients entering the row-parallel linears and of
        # the LayerNorm outputs the column-parallel weight gradients need, a reduce-scatter of each
        # input gradient that contracts the sharded features, and the LayerNorm weight and bias
        # gradients summed over the sequence shards.
        assert sorted(bwd_comms) == ["Allgather"] * 4 + ["Allreduce"] * 4 + ["ReduceScatter"] * 2, bwd.host_ir()
    else:  # dp_tp: TP's allreduces over the tp teams; the backward adds one per parameter over dp
        tp_team, dp_team = mesh.team(RANK, ParallelType.mesh_x), mesh.team(RANK, ParallelType.mesh_y)
        # A tp team of one rank (2 ranks as [dp=2, tp=1]) posts nothing: its allreduce is the identity.
        tp_comms = [tp_team] * 2 if len(tp_team) > 1 else []
        assert teams(fwd) == tp_comms, fwd.host_ir()
        assert sorted(map(str, teams(bwd))) == sorted(map(str, tp_comms + [dp_team] * len(PARAMETERS))), \
            bwd.host_ir()
        tp_flights = [kinds for kinds, team in zip(launched_while_in_flight(bwd), teams(bwd)) if team == tp_team]
        assert all("matmul" in kinds for kinds in tp_flights), bwd.host_ir()


def placements(fd, names):
    """{output name: {(sharded axis, mesh ParallelType), ...}} of fd's last execution, sharded outputs only."""
    out = {}
    for name, tv in zip(names, fd.output_shardings()):
        sharded = {(tv.sharded_axis(p), p) for p in (ParallelType.mesh_x, ParallelType.mesh_y)
                   if tv.sharded_axis(p) >= 0}
        if sharded:
            out[name] = sharded
    return out


def teams(fd):
    """The team of each communication in fd's last host program."""
    out = []
    for line in fd.host_ir().splitlines():
        if "Post" in line.split()[0]:
            team = line[line.index("team=[") + 6:]
            out.append([int(r) for r in team[:team.index("]")].split(",")])
    return out


def test_heads_not_divisible_by_the_mesh_fail_at_definition_on_every_rank():
    cfg = TransformerConfig(batch=1, sequence=4, heads=WORLD + 1, hidden=8 * (WORLD + 1))
    with pytest.raises(ValueError, match="heads do not divide"):
        TransformerForward(cfg, mesh_for("tp", WORLD), "tp")._ensure_defined()


@pytest.mark.skipif(WORLD < 2, reason="a sub-mesh leaves some of the world's ranks out")
def test_backward_takes_the_forward_outputs_on_a_sub_mesh():
    # The layer on the first half of the world (rank 0 alone at 2 ranks); the ranks outside the
    # mesh get None for every forward output, sdpa_seed and sdpa_offset included, and pass them to
    # the backward as they are: its schedule puts every input on the mesh. With attention dropout,
    # so that the gradients depend on the seed and offset reaching the backward.
    members = list(range(WORLD // 2))
    mesh = DeviceMesh(members)
    cfg = TransformerConfig(batch=2, sequence=4, heads=2 * len(members), hidden=8 * len(members),
                            dtype=DataType.Float, dropout_p=0.2, attention_dropout_p=0.3)
    fwd, bwd = TransformerForward(cfg, mesh, "tp"), TransformerBackward(cfg, mesh, "tp")
    arrays = global_inputs(cfg)
    outs = dict(zip(FORWARD_OUTPUTS, fwd.execute(shard_inputs(fwd, arrays, RANK))))
    local = {n: outs[n] if n in outs else shard_tensor(arrays[n], bwd.tensors[n], RANK) for n in bwd.input_names()}
    grads = dict(zip(BACKWARD_OUTPUTS, bwd.execute([local[n] for n in bwd.input_names()])))
    if RANK not in members:
        assert all(v is None for v in outs.values()), outs
        assert all(v is None for v in grads.values()), grads
        return
    # TP's dropout masks and Philox pair are replicated on the mesh: the global ones.
    m1, m2 = outs["attn_dropout_mask"], outs["mlp_dropout_mask"]
    akeep = dropout_keep([cfg.batch, cfg.heads, cfg.sequence, cfg.sequence], outs["sdpa_seed"], outs["sdpa_offset"],
                         cfg.sdpa_dropout_p)
    assert 0.4 < akeep.mean() < 0.9
    p64 = {n: arrays[n].astype(np.float64) for n in PARAMETERS}
    x64 = arrays["x"].astype(np.float64)
    r = ref.forward(x64, p64, m1, m2, cfg, akeep)
    np.testing.assert_allclose(outs["out"], r["out"], rtol=1e-4, atol=1e-4, err_msg=f"rank {RANK}: out")
    g = ref.backward(arrays["grad_out"].astype(np.float64), x64, p64, m1, m2, cfg, akeep)
    for name in BACKWARD_OUTPUTS:
        want = shard_tensor(g[name], bwd.tensors[name[len("grad_"):]], RANK)
        np.testing.assert_allclose(grads[name], want, rtol=1e-3, atol=1e-3 * np.abs(g[name]).max(),
                                   err_msg=f"rank {RANK}: {name}")


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_a_backward_without_frozen_gradients_computes_and_reduces_only_the_rest(schedule):
    # Frozen parameters (fine-tuning) need no gradient: a backward whose outputs leave them out
    # posts no allreduce for them over dp and runs none of their GEMMs, and the gradients it does
    # compute equal the full backward's, on every rank.
    cfg = config(schedule)
    mesh = mesh_for(schedule, WORLD)
    frozen = ("grad_ln0_weight", "grad_ln0_bias", "grad_fc1_weight", "grad_fc1_bias")
    wanted = tuple(n for n in BACKWARD_OUTPUTS if n not in frozen)
    fwd = TransformerForward(cfg, mesh, schedule)
    full, part = TransformerBackward(cfg, mesh, schedule), TransformerBackward(cfg, mesh, schedule, outputs=wanted)
    assert part.output_names() == wanted
    arrays = global_inputs(cfg)
    outs = dict(zip(FORWARD_OUTPUTS, fwd.execute(shard_inputs(fwd, arrays, RANK))))
    local = {n: outs[n] if n in outs else shard_tensor(arrays[n], full.tensors[n], RANK)
             for n in full.input_names()}
    every = dict(zip(BACKWARD_OUTPUTS, full.execute([local[n] for n in full.input_names()])))
    some = dict(zip(wanted, part.execute([local[n] for n in part.input_names()])))
    for name in wanted:
        np.testing.assert_array_equal(some[name], every[name], err_msg=f"rank {RANK}: {name}")

    def count(fd, kind):
        return sum(1 for line in fd.host_ir().splitlines() if kind in line.split("(")[0])
    assert count(part, "matmul") == count(full, "matmul") - 1, part.host_ir()  # fc1's weight gradient
    if schedule == "dp_tp":  # one allreduce over dp per parameter gradient computed
        dp_team = mesh.team(RANK, ParallelType.mesh_y)
        assert teams(part).count(dp_team) == teams(full).count(dp_team) - len(frozen), part.host_ir()
    elif schedule == "sp":
        # ln0's weight and bias gradients are no longer summed over the sequence shards, and ln1's
        # output is no longer gathered for fc1's weight gradient.
        expected = sorted(communications(full))
        for kind in ("Allreduce", "Allreduce", "Allgather"):
            expected.remove(kind)
        assert sorted(communications(part)) == expected, part.host_ir()
    else:  # tp: the input gradients' allreduces remain, as every gradient still needs them
        assert communications(part) == communications(full), part.host_ir()
    with pytest.raises(ValueError, match="distinct names"):
        TransformerBackward(cfg, mesh, schedule, outputs=("grad_bogus",))
