"""Normalization segments (issue 12): LayerNorm, RMSNorm, softmax, log-softmax and their backward
formulas, written from primitive ops, each lower to ONE `normalization` LaunchSegment and match a
float64 numpy reference: rows of 1, 7, 4097 and 262144 elements, fp32/fp16/bf16 (bf16 through casts,
numpy has none), keepdim and not, non-contiguous inputs, 3-D inputs, outer reductions over two
leading axes."""
import numpy as np
import pytest
from conftest import random_array
from host_ir_lines import launches as segments

from meshfuse import DataType, FusionDefinition

EPS = 1e-5
# (rows, row length): row lengths 1, 7, 4097 (not a multiple of any vector width) and 262144.
SHAPES = [(3, 1), (5, 7), (3, 4097), (2, 262144)]
DTYPES = ["float32", "float16", "bfloat16"]


def round_to_bfloat16(x):
    """float -> nearest bfloat16 (ties to even), as float64."""
    bits = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16 << 16
    return rounded.astype(np.uint32).view(np.float32).astype(np.float64)


def assert_one_normalization(fd):
    assert segments(fd) == ["normalization"], fd.host_ir()


# ---- the patterns: build(fd, ops-wrapper, *tvs) and a float64 reference --------------------------
def layernorm_var_mean(o, x, w, b):
    var, mean = o.var_mean(x, [-1], 0, True)
    return [o.add(o.mul(o.mul(o.sub(x, mean), o.rsqrt(o.add(var, EPS))), w), b)]


def layernorm_var_mean_nokeep(o, x, w, b):
    # keepdim=False, broadcast back with broadcast_in_dim; mean and rstd are outputs too (saved for
    # backward), one value per row.
    rows, cols = x.shape
    var, mean = o.var_mean(x, [1], 0, False)
    rstd = o.rsqrt(o.add(var, EPS))
    y = o.mul(o.sub(x, o.broadcast_in_dim(mean, [rows, cols], [0])), o.broadcast_in_dim(rstd, [rows, cols], [0]))
    return [o.add(o.mul(y, w), b), mean, rstd]


def layernorm_mean_square(o, x, w, b):
    mean = o.mean(x, [1], keepdim=True)
    centred = o.sub(x, mean)
    var = o.mean(o.square(centred), [1], keepdim=True)
    return [o.add(o.mul(o.mul(centred, o.rsqrt(o.add(var, EPS))), w), b)]


def layernorm_ref(x, w, b):
    mean = x.mean(-1, keepdims=True)
    var = x.var(-1, keepdims=True)
    return [(x - mean) / np.sqrt(var + EPS) * w + b]


def layernorm_nokeep_ref(x, w, b):
    return layernorm_ref(x, w, b) + [x.mean(1), 1 / np.sqrt(x.var(1) + EPS)]


def rmsnorm(o, x, w):
    return [o.mul(o.mul(x, o.rsqrt(o.add(o.mean(o.mul(x, x), [1], keepdim=True), EPS))), w)]


def rmsnorm_ref(x, w):
    return [x / np.sqrt((x * x).mean(1, keepdims=True) + EPS) * w]


def softmax(o, x):
    e = o.exp(o.sub(x, o.max(x, [1], keepdim=True)))
    return [o.div(e, o.sum(e, [1], keepdim=True))]


def softmax_ref(x):
    e = np.exp(x - x.max(1, keepdims=True))
    return [e / e.sum(1, keepdims=True)]


def log_softmax(o, x):
    s = o.sub(x, o.max(x, [1], keepdim=True))
    return [o.sub(s, o.log(o.sum(o.exp(s), [1], keepdim=True)))]


def log_softmax_ref(x):
    s = x - x.max(1, keepdims=True)
    return [s - np.log(np.exp(s).sum(1, keepdims=True))]


def softmax_bwd(o, y, dy):
    return [o.mul(y, o.sub(dy, o.sum(o.mul(dy, y), [1], keepdim=True)))]


def softmax_bwd_ref(y, dy):
    return [y * (dy - (dy * y).sum(1, keepdims=True))]


def layernorm_bwd(o, x, dy, w, mean, rstd):
    # dx with the inner reductions, dgamma and dbeta as outer reductions: one segment.
    xhat = o.mul(o.sub(x, mean), rstd)
    g = o.mul(dy, w)
    c1 = o.mean(g, [1], keepdim=True)
    c2 = o.mean(o.mul(g, xhat), [1], keepdim=True)
    dx = o.mul(rstd, o.sub(o.sub(g, c1), o.mul(xhat, c2)))
    return [dx, o.sum(o.mul(dy, xhat), [0]), o.sum(dy, [0])]


def layernorm_bwd_ref(x, dy, w, mean, rstd):
    xhat = (x - mean) * rstd
    g = dy * w
    dx = rstd * (g - g.mean(1, keepdims=True) - xhat * (g * xhat).mean(1, keepdims=True))
    return [dx, (dy * xhat).sum(0), dy.sum(0)]


def _row_inputs(rng, rows, cols, kinds):
    """Random float32 inputs: 'x' [rows, cols], 'w' [cols], 'row' [rows, 1] (mean), 'rstd' [rows, 1],
    'prob' [rows, cols] (softmax output)."""
    out = []
    for kind in kinds:
        if kind == "x":
            out.append(random_array(rng, (rows, cols), np.float32))
        elif kind == "w":
            out.append(random_array(rng, (cols,), np.float32, 0.5, 1.5))
        elif kind == "row":
            out.append(random_array(rng, (rows, 1), np.float32, -0.5, 0.5))
        elif kind == "rstd":
            out.append(random_array(rng, (rows, 1), np.float32, 0.5, 2.0))
        elif kind == "prob":
            p = rng.random((rows, cols)).astype(np.float32)
            out.append(p / p.sum(1, keepdims=True))
    return out


PATTERNS = {
    "layernorm_var_mean": (layernorm_var_mean, layernorm_ref, ["x", "w", "w"]),
    "layernorm_var_mean_nokeep": (layernorm_var_mean_nokeep, layernorm_nokeep_ref, ["x", "w", "w"]),
    "layernorm_mean_square": (layernorm_mean_square, layernorm_ref, ["x", "w", "w"]),
    "rmsnorm": (rmsnorm, rmsnorm_ref, ["x", "w"]),
    "softmax": (softmax, softmax_ref, ["x"]),
    "log_softmax": (log_softmax, log_softmax_ref, ["x"]),
    "softmax_bwd": (softmax_bwd, softmax_bwd_ref, ["prob", "x"]),
    "layernorm_bwd": (layernorm_bwd, layernorm_bwd_ref, ["x", "x", "w", "row", "rstd"]),
}


def run_pattern(name, arrays, dtype):
    """Runs a pattern with inputs and outputs of `dtype` ('float32', 'float16': numpy arrays of that
    dtype; 'bfloat16': float32 arrays cast to BFloat16 in the definition, results cast to BFloat16
    and back to Float) and fp32 compute (nvFuser's pattern). Returns (fd, outputs, the inputs as the
    kernel sees them in float64)."""
    build = PATTERNS[name][0]
    io = {"float32": DataType.Float, "float16": DataType.Half, "bfloat16": DataType.Float}[dtype]
    arrays = [a.astype(np.float16) if dtype == "float16" else a for a in arrays]
    with FusionDefinition() as fd:
        tvs = [fd.define_tensor(list(a.shape), io) for a in arrays]
        o = fd.ops
        if dtype != "float32":
            low = DataType.Half if dtype == "float16" else DataType.BFloat16
            if dtype == "bfloat16":
                tvs = [o.cast(t, low) for t in tvs]
            tvs = [o.cast(t, DataType.Float) for t in tvs]
        outs = build(o, *tvs)
        for out in outs:
            if dtype == "float16":
                out = o.cast(out, DataType.Half)
            elif dtype == "bfloat16":
                out = o.cast(o.cast(out, DataType.BFloat16), DataType.Float)
            fd.add_output(out)
    got = fd.execute(arrays)
    seen = [round_to_bfloat16(a) if dtype == "bfloat16" else a.astype(np.float64) for a in arrays]
    return fd, got, seen


def assert_matches(got, expected, dtype):
    # Tolerances relative to the result's scale: fp32 compute, the output rounded to dtype.
    rel = {"float32": 2e-5, "float16": 2e-3, "bfloat16": 1.6e-2}[dtype]
    for i, (g, e) in enumerate(zip(got, expected)):
        assert g.shape == e.shape, (i, g.shape, e.shape)
        scale = max(1.0, float(np.max(np.abs(e)))) if e.size else 1.0
        err = np.abs(g.astype(np.float64) - e)
        tol = rel * np.maximum(np.abs(e), scale * 1e-2) + rel * scale * 1e-1
        if dtype == "float32":
            tol = rel * scale + 0 * err  # sums over long rows: an absolute bound on the result's scale
        bad = err > tol
        assert not bad.any(), (f"output {i}: {bad.sum()} of {bad.size} elements off, worst {err.max():.3g} "
                               f"at {np.unravel_index(err.argmax(), err.shape)} (scale {scale:.3g})")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("name", list(PATTERNS))
def test_pattern_is_one_segment_and_matches_numpy(rng, name, shape, dtype):
    if shape[1] == 262144 and dtype != "float32" and name not in ("layernorm_var_mean", "softmax"):
        pytest.skip("the longest rows run in fp32 and for two patterns in low precision (test time)")
    _, ref, kinds = PATTERNS[name]
    arrays = _row_inputs(rng, *shape, kinds)
    fd, got, seen = run_pattern(name, arrays, dtype)
    assert_one_normalization(fd)
    assert_matches(got, ref(*seen), dtype)


@pytest.mark.parametrize("layout", ["column_major", "every_other_column", "reversed_rows"])
@pytest.mark.parametrize("name", ["layernorm_var_mean", "layernorm_var_mean_nokeep", "softmax", "layernorm_bwd"])
def test_non_contiguous_inputs(rng, name, layout):
    _, ref, kinds = PATTERNS[name]
    arrays = _row_inputs(rng, 6, 37, kinds)

    def view(a):
        if a.ndim != 2 or a.shape[1] == 1:
            return a
        if layout == "column_major":
            return np.asfortranarray(a)
        if layout == "every_other_column":
            wide = np.zeros((a.shape[0], 2 * a.shape[1]), a.dtype)
            wide[:, ::2] = a
            return wide[:, ::2]
        return a[::-1].copy()[::-1]

    views = [view(a) for a in arrays]
    assert any(not v.flags.c_contiguous for v in views)
    fd, got, seen = run_pattern(name, views, "float32")
    assert_one_normalization(fd)
    assert_matches(got, ref(*[a.astype(np.float64) for a in arrays]), "float32")


@pytest.mark.parametrize("name", ["layernorm_var_mean", "softmax"])
def test_non_contiguous_output_of_a_previous_segment_in_bfloat16(rng, name):
    # A BFloat16 tensor stored by one segment and read, transposed (a strided view), by the
    # normalization segment: the kernel loads bf16 storage with strides.
    x = random_array(rng, (13, 9), np.float32)
    with FusionDefinition() as fd:
        t = fd.define_tensor([13, 9])
        xt = fd.ops.permute(fd.ops.cast(t, DataType.BFloat16), [1, 0])  # [9, 13] bf16
        w, b = fd.ops.full([13], 1.0, DataType.BFloat16), fd.ops.full([13], 0.0, DataType.BFloat16)
        outs = layernorm_var_mean(fd.ops, xt, w, b) if name != "softmax" else softmax(fd.ops, xt)
        fd.add_output(fd.ops.cast(outs[0], DataType.Float))
    (got,) = fd.execute([x])
    assert "normalization" in segments(fd), fd.host_ir()
    xt64 = round_to_bfloat16(x).T
    expected = layernorm_ref(xt64, 1.0, 0.0)[0] if name != "softmax" else softmax_ref(xt64)[0]
    assert_matches([got], [expected], "bfloat16")


def test_bfloat16_and_half_storage_with_torch(rng):
    torch = pytest.importorskip("torch")
    for tdtype, dt, name in ((torch.bfloat16, DataType.BFloat16, "bfloat16"), (torch.float16, DataType.Half, "float16")):
        x = torch.from_numpy(random_array(rng, (7, 4097), np.float32)).to(tdtype)
        with FusionDefinition() as fd:
            t = fd.define_tensor([7, 4097], dt)
            y = layernorm_var_mean(fd.ops, fd.ops.cast(t, DataType.Float), 1.0, 0.0)[0]
            fd.add_output(fd.ops.cast(y, dt))
        (got,) = fd.execute([x])
        assert got.dtype == tdtype
        assert_one_normalization(fd)
        expected = layernorm_ref(x.double().numpy(), 1.0, 0.0)[0]
        assert_matches([got.double().numpy()], [expected], name)


@pytest.mark.parametrize("keepdim", [True, False])
@pytest.mark.parametrize("shape", [(2, 3, 7), (1, 5, 4097)])
def test_layernorm_3d_over_last_axis(rng, shape, keepdim):
    x = random_array(rng, shape, np.float32)
    w = random_array(rng, shape[-1:], np.float32, 0.5, 1.5)
    with FusionDefinition() as fd:
        t, tw = fd.define_tensor(list(shape)), fd.define_tensor(list(shape[-1:]))
        var, mean = fd.ops.var_mean(t, [2], 0, keepdim)
        if not keepdim:
            var = fd.ops.broadcast_in_dim(var, list(shape), [0, 1])
            mean = fd.ops.broadcast_in_dim(mean, list(shape), [0, 1])
        fd.add_output(fd.ops.mul(fd.ops.mul(fd.ops.sub(t, mean), fd.ops.rsqrt(fd.ops.add(var, EPS))), tw))
    (got,) = fd.execute([x, w])
    assert_one_normalization(fd)
    assert_matches([got], layernorm_ref(x.astype(np.float64), w.astype(np.float64), 0.0), "float32")


@pytest.mark.parametrize("keepdim", [True, False])
def test_layernorm_bwd_3d_outer_reductions_over_two_leading_axes(rng, keepdim):
    b, s, h = 2, 3, 37
    x, dy = random_array(rng, (b, s, h), np.float32), random_array(rng, (b, s, h), np.float32)
    w = random_array(rng, (h,), np.float32, 0.5, 1.5)
    mean = x.mean(2, keepdims=True)
    rstd = (1 / np.sqrt(x.var(2, keepdims=True) + EPS)).astype(np.float32)
    with FusionDefinition() as fd:
        tx, tdy = fd.define_tensor([b, s, h]), fd.define_tensor([b, s, h])
        tw, tm, tr = fd.define_tensor([h]), fd.define_tensor([b, s, 1]), fd.define_tensor([b, s, 1])
        o = fd.ops
        xhat = o.mul(o.sub(tx, tm), tr)
        g = o.mul(tdy, tw)
        c1 = o.mean(g, [2], keepdim=True)
        c2 = o.mean(o.mul(g, xhat), [2], keepdim=True)
        fd.add_output(o.mul(tr, o.sub(o.sub(g, c1), o.mul(xhat, c2))))
        fd.add_output(o.sum(o.mul(tdy, xhat), [0, 1], keepdim=keepdim))
        fd.add_output(o.sum(tdy, [0, 1], keepdim=keepdim))
    got = fd.execute([x, dy, w, mean, rstd])
    assert_one_normalization(fd)
    x64, dy64, w64, m64, r64 = (a.astype(np.float64) for a in (x, dy, w, mean, rstd))
    xhat = (x64 - m64) * r64
    g = dy64 * w64
    dx = r64 * (g - g.mean(2, keepdims=True) - xhat * (g * xhat).mean(2, keepdims=True))
    expected = [dx, (dy64 * xhat).sum((0, 1), keepdims=keepdim), dy64.sum((0, 1), keepdims=keepdim)]
    assert_matches(got, expected, "float32")


@pytest.mark.parametrize("name", ["sum", "mean", "max"])
@pytest.mark.parametrize("shape", [(4, 1), (300, 7), (3, 4097)])
def test_outer_reduction_with_pointwise_producer(rng, name, shape):
    # sum/mean/max over the rows of a pointwise product, plus a consumer of the column result
    # (an epilogue after the outer reduction).
    x, y = random_array(rng, shape, np.float32), random_array(rng, shape, np.float32)
    with FusionDefinition() as fd:
        tx, ty = fd.define_tensor(list(shape)), fd.define_tensor(list(shape))
        r = getattr(fd.ops, name)(fd.ops.mul(tx, ty), [0])
        fd.add_output(r)
        fd.add_output(fd.ops.mul(fd.ops.exp(r), 2.0))
    got = fd.execute([x, y])
    assert_one_normalization(fd)
    r = getattr(np, name)(x.astype(np.float64) * y, axis=0)
    assert_matches(got, [r, 2 * np.exp(r)], "float32")


def test_inner_reduction_outputs_with_and_without_keepdim(rng):
    x = random_array(rng, (9, 4097), np.float32)
    with FusionDefinition() as fd:
        t = fd.define_tensor([9, 4097])
        s = fd.ops.sum(fd.ops.square(t), [1], keepdim=False)
        m = fd.ops.max(t, [1], keepdim=True)
        fd.add_output(s)
        fd.add_output(m)
        fd.add_output(fd.ops.sub(t, m))
    got = fd.execute([x])
    assert_one_normalization(fd)
    x64 = x.astype(np.float64)
    assert_matches(got, [(x64 ** 2).sum(1), x64.max(1, keepdims=True), x64 - x64.max(1, keepdims=True)], "float32")


def test_max_propagates_nan_per_row(rng):
    x = random_array(rng, (4, 9), np.float32)
    x[2, 5] = np.nan
    (got,) = run_pattern("softmax", [x], "float32")[1]
    assert np.isnan(got[2]).all()
    assert np.isfinite(np.delete(got, 2, axis=0)).all()


def test_where_and_comparisons_inside_a_normalization_segment(rng):
    # Masked softmax: where(mask, x, -inf) then softmax; the mask is a comparison fused in.
    x = random_array(rng, (6, 33), np.float32)
    with FusionDefinition() as fd:
        t = fd.define_tensor([6, 33])
        masked = fd.ops.where(fd.ops.gt(t, -1.0), t, float("-inf"))
        fd.add_output(softmax(fd.ops, masked)[0])
    (got,) = fd.execute([x])
    assert_one_normalization(fd)
    x64 = np.where(x > -1.0, x.astype(np.float64), -np.inf)
    assert_matches([got], softmax_ref(x64), "float32")


def test_double_stays_double(rng):
    x = random_array(rng, (5, 4097), np.float64)
    with FusionDefinition() as fd:
        t = fd.define_tensor([5, 4097], DataType.Double)
        fd.add_output(layernorm_var_mean(fd.ops, t, 1.0, 0.0)[0])
    (got,) = fd.execute([x])
    assert got.dtype == np.float64
    assert_one_normalization(fd)
    np.testing.assert_allclose(got, layernorm_ref(x, 1.0, 0.0)[0], rtol=1e-10, atol=1e-10)


def test_var_mean_correction_and_keepdim(rng):
    x = random_array(rng, (4, 6, 5), np.float32)
    for dims in ([1], [2], [1, 2], [0]):
        for correction in (0, 1):
            for keepdim in (True, False):
                with FusionDefinition() as fd:
                    t = fd.define_tensor([4, 6, 5])
                    var, mean = fd.ops.var_mean(t, dims, correction, keepdim)
                    fd.add_output(var)
                    fd.add_output(mean)
                var, mean = fd.execute([x])
                x64 = x.astype(np.float64)
                ax = tuple(dims)
                np.testing.assert_allclose(var, x64.var(ax, ddof=correction, keepdims=keepdim), rtol=1e-5, atol=1e-6)
                np.testing.assert_allclose(mean, x64.mean(ax, keepdims=keepdim), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["rmsnorm", "layernorm_var_mean", "layernorm_bwd"])
def test_outputs_too_large_for_the_caches_are_copied_out_of_the_row_buffers(rng, name):
    # [2048, 4096] fp32 is 32 MiB an output: past the CPU kernel's in-place threshold (4 MiB), its
    # rows are computed in the row buffers and copied out (runtime/cpu/normalization.cpp).
    _, ref, kinds = PATTERNS[name]
    arrays = _row_inputs(rng, 2048, 4096, kinds)
    fd, got, seen = run_pattern(name, arrays, "float32")
    assert_one_normalization(fd)
    assert_matches(got, ref(*seen), "float32")
