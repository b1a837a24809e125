"""Fused attention (fd.ops.sdpfa_fwd / sdpfa_bwd) against float64 numpy, by finite differences,
with dropout, on bad inputs, for peak memory, and (where a GPU and cuDNN are present) on CUDA."""
import os
import subprocess
import sys

import numpy as np
import pytest

from attention_reference import attention_grad_reference, attention_reference, dropout_keep
from conftest import torch_cuda_available
from meshfuse import DataType, FusionDefinition, ParallelType
from meshfuse.multidevice import DeviceMesh

F32, F64, BF16 = DataType.Float, DataType.Double, DataType.BFloat16


def qkv(rng, b, h, sq, skv, d, dv=None):
    dv = d if dv is None else dv
    return [rng.standard_normal(s).astype(np.float32) for s in ([b, h, sq, d], [b, h, skv, d], [b, h, skv, dv])]


def forward_fusion(shapes, dtype=F32, compute=None, **kw):
    """sdpfa_fwd on inputs of `dtype`, computed in `compute` (a cast in the definition) when given."""
    with FusionDefinition() as fd:
        ins = [fd.define_tensor(list(s), dtype=dtype) for s in shapes]
        ops = [fd.ops.cast(t, compute) for t in ins] if compute else ins
        out, lse, seed, offset = fd.ops.sdpfa_fwd(*ops, **kw)
        fd.add_output(fd.ops.cast(out, dtype) if compute else out)
        for t in (lse, seed, offset):
            fd.add_output(t)
    return fd


def backward_fusion(shapes, dtype=F32, compute=None, dropout_p=0.0, is_causal=False, scale=None):
    """Forward then backward in one definition: inputs q, k, v, grad_out; outputs out, lse, seed,
    offset, grad_q, grad_k, grad_v."""
    with FusionDefinition() as fd:
        ins = [fd.define_tensor(list(s), dtype=dtype) for s in shapes]
        ops = [fd.ops.cast(t, compute) for t in ins] if compute else ins
        q, k, v, go = ops
        out, lse, seed, offset = fd.ops.sdpfa_fwd(q, k, v, dropout_p=dropout_p, is_causal=is_causal, scale=scale)
        grads = fd.ops.sdpfa_bwd(go, q, k, v, out, lse, dropout_p, is_causal, seed, offset, scale=scale)
        for t in (out, lse, seed, offset, *grads):
            fd.add_output(fd.ops.cast(t, dtype) if compute and t.dtype == compute else t)
    return fd


def heads_of_projection(fd, x):
    """q, k, v of [b, h, s, d] as permuted slices of a fused [b, s, h, 3d] projection x."""
    b, s, h, d3 = x.shape
    d = d3 // 3
    return [fd.ops.permute(fd.ops.slice(x, [0, 0, 0, i * d], [b, s, h, (i + 1) * d]), [0, 2, 1, 3]) for i in range(3)]


SHAPES = [  # (b, h, s_q, s_kv, d)
    (2, 3, 17, 17, 32),
    (1, 2, 1, 1, 64),
    (1, 2, 1, 33, 64),
    (1, 1, 1000, 1000, 64),
    (2, 2, 130, 70, 128),
    (1, 2, 70, 300, 64),
]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_forward_matches_float64(rng, shape, causal):
    b, h, sq, skv, d = shape
    q, k, v = qkv(rng, b, h, sq, skv, d)
    out, lse, seed, offset = forward_fusion([q.shape, k.shape, v.shape], is_causal=causal).execute([q, k, v])
    ref_out, ref_lse, _ = attention_reference(q, k, v, causal)
    np.testing.assert_allclose(out, ref_out, rtol=1e-4, atol=2e-5)
    np.testing.assert_allclose(lse, ref_lse, rtol=1e-5, atol=2e-5)
    assert lse.dtype == np.float32 and lse.shape == (b, h, sq)
    assert np.asarray(seed).shape == () and np.asarray(seed).dtype == np.int64


def test_forward_scale_and_value_head_dim(rng):
    q, k, v = qkv(rng, 1, 2, 20, 24, 32, dv=16)
    out, lse, _, _ = forward_fusion([q.shape, k.shape, v.shape], scale=0.3).execute([q, k, v])
    ref_out, ref_lse, _ = attention_reference(q, k, v, scale=0.3)
    assert out.shape == (1, 2, 20, 16)
    np.testing.assert_allclose(out, ref_out, rtol=1e-4, atol=2e-5)
    np.testing.assert_allclose(lse, ref_lse, rtol=1e-5, atol=2e-5)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", [(1, 2, 17, 17, 32), (2, 1, 130, 70, 64), (1, 1, 1000, 1000, 64), (1, 2, 33, 150, 128)],
                         ids=lambda s: "x".join(map(str, s)))
def test_backward_matches_float64(rng, shape, causal):
    b, h, sq, skv, d = shape
    q, k, v = qkv(rng, b, h, sq, skv, d)
    go = rng.standard_normal([b, h, sq, d]).astype(np.float32)
    res = backward_fusion([q.shape, k.shape, v.shape, go.shape], is_causal=causal).execute([q, k, v, go])
    for got, want in zip(res[4:], attention_grad_reference(q, k, v, go, causal)):
        np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4 * max(1.0, np.abs(want).max()))


@pytest.mark.parametrize("causal", [False, True])
def test_bfloat16_through_float(rng, causal):
    # bf16 operands (cast in the definition, so no torch is needed), computed in fp32 on CPU.
    q, k, v = qkv(rng, 1, 2, 65, 77, 64)
    go = rng.standard_normal(q.shape).astype(np.float32)
    res = backward_fusion([q.shape, k.shape, v.shape, go.shape], compute=BF16, is_causal=causal).execute(
        [q, k, v, go])
    rq, rk, rv, rgo = (x.astype(np.float64) for x in (q, k, v, go))  # bf16 rounding is within the tolerance
    ref_out, _, _ = attention_reference(rq, rk, rv, causal)
    np.testing.assert_allclose(res[0], ref_out, rtol=3e-2, atol=3e-2)
    for got, want in zip(res[4:], attention_grad_reference(rq, rk, rv, rgo, causal)):
        np.testing.assert_allclose(got, want, rtol=5e-2, atol=5e-2 * max(1.0, np.abs(want).max()))


@pytest.mark.parametrize("dtype", [F32, F64, BF16], ids=lambda d: d.name)
@pytest.mark.parametrize("causal", [False, True])
def test_permuted_slices_of_one_projection(rng, dtype, causal):
    # As the transformer layer feeds them: q, k, v are permuted slices of one [b, s, h, 3d] tensor
    # and grad_out a permuted [b, s, h, d] one (rows of d contiguous elements, 3hd and hd apart),
    # which the kernels read in place; BFloat16 is copied to float first. Odd s and d.
    b, s, h, d = 2, 37, 3, 24
    fused = rng.standard_normal([b, s, h, 3 * d]).astype(np.float32)
    go_bshd = rng.standard_normal([b, s, h, d]).astype(np.float32)
    with FusionDefinition() as fd:
        x = fd.define_tensor([b, s, h, 3 * d], dtype=dtype)
        g = fd.define_tensor([b, s, h, d], dtype=dtype)
        q, k, v = heads_of_projection(fd, x)
        go = fd.ops.permute(g, [0, 2, 1, 3])
        out, lse, seed, offset = fd.ops.sdpfa_fwd(q, k, v, is_causal=causal)
        for t in (out, *fd.ops.sdpfa_bwd(go, q, k, v, out, lse, 0.0, causal, seed, offset)):
            fd.add_output(t)
    as_dtype = {F32: fused, F64: fused.astype(np.float64), BF16: None}[dtype]
    if dtype == BF16:  # no numpy bfloat16: bf16 values held in float32, defined through a cast
        pytest.importorskip("torch")
        import torch
        args = [torch.from_numpy(a).to(torch.bfloat16) for a in (fused, go_bshd)]
        res = [t.float().numpy() for t in fd.execute(args)]
        fused, go_bshd = (a.float().numpy() for a in args)
        tol = 3e-2
    else:
        res = fd.execute([as_dtype, go_bshd.astype(as_dtype.dtype)])
        tol = 1e-4
    heads = fused.astype(np.float64).transpose(0, 2, 1, 3)
    rq, rk, rv = heads[..., :d], heads[..., d:2 * d], heads[..., 2 * d:]
    rgo = go_bshd.astype(np.float64).transpose(0, 2, 1, 3)
    ref_out, _, _ = attention_reference(rq, rk, rv, causal)
    np.testing.assert_allclose(res[0], ref_out, rtol=tol, atol=tol)
    for got, want in zip(res[1:], attention_grad_reference(rq, rk, rv, rgo, causal)):
        np.testing.assert_allclose(got, want, rtol=10 * tol, atol=10 * tol * max(1.0, np.abs(want).max()))


@pytest.mark.parametrize("causal", [False, True])
def test_cpu_heads_of_one_projection_merge_and_concatenate_as_views(causal):
    """On the CPU, as on CUDA: q, k, v as heads of one [b, s, h, 3d] projection are read in place;
    o is written heads-inner, so merging its heads is a view; dq, dk, dv are written at q's, k's and
    v's places in one buffer, so their cat (the projection's gradient) is a view too. Values against
    float64 with dropout on."""
    b, s, h, d, p = 2, 37, 3, 24, 0.1
    rng = np.random.default_rng(5)
    fused = rng.standard_normal([b, s, h, 3 * d]).astype(np.float32)
    go = rng.standard_normal([b, h, s, d]).astype(np.float32)
    with FusionDefinition() as fd:
        x = fd.define_tensor([b, s, h, 3 * d])
        g = fd.define_tensor([b, h, s, d])
        q, k, v = heads_of_projection(fd, x)
        out, lse, seed, offset = fd.ops.sdpfa_fwd(q, k, v, dropout_p=p, is_causal=causal)
        grads = fd.ops.sdpfa_bwd(g, q, k, v, out, lse, p, causal, seed, offset)
        for t in (seed, offset, out, fd.ops.reshape(fd.ops.permute(out, [0, 2, 1, 3]), [b, s, h * d]), *grads):
            fd.add_output(t)
        fd.add_output(fd.ops.cat([fd.ops.permute(t, [0, 2, 1, 3]) for t in grads], 3))
    seed_t, offset_t, o, merged, dq, dk, dv, dqkv = fd.execute([fused, go])
    address = lambda a: a.__array_interface__["data"][0]  # noqa: E731
    assert o.strides == (4 * s * h * d, 4 * d, 4 * h * d, 4), o.strides
    assert address(merged) == address(o) and merged.flags["C_CONTIGUOUS"]
    assert address(dqkv) == address(dq) and address(dk) == address(dq) + 4 * d and dqkv.flags["C_CONTIGUOUS"]
    heads = fused.astype(np.float64).transpose(0, 2, 1, 3)
    rq, rk, rv = heads[..., :d], heads[..., d:2 * d], heads[..., 2 * d:]
    keep = dropout_keep([b, h, s, s], seed_t, offset_t, p)
    ref_out, _, _ = attention_reference(rq, rk, rv, causal, keep=keep, p=p)
    np.testing.assert_allclose(merged, ref_out.transpose(0, 2, 1, 3).reshape(b, s, h * d), rtol=1e-4, atol=1e-4)
    want = attention_grad_reference(rq, rk, rv, go.astype(np.float64), causal, keep=keep, p=p)
    for i, (got, ref) in enumerate(zip((dq, dk, dv), want)):
        np.testing.assert_allclose(got, ref, rtol=1e-3, atol=1e-3 * max(1.0, np.abs(ref).max()))
        np.testing.assert_array_equal(dqkv[..., i * d:(i + 1) * d], got.transpose(0, 2, 1, 3))


@pytest.mark.parametrize("causal", [False, True])
def test_backward_central_finite_differences_float64(rng, causal):
    b, h, sq, skv, d = 1, 2, 5, 7, 4
    q, k, v = (x.astype(np.float64) for x in qkv(rng, b, h, sq, skv, d))
    go = rng.standard_normal([b, h, sq, d])
    fwd = forward_fusion([q.shape, k.shape, v.shape], dtype=F64, is_causal=causal)
    bwd = backward_fusion([q.shape, k.shape, v.shape, go.shape], dtype=F64, is_causal=causal)
    grads = bwd.execute([q, k, v, go])[4:]

    def loss(args):
        return float((np.asarray(fwd.execute(args)[0]) * go).sum())

    eps = 1e-6
    for which, grad in enumerate(grads):
        args = [q.copy(), k.copy(), v.copy()]
        numeric = np.zeros_like(args[which])
        for idx in np.ndindex(*args[which].shape):
            orig = args[which][idx]
            args[which][idx] = orig + eps
            up = loss(args)
            args[which][idx] = orig - eps
            down = loss(args)
            args[which][idx] = orig
            numeric[idx] = (up - down) / (2 * eps)
        np.testing.assert_allclose(grad, numeric, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("dtype", [F32, F64], ids=["float", "double"])
@pytest.mark.parametrize("shape", [(2, 2, 40, 70, 32), (1, 3, 9, 17, 8), (1, 1, 12, 1000, 16), (1, 2, 5, 1001, 8)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("causal", [False, True])
def test_dropout_mask_is_the_one_the_seed_implies(rng, causal, shape, dtype):
    # The mask is the numpy Philox's (attention_reference.dropout_keep): element g's uniform is word
    # g % 4 of counter g / 4, so odd rows (s_kv 17, 1001) start mid-counter; Double attention draws
    # the same Float-precision mask.
    p = 0.3
    b, h, sq, skv, d = shape
    q, k, v = (x.astype(np.float64 if dtype == F64 else np.float32) for x in qkv(rng, b, h, sq, skv, d))
    go = rng.standard_normal(q.shape).astype(q.dtype)
    fd = backward_fusion([q.shape, k.shape, v.shape, go.shape], dtype=dtype, dropout_p=p, is_causal=causal)
    first = fd.execute([q, k, v, go])
    second = fd.execute([q, k, v, go])
    assert int(first[3]) != int(second[3]), "each execution draws a fresh (seed, offset)"
    rtol, atol = (1e-4, 1e-5) if dtype == F32 else (1e-10, 1e-12)
    for res in (first, second):
        keep = dropout_keep([b, h, sq, skv], res[2], res[3], p)
        assert 0.6 < keep.mean() < 0.8
        ref_out, ref_lse, _ = attention_reference(q, k, v, causal, keep=keep, p=p)
        np.testing.assert_allclose(res[0], ref_out, rtol=rtol, atol=atol)
        np.testing.assert_allclose(res[1], ref_lse, rtol=1e-5, atol=2e-5)  # log_sumexp is Float
        for got, want in zip(res[4:], attention_grad_reference(q, k, v, go, causal, keep=keep, p=p)):
            np.testing.assert_allclose(got, want, rtol=10 * rtol, atol=10 * atol * max(1.0, np.abs(want).max()))


def test_bad_inputs_raise_clear_errors():
    def define(shapes, dtypes=(F32, F32, F32), **kw):
        with FusionDefinition() as fd:
            ins = [fd.define_tensor(list(s), dtype=t) for s, t in zip(shapes, dtypes)]
            fd.ops.sdpfa_fwd(*ins, **kw)

    with pytest.raises(ValueError, match="sdpfa_fwd: T0 must have rank 4"):
        define([[2, 8, 16], [2, 8, 16, 4], [2, 8, 16, 4]])
    with pytest.raises(ValueError, match=r"axis 1 \(heads"):
        define([[2, 8, 16, 4], [2, 4, 16, 4], [2, 4, 16, 4]])
    with pytest.raises(ValueError, match=r"axis 3 \(head dim"):
        define([[2, 8, 16, 4], [2, 8, 16, 8], [2, 8, 16, 4]])
    with pytest.raises(ValueError, match=r"axis 0 \(batch"):
        define([[2, 8, 16, 4], [3, 8, 16, 4], [3, 8, 16, 4]])
    with pytest.raises(ValueError, match=r"axis 2 \(sequence"):
        define([[2, 8, 16, 4], [2, 8, 16, 4], [2, 8, 17, 4]])
    with pytest.raises(TypeError, match="share one dtype"):
        define([[2, 8, 16, 4]] * 3, dtypes=(F32, DataType.Half, F32))
    with pytest.raises(TypeError, match="floating point"):
        define([[2, 8, 16, 4]] * 3, dtypes=(DataType.Int,) * 3)
    with pytest.raises(ValueError, match=r"dropout_p must be in \[0, 1\)"):
        define([[2, 8, 16, 4]] * 3, dropout_p=1.5)
    with FusionDefinition() as fd:
        q = fd.define_tensor([1, 2, 4, 8])
        out, lse, seed, offset = fd.ops.sdpfa_fwd(q, q, q)
        with pytest.raises(TypeError, match="log_sumexp .* must be Float"):
            fd.ops.sdpfa_bwd(out, q, q, q, out, seed, 0.0, False, seed, offset)
        with pytest.raises(ValueError, match=r"must have rank 3 \[batch, heads, seq_q\]"):
            fd.ops.sdpfa_bwd(out, q, q, q, out, out, 0.0, False, seed, offset)
        with pytest.raises(ValueError, match="must be an Int tensor"):
            fd.ops.sdpfa_bwd(out, q, q, q, out, lse, 0.0, False, lse, offset)


@pytest.mark.parametrize("axis,message", [
    (2, r"sdpfa_fwd: T0 is sharded on axis 2 \(sequence\) over mesh_x; attention can shard only batch \(axis 0\) "
        r"and heads \(axis 1\): sequence sharding \(ring attention\) is not supported"),
    (3, r"sdpfa_fwd: T0 is sharded on axis 3 \(head dim\) over mesh_x; attention can shard only batch \(axis 0\) "
        r"and heads \(axis 1\)$"),
], ids=["sequence", "head-dim"])
def test_sequence_or_head_dim_sharding_is_rejected_naming_op_and_axis(axis, message):
    mesh = DeviceMesh([0])
    with FusionDefinition() as fd:
        q = fd.define_tensor([1, 2, 8, 4])
        k = fd.define_tensor([1, 2, 8, 4])
        v = fd.define_tensor([1, 2, 8, 4])
        out, _, _, _ = fd.ops.sdpfa_fwd(q, k, v)
        fd.add_output(out)
        for t in (q, k, v, out):
            t.set_device_mesh(mesh)
        q.outer_split(axis, 1)
        q.axis(axis).parallelize(ParallelType.mesh_x)
    with pytest.raises(ValueError, match=message):
        fd.execute([np.zeros([1, 2, 8, 4], np.float32)] * 3)


def test_an_empty_key_sequence_attends_to_nothing(capfd):
    """No key: each query's output is zeros (0 / 0 gave NaN) and its logsumexp -inf; no BLAS call on an
    empty matrix (OpenBLAS printed "illegal value" for each)."""
    with FusionDefinition() as fd:
        q = fd.define_tensor([1, 2, 4, 3])
        k = fd.define_tensor([1, 2, 0, 3])
        v = fd.define_tensor([1, 2, 0, 3])
        out, lse, _, _ = fd.ops.sdpfa_fwd(q, k, v)
        fd.add_output(out)
        fd.add_output(lse)
    rng = np.random.default_rng(5)
    got_out, got_lse = fd.execute([rng.standard_normal((1, 2, 4, 3)).astype(np.float32),
                                   np.zeros((1, 2, 0, 3), np.float32), np.zeros((1, 2, 0, 3), np.float32)])
    np.testing.assert_array_equal(got_out, np.zeros((1, 2, 4, 3), np.float32))
    assert np.all(np.isneginf(got_lse))
    assert "illegal value" not in capfd.readouterr().err


def test_heads_sharded_on_one_device_is_local(rng):
    mesh = DeviceMesh([0])
    q, k, v = qkv(rng, 2, 4, 9, 11, 8)
    with FusionDefinition() as fd:
        tq, tk, tv = (fd.define_tensor(list(a.shape)) for a in (q, k, v))
        out, lse, _, _ = fd.ops.sdpfa_fwd(tq, tk, tv, is_causal=True)
        fd.add_output(out)
        for t in (tq, tk, tv, out):
            t.set_device_mesh(mesh)
            t.outer_split(1, 1)
            t.axis(1).parallelize(ParallelType.mesh_x)
    (got,) = fd.execute([q, k, v])
    np.testing.assert_allclose(got, attention_reference(q, k, v, True)[0], rtol=1e-4, atol=2e-5)
    assert "attention" in fd.host_ir()


_PEAK_SCRIPT = r"""
import resource, sys, numpy as np
sys.path.insert(0, sys.argv[1])
from meshfuse import FusionDefinition, DataType
s, d = 8192, 64
rng = np.random.default_rng(0)
q, k, v, go = (rng.standard_normal([1, 1, s, d]).astype(np.float32) for _ in range(4))
with FusionDefinition() as fd:
    tq, tk, tv, tg = (fd.define_tensor([1, 1, s, d]) for _ in range(4))
    out, lse, seed, off = fd.ops.sdpfa_fwd(tq, tk, tv, is_causal=False)
    fd.add_output(out)
    for g in fd.ops.sdpfa_bwd(tg, tq, tk, tv, out, lse, 0.0, False, seed, off):
        fd.add_output(g)
small = [a[:, :, :128].copy() for a in (q, k, v, go)]
fd2 = None
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
res = fd.execute([q, k, v, go])
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print((after - before) * 1024)
"""


def test_peak_memory_stays_far_below_a_scores_matrix():
    # One head, s = 8192, d = 64: an [s, s] fp32 buffer would be 256 MiB. Measured in a fresh
    # process: the growth of its peak resident set over one forward + backward execution.
    python_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir, "python")
    out = subprocess.run([sys.executable, "-c", _PEAK_SCRIPT, python_dir], capture_output=True, text=True,
                         timeout=600, env={**os.environ, "OMP_NUM_THREADS": "2"})
    assert out.returncode == 0, out.stderr
    grew = int(out.stdout.strip().splitlines()[-1])
    scores = 8192 * 8192 * 4
    assert grew < scores / 8, f"peak RSS grew by {grew / 2**20:.1f} MiB (an [s, s] buffer is {scores / 2**20:.0f} MiB)"


@pytest.mark.skipif(not torch_cuda_available(), reason="needs torch with a CUDA GPU (and meshfuse built with cuDNN)")
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", [64, 128])
def test_cuda_matches_float64_reference(rng, causal, d):
    import torch
    b, h, sq, skv = 2, 3, 200, 330
    q, k, v = qkv(rng, b, h, sq, skv, d)
    go = rng.standard_normal(q.shape).astype(np.float32)
    for p in (0.0, 0.1):
        shapes = [q.shape, k.shape, v.shape, go.shape]
        cuda_in = [torch.from_numpy(x).to(torch.bfloat16).cuda() for x in (q, k, v, go)]
        res = backward_fusion(shapes, dtype=BF16, dropout_p=p, is_causal=causal).execute(cuda_in)
        res = [r.float().cpu().numpy() if r.is_floating_point() else r.cpu().numpy() for r in res]  # seed: int64
        keep = dropout_keep([b, h, sq, skv], res[2], res[3], p) if p > 0 else None
        rq, rk, rv, rgo = (t.float().cpu().numpy() for t in cuda_in)
        ref_out, ref_lse, _ = attention_reference(rq, rk, rv, causal, keep=keep, p=p)
        np.testing.assert_allclose(res[0], ref_out, rtol=3e-2, atol=3e-2)
        np.testing.assert_allclose(res[1], ref_lse, rtol=1e-3, atol=1e-3)
        for got, want in zip(res[4:], attention_grad_reference(rq, rk, rv, rgo, causal, keep=keep, p=p)):
            np.testing.assert_allclose(got, want, rtol=5e-2, atol=5e-2 * max(1.0, np.abs(want).max()))


@pytest.mark.skipif(not torch_cuda_available(), reason="needs torch with a CUDA GPU (and meshfuse built with cuDNN)")
def test_cuda_forward_output_is_heads_inner_so_merging_heads_is_a_view(rng):
    """cuDNN writes o as [b, s, h, d] in memory (a permuted [b, h, s, d] tensor): the merge of the
    heads that the out-projection reads is then a view of the same memory, not a copy."""
    import torch
    b, h, s, d = 2, 3, 40, 64
    q, k, v = qkv(rng, b, h, s, s, d)
    with FusionDefinition() as fd:
        ins = [fd.define_tensor(list(x.shape), dtype=BF16) for x in (q, k, v)]
        out, _, _, _ = fd.ops.sdpfa_fwd(*ins, is_causal=True)
        fd.add_output(out)
        fd.add_output(fd.ops.reshape(fd.ops.permute(out, [0, 2, 1, 3]), [b, s, h * d]))
    cuda_in = [torch.from_numpy(x).to(torch.bfloat16).cuda() for x in (q, k, v)]
    o, merged = fd.execute(cuda_in)
    assert o.shape == (b, h, s, d) and o.stride() == (s * h * d, d, h * d, 1), o.stride()
    assert merged.data_ptr() == o.data_ptr() and merged.is_contiguous()
    ref, _, _ = attention_reference(*(t.float().cpu().numpy() for t in cuda_in), True)
    np.testing.assert_allclose(o.float().cpu().numpy(), ref, rtol=3e-2, atol=3e-2)
    np.testing.assert_allclose(merged.float().cpu().numpy(), ref.transpose(0, 2, 1, 3).reshape(b, s, h * d),
                               rtol=3e-2, atol=3e-2)


@pytest.mark.skipif(not torch_cuda_available(), reason="needs torch with a CUDA GPU (and meshfuse built with cuDNN)")
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("p", [0.2, 0.1], ids=["p0.2", "p0.1"])
@pytest.mark.parametrize("shape", [(2, 3, 64, 64, 64), (2, 3, 200, 330, 64), (1, 2, 130, 70, 128)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("width", ["narrow", "exact"])
@pytest.mark.parametrize("order", ["query_major", "key_major"])
def test_cuda_dropout_forward_and_backward_match_float64(shape, p, causal, width, order, monkeypatch):
    # cuDNN applies meshfuse's Philox mask (its custom-mask input) in each MESHFUSE_ATTENTION_MASK
    # width: the keep scale rounded to bf16 (narrow) or exactly (exact: fp32 where bf16 rounds it), the
    # rest of the scale through cuDNN's dropout scale; the backward's mask in either memory order
    # (MESHFUSE_ATTENTION_BACKWARD_MASK). Out and every gradient match the float64 reference built
    # with the mask the returned seed and offset imply. (A one-byte 0/1 mask failed exactly this
    # test on the H100, dV = 0: runtime/cuda/dropout_mask.h.)
    import torch
    monkeypatch.setenv("MESHFUSE_ATTENTION_MASK", width)
    monkeypatch.setenv("MESHFUSE_ATTENTION_BACKWARD_MASK", order)
    rng = np.random.default_rng(22)
    b, h, sq, skv, d = shape
    q, k, v = qkv(rng, b, h, sq, skv, d)
    go = rng.standard_normal(q.shape).astype(np.float32)
    cuda_in = [torch.from_numpy(x).to(torch.bfloat16).cuda() for x in (q, k, v, go)]
    res = backward_fusion([x.shape for x in (q, k, v, go)], dtype=BF16, dropout_p=p, is_causal=causal).execute(cuda_in)
    keep = dropout_keep([b, h, sq, skv], res[2], res[3], p)
    assert abs(keep.mean() - (1 - p)) < 0.02
    rq, rk, rv, rgo = (t.double().cpu().numpy() for t in cuda_in)
    ref_out, ref_lse, _ = attention_reference(rq, rk, rv, causal, keep=keep, p=p)
    np.testing.assert_allclose(res[0].double().cpu().numpy(), ref_out, rtol=2e-2, atol=2e-2)
    np.testing.assert_allclose(res[1].double().cpu().numpy(), ref_lse, rtol=1e-3, atol=1e-3)
    for name, got, want in zip("qkv", res[4:], attention_grad_reference(rq, rk, rv, rgo, causal, keep=keep, p=p)):
        err = np.abs(got.double().cpu().numpy() - want).max() / max(1.0, np.abs(want).max())
        assert err < 1.5e-2, f"grad_{name}: max error {err:.3g} of the largest gradient"


@pytest.mark.skipif(not torch_cuda_available(), reason="needs torch with a CUDA GPU (and meshfuse built with cuDNN)")
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("p", [0.0, 0.1], ids=["p0", "p0.1"])
@pytest.mark.parametrize("shape", [(2, 3, 200, 330, 64), (1, 2, 130, 70, 128)], ids=lambda s: "x".join(map(str, s)))
def test_cuda_autotuned_plans_match_float64(shape, p, causal, monkeypatch):
    # MESHFUSE_ATTENTION_AUTOTUNE=1 builds every plan cuDNN's heuristics offer and runs the fastest
    # on its first call's tensors (runtime/cuda/attention_plans.h): whichever wins, out and every
    # gradient match the float64 reference, on the tuning call and on the next (the chosen plan).
    import torch
    monkeypatch.setenv("MESHFUSE_ATTENTION_AUTOTUNE", "1")
    rng = np.random.default_rng(23)
    b, h, sq, skv, d = shape
    q, k, v = qkv(rng, b, h, sq, skv, d)
    go = rng.standard_normal(q.shape).astype(np.float32)
    cuda_in = [torch.from_numpy(x).to(torch.bfloat16).cuda() for x in (q, k, v, go)]
    fusion = backward_fusion([x.shape for x in (q, k, v, go)], dtype=BF16, dropout_p=p, is_causal=causal)
    rq, rk, rv, rgo = (t.double().cpu().numpy() for t in cuda_in)
    for call in range(2):
        res = fusion.execute(cuda_in)
        keep = dropout_keep([b, h, sq, skv], res[2], res[3], p) if p > 0 else None
        ref_out, _, _ = attention_reference(rq, rk, rv, causal, keep=keep, p=p)
        np.testing.assert_allclose(res[0].double().cpu().numpy(), ref_out, rtol=2e-2, atol=2e-2, err_msg=f"call {call}")
        grads = attention_grad_reference(rq, rk, rv, rgo, causal, keep=keep, p=p)
        for name, got, want in zip("qkv", res[4:], grads):
            err = np.abs(got.double().cpu().numpy() - want).max() / max(1.0, np.abs(want).max())
            assert err < 1.5e-2, f"call {call}, grad_{name}: max error {err:.3g} of the largest gradient"


@pytest.mark.skipif(not torch_cuda_available(), reason="needs torch with a CUDA GPU (and meshfuse built with cuDNN)")
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_cuda_gradients_of_one_projection_land_in_one_buffer_so_their_cat_is_a_view(causal):
    """q, k, v as permuted slices of one [b, s, h, 3d] projection, as the transformer feeds them:
    cuDNN writes dq, dk, dv with their strides into one buffer laid out as the projection, so the
    cat that joins them into the projection's gradient is a view of it (no copies), and its values
    match float64 (dropout on, the backward's mask in both orders)."""
    import torch
    b, s, h, d, p = 2, 40, 3, 64, 0.1
    rng = np.random.default_rng(31)
    fused = rng.standard_normal([b, s, h, 3 * d]).astype(np.float32)
    go = rng.standard_normal([b, h, s, d]).astype(np.float32)
    with FusionDefinition() as fd:
        x = fd.define_tensor([b, s, h, 3 * d], dtype=BF16)
        g = fd.define_tensor([b, h, s, d], dtype=BF16)
        q, k, v = heads_of_projection(fd, x)
        out, lse, seed, offset = fd.ops.sdpfa_fwd(q, k, v, dropout_p=p, is_causal=causal)
        grads = fd.ops.sdpfa_bwd(g, q, k, v, out, lse, p, causal, seed, offset)
        for t in (seed, offset, *grads):
            fd.add_output(t)
        fd.add_output(fd.ops.cat([fd.ops.permute(t, [0, 2, 1, 3]) for t in grads], 3))
    cuda_in = [torch.from_numpy(a).to(torch.bfloat16).cuda() for a in (fused, go)]
    heads = cuda_in[0].double().cpu().numpy().transpose(0, 2, 1, 3)
    rq, rk, rv = heads[..., :d], heads[..., d:2 * d], heads[..., 2 * d:]
    for order in ("key_major", "query_major"):
        os.environ["MESHFUSE_ATTENTION_BACKWARD_MASK"] = order
        try:
            seed_t, offset_t, dq, dk, dv, dqkv = fd.execute(cuda_in)
        finally:
            del os.environ["MESHFUSE_ATTENTION_BACKWARD_MASK"]
        assert dqkv.shape == (b, s, h, 3 * d) and dqkv.is_contiguous()
        assert dqkv.data_ptr() == dq.data_ptr(), "the cat copied: dq, dk, dv were not written side by side"
        assert dk.data_ptr() == dq.data_ptr() + 2 * d and dq.stride() == cuda_in[0].permute(0, 2, 1, 3).stride()
        keep = dropout_keep([b, h, s, s], seed_t, offset_t, p)
        want = attention_grad_reference(rq, rk, rv, cuda_in[1].double().cpu().numpy(), causal, keep=keep, p=p)
        got = dqkv.double().cpu().numpy()
        for i, (name, ref) in enumerate(zip("qkv", want)):
            part = got[..., i * d:(i + 1) * d].transpose(0, 2, 1, 3)
            err = np.abs(part - ref).max() / max(1.0, np.abs(ref).max())
            assert err < 1.5e-2, f"{order}: grad_{name} max error {err:.3g} of the largest gradient"


@pytest.mark.skipif(not torch_cuda_available(), reason="needs torch with a CUDA GPU (and meshfuse built with cuDNN)")
def test_cuda_rejects_an_unknown_mask_width(monkeypatch):
    import torch
    monkeypatch.setenv("MESHFUSE_ATTENTION_MASK", "wide")
    fd = forward_fusion([[1, 1, 16, 64]] * 3, dtype=BF16, dropout_p=0.1, is_causal=False)
    x = torch.zeros([1, 1, 16, 64], dtype=torch.bfloat16, device="cuda")
    with pytest.raises(Exception, match="MESHFUSE_ATTENTION_MASK=wide is not one of"):
        fd.execute([x, x, x])
    monkeypatch.setenv("MESHFUSE_ATTENTION_MASK", "byte")  # withdrawn: wrong gradients in cuDNN 9.19
    with pytest.raises(Exception, match="MESHFUSE_ATTENTION_MASK=byte was withdrawn"):
        fd.execute([x, x, x])


@pytest.mark.skipif(not torch_cuda_available(), reason="needs torch with a CUDA GPU (and meshfuse built with cuDNN)")
@pytest.mark.parametrize("width", ["narrow", "exact"])
def test_cuda_drops_the_elements_its_seed_implies(width, monkeypatch):
    # With V = identity (s_kv = d) the output is the dropped, rescaled probability matrix itself, so
    # the elements cuDNN zeroed are read off directly. They must be exactly those that the returned
    # (philox_seed, philox_offset) imply through fd.ops.uniform, the mask the CPU kernel applies
    # (test_dropout_mask_is_the_one_the_seed_implies): meshfuse's Philox mask is cuDNN's input.
    import torch
    monkeypatch.setenv("MESHFUSE_ATTENTION_MASK", width)
    rng = np.random.default_rng(21)
    b, h, s, p = 2, 3, 64, 0.3
    q, k = (rng.standard_normal([b, h, s, s]).astype(np.float32) * 0.3 for _ in range(2))
    v = np.broadcast_to(np.eye(s, dtype=np.float32), [b, h, s, s]).copy()
    fd = forward_fusion([q.shape] * 3, dtype=BF16, dropout_p=p, is_causal=True)
    cuda_in = [torch.from_numpy(x).to(torch.bfloat16).cuda() for x in (q, k, v)]
    out, _, seed, offset = fd.execute(cuda_in)
    out = out.float().cpu().numpy()
    keep = dropout_keep([b, h, s, s], seed, offset, p)
    causal = np.broadcast_to(np.tril(np.ones([s, s], dtype=bool)), keep.shape)
    assert 0.6 < keep[causal].mean() < 0.8, "about 1 - p of the causal entries kept"
    np.testing.assert_array_equal(out[causal] != 0, keep[causal])
    rq, rk = (t.float().cpu().numpy() for t in cuda_in[:2])
    ref, _, _ = attention_reference(rq, rk, v, True, keep=keep, p=p)
    np.testing.assert_allclose(out, ref, atol=1e-2, rtol=2e-2)


@pytest.mark.skipif(not torch_cuda_available(), reason="needs torch with a CUDA GPU (and meshfuse built with cuDNN)")
def test_cuda_inputs_not_16_byte_aligned_match_aligned_ones(rng):
    """Contiguous q, k, v, dO that start one element into their buffers (2 bytes: not 16-byte aligned,
    which cuDNN's kernels need) give what the same values at aligned addresses give."""
    import torch
    b, h, s, d = 1, 2, 64, 64
    q, k, v = qkv(rng, b, h, s, s, d)
    go = rng.standard_normal(q.shape).astype(np.float32)
    aligned = [torch.from_numpy(x).to(torch.bfloat16).cuda() for x in (q, k, v, go)]
    shifted = []
    for t in aligned:
        buf = torch.empty(t.numel() + 1, dtype=torch.bfloat16, device="cuda")
        view = buf[1:].view(t.shape)
        view.copy_(t)
        assert view.data_ptr() % 16 != 0 and view.is_contiguous()
        shifted.append(view)
    fusion = backward_fusion([q.shape, k.shape, v.shape, go.shape], dtype=BF16, dropout_p=0.0, is_causal=True)
    want = [r.float().cpu().numpy() for r in fusion.execute(aligned) if r.is_floating_point()]
    got = [r.float().cpu().numpy() for r in fusion.execute(shifted) if r.is_floating_point()]
    assert len(got) == len(want) == 5  # out, lse, dq, dk, dv
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-2, atol=1e-2 * max(1.0, np.abs(w).max()))


@pytest.mark.skipif(not torch_cuda_available(), reason="needs torch with a CUDA GPU")
def test_cuda_rejects_unsupported_head_dim():
    import torch
    x = torch.zeros([1, 1, 8, 72 + 4], dtype=torch.bfloat16, device="cuda")
    fd = forward_fusion([x.shape] * 3, dtype=BF16)
    with pytest.raises(ValueError, match="head dim 76 is not supported"):
        fd.execute([x, x, x])
