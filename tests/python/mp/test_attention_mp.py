"""Fused attention with heads (or batch) sharded over all ranks: each rank computes its heads with
no communication in the host program, and the numbers (dropout included) are those of one device."""
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir))
from attention_reference import attention_grad_reference, attention_reference, dropout_keep  # noqa: E402
from attention_fusions import forward_and_backward  # noqa: E402
from meshfuse import DataType, FusionDefinition, ParallelType  # noqa: E402
from meshfuse.multidevice import Communicator, DeviceMesh, shard_tensor  # noqa: E402
from torch_gpu import torch_cuda  # noqa: E402

COMMUNICATIONS = ("Allgather", "Allreduce", "ReduceScatter", "AllToAll", "Broadcast", "Gather", "Scatter",
                  "Reduce", "SendRecv")


@pytest.mark.parametrize("axis", [1, 0], ids=["heads", "batch"])
@pytest.mark.parametrize("dropout_p", [0.0, 0.2])
def test_sharded_attention_is_local(axis, dropout_p):
    comm = Communicator.instance()
    n = comm.size
    mesh = DeviceMesh(range(n))
    b, h, sq, skv, d = (2 * n, 3, 33, 45, 16) if axis == 0 else (2, 2 * n, 33, 45, 16)
    rng = np.random.default_rng(7)
    q, k, v = (rng.standard_normal(s).astype(np.float32) for s in ([b, h, sq, d], [b, h, skv, d], [b, h, skv, d]))
    go = rng.standard_normal([b, h, sq, d]).astype(np.float32)
    with FusionDefinition() as fd:
        tq, tk, tv, tg = (fd.define_tensor(list(a.shape)) for a in (q, k, v, go))
        out, lse, seed, offset = fd.ops.sdpfa_fwd(tq, tk, tv, dropout_p=dropout_p, is_causal=True)
        grads = fd.ops.sdpfa_bwd(tg, tq, tk, tv, out, lse, dropout_p, True, seed, offset)
        for t in (out, seed, offset, *grads):
            fd.add_output(t)
        for t in (tq, tk, tv, tg, out, *grads):
            t.set_device_mesh(mesh)
            t.outer_split(axis, n)
            t.axis(axis).parallelize(ParallelType.mesh_x)
        for t in (seed, offset):
            t.set_device_mesh(mesh)
    args = [shard_tensor(a, t, comm.rank) for a, t in zip((q, k, v, go), (tq, tk, tv, tg))]
    res = fd.execute(args)
    host_ir = fd.host_ir()
    assert not any(c in host_ir for c in COMMUNICATIONS), host_ir
    keep = dropout_keep([b, h, sq, skv], res[1], res[2], dropout_p) if dropout_p > 0 else None
    ref = attention_reference(q, k, v, True, keep=keep, p=dropout_p)[0]
    ref_grads = attention_grad_reference(q, k, v, go, True, keep=keep, p=dropout_p)
    np.testing.assert_allclose(res[0], shard_tensor(ref, out, comm.rank), rtol=1e-4, atol=2e-5)
    for got, want, t in zip(res[3:], ref_grads, grads):
        np.testing.assert_allclose(got, shard_tensor(want, t, comm.rank), rtol=1e-3, atol=1e-4)


def _mask_through_dv(dv, sq):
    """cuDNN's keep mask [b, h, s_q, s_kv] read from dV of a backward given dO = identity on its first
    s_q columns: dV[j, i] = (P * Z / (1 - p))[i, j]."""
    return dv.double().cpu().numpy()[..., :sq].swapaxes(-1, -2) > 0


@pytest.mark.skipif(torch_cuda() is None, reason="needs torch with a CUDA GPU (and meshfuse built with cuDNN)")
def test_cudnn_rng_gives_each_head_shard_a_mask_of_its_own(monkeypatch):
    """MESHFUSE_ATTENTION_RNG=cudnn on heads sharded over every rank (attention_rng.h): each shard's
    forward and backward drop the same elements (out, dQ and dK match float64 with the mask read back
    through dV), and every shard but the first draws with a seed of its own, so its mask is not the one
    the op's own seed gives at the same local shape (which the first shard's is)."""
    torch = torch_cuda()
    monkeypatch.setenv("MESHFUSE_ATTENTION_RNG", "cudnn")
    comm = Communicator.instance()
    n, rank = comm.size, comm.rank
    mesh = DeviceMesh(range(n))
    b, h, sq, skv, d, p = 1, 2 * n, 64, 80, 64, 0.2
    bf16 = DataType.BFloat16
    rng = np.random.default_rng(31)
    q, k, v = (rng.standard_normal(s).astype(np.float32) * 0.5 for s in ([b, h, sq, d], [b, h, skv, d], [b, h, skv, d]))
    eye = np.zeros([b, h, sq, d], dtype=np.float32)
    eye[..., np.arange(sq), np.arange(sq)] = 1
    with FusionDefinition() as fd:
        tq, tk, tv, tg = (fd.define_tensor(list(a.shape), dtype=bf16) for a in (q, k, v, eye))
        out, lse, seed, offset = fd.ops.sdpfa_fwd(tq, tk, tv, dropout_p=p, is_causal=False)
        grads = fd.ops.sdpfa_bwd(tg, tq, tk, tv, out, lse, p, False, seed, offset)
        for t in (out, lse, seed, offset, *grads):
            fd.add_output(t)
        for t in (tq, tk, tv, tg, out, lse, *grads):
            t.set_device_mesh(mesh)
            t.outer_split(1, n)
            t.axis(1).parallelize(ParallelType.mesh_x)
        for t in (seed, offset):
            t.set_device_mesh(mesh)

    def local(a, t):
        return torch.from_numpy(shard_tensor(a, t, rank)).to(torch.bfloat16).cuda()

    args = [local(a, t) for a, t in zip((q, k, v, eye), (tq, tk, tv, tg))]
    out_, lse_, seed_, offset_, dq, dk, dv = fd.execute(args)
    keep = _mask_through_dv(dv, sq)
    kept = keep.mean()
    assert abs(kept - (1 - p)) < 0.03, f"rank {rank}: {kept:.3f} of the elements kept at p = {p}"
    lq, lk, lv, lg = (a.double().cpu().numpy() for a in args)
    ref_out = attention_reference(lq, lk, lv, False, keep=keep, p=p)[0]
    np.testing.assert_allclose(out_.double().cpu().numpy(), ref_out, rtol=2e-2, atol=2e-2)
    for name, got, want in zip("qk", (dq, dk), attention_grad_reference(lq, lk, lv, lg, False, keep=keep, p=p)[:2]):
        err = np.abs(got.double().cpu().numpy() - want).max() / max(1.0, np.abs(want).max())
        assert err < 1.5e-2, f"rank {rank} grad_{name}: max error {err:.3g} of the largest gradient"
    # The op's own seed at this rank's local shape, through an unsharded backward.
    _, whole = forward_and_backward(b, h // n, sq, skv, d, p, False)
    own = _mask_through_dv(whole.execute([args[3], *args[:3], out_, lse_, seed_, offset_])[2], sq)
    if rank == 0:
        np.testing.assert_array_equal(keep, own)
    else:
        assert (keep != own).mean() > 0.05, f"rank {rank} drew the op's own mask"
