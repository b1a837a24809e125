"""Fused attention with heads (or batch) sharded over all ranks: each rank computes its heads with
no communication in the host program, and the numbers (dropout included) are those of one device."""
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir))
from attention_reference import attention_grad_reference, attention_reference, dropout_keep  # noqa: E402
from meshfuse import FusionDefinition, ParallelType  # noqa: E402
from meshfuse.multidevice import Communicator, DeviceMesh, shard_tensor  # noqa: E402

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
