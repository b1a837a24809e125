"""Every fd.ops op against numpy on random data, over the dtypes it takes."""
import math
import warnings

import numpy as np
import pytest
from conftest import DATA_TYPE, random_array, run_fusion, tolerance
from host_ir_lines import launches

from meshfuse import DataType, FusionDefinition

_erf = np.vectorize(math.erf, otypes=[np.float64])


def _gelu(x):
    return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))


UNARY = {
    "neg": np.negative,
    "abs": np.abs,
    "exp": np.exp,
    "log": np.log,
    "sqrt": np.sqrt,
    "relu": lambda x: np.maximum(x, 0),
    "sigmoid": lambda x: 1.0 / (1.0 + np.exp(-x)),
    "tanh": np.tanh,
    "gelu": _gelu,
}
POSITIVE_DOMAIN = {"log", "sqrt"}
FLOAT_TYPES = [np.float32, np.float64, np.float16]
INT_TYPES = [np.int64, np.int32]


def _assert_close(actual, expected, dtype):
    rtol, atol = tolerance(dtype)
    assert actual.dtype == np.dtype(dtype), f"dtype {actual.dtype}, expected {np.dtype(dtype)}"
    assert actual.shape == expected.shape
    np.testing.assert_allclose(actual.astype(np.float64), expected.astype(np.float64), rtol=rtol, atol=atol)


@pytest.mark.parametrize("dtype", FLOAT_TYPES)
@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_float(rng, name, dtype):
    low = 0.1 if name in POSITIVE_DOMAIN else -3.0
    x = random_array(rng, (5, 7), dtype, low=low, high=3.0)
    (out,) = run_fusion(lambda fd, t: getattr(fd.ops, name)(t), x)
    # The reference sees the same (rounded) inputs, in float64, rounded to the output dtype.
    expected = UNARY[name](x.astype(np.float64)).astype(dtype)
    _assert_close(out, expected, dtype)


@pytest.mark.parametrize("dtype", INT_TYPES)
@pytest.mark.parametrize("name", ["neg", "abs", "relu"])
def test_unary_integer_stays_integer(rng, name, dtype):
    x = random_array(rng, (4, 6), dtype)
    (out,) = run_fusion(lambda fd, t: getattr(fd.ops, name)(t), x)
    assert out.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(out, UNARY[name](x))


@pytest.mark.parametrize("name", ["exp", "sqrt", "sigmoid"])
def test_unary_integer_gives_float(rng, name):
    x = np.abs(random_array(rng, (3, 4), np.int32))
    (out,) = run_fusion(lambda fd, t: getattr(fd.ops, name)(t), x)
    _assert_close(out, UNARY[name](x.astype(np.float64)).astype(np.float32), np.float32)


BINARY = {
    "add": np.add,
    "sub": np.subtract,
    "mul": np.multiply,
    "div": np.true_divide,
    "maximum": np.maximum,
    "minimum": np.minimum,
    "pow": np.power,
}


@pytest.mark.parametrize("dtype", FLOAT_TYPES + INT_TYPES)
@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary_same_dtype(rng, name, dtype):
    a = random_array(rng, (6, 5), dtype)
    b = random_array(rng, (6, 5), dtype)
    if name == "pow":
        a = np.abs(a) + (1 if np.issubdtype(a.dtype, np.integer) else 0.5)
        a = a.astype(dtype)
        b = (np.abs(b) % 4).astype(dtype)
    if name == "div" and np.issubdtype(np.dtype(dtype), np.integer):
        b[b == 0] = 3
    (out,) = run_fusion(lambda fd, x, y: getattr(fd.ops, name)(x, y), a, b)
    out_dtype = np.float32 if (name == "div" and np.issubdtype(np.dtype(dtype), np.integer)) else dtype
    expected = BINARY[name](a.astype(np.float64), b.astype(np.float64)).astype(out_dtype)
    _assert_close(out, expected, out_dtype)


@pytest.mark.parametrize("a_dtype,b_dtype,out_dtype", [
    (np.float32, np.float64, np.float64),
    (np.int32, np.float32, np.float32),   # floats win (torch-like: not numpy's float64)
    (np.int32, np.int64, np.int64),
    (np.float16, np.float32, np.float32),
    (np.bool_, np.int32, np.int32),
])
def test_binary_type_promotion(rng, a_dtype, b_dtype, out_dtype):
    a = random_array(rng, (3, 4), a_dtype)
    b = random_array(rng, (3, 4), b_dtype)
    (out,) = run_fusion(lambda fd, x, y: fd.ops.add(x, y), a, b)
    _assert_close(out, (a.astype(np.float64) + b.astype(np.float64)).astype(out_dtype), out_dtype)


@pytest.mark.parametrize("a_shape,b_shape", [((4, 1), (1, 5)), ((3, 4), (4,)), ((2, 1, 4), (3, 1)), ((5,), (1,))])
def test_broadcasting(rng, a_shape, b_shape):
    a = random_array(rng, a_shape, np.float32)
    b = random_array(rng, b_shape, np.float32)
    for symbolic in (True, False):
        (out,) = run_fusion(lambda fd, x, y: fd.ops.mul(x, y), a, b, symbolic=symbolic)
        _assert_close(out, (a.astype(np.float64) * b).astype(np.float32), np.float32)


def test_python_numbers_become_constants(rng):
    x = random_array(rng, (4, 3), np.float32)
    (out,) = run_fusion(lambda fd, t: fd.ops.add(fd.ops.mul(t, 2.5), 1), x)
    _assert_close(out, (x.astype(np.float64) * 2.5 + 1).astype(np.float32), np.float32)
    # A Python float does not widen a Half tensor; an int constant keeps an Int32 tensor Int32.
    h = random_array(rng, (4, 3), np.float16)
    (out,) = run_fusion(lambda fd, t: fd.ops.mul(t, 0.5), h)
    _assert_close(out, (h.astype(np.float64) * 0.5).astype(np.float16), np.float16)
    i = random_array(rng, (4, 3), np.int32)
    (out,) = run_fusion(lambda fd, t: fd.ops.sub(7, t), i)
    assert out.dtype == np.int32
    np.testing.assert_array_equal(out, 7 - i)


def test_tensor_view_operators(rng):
    a = random_array(rng, (3, 5), np.float64)
    b = random_array(rng, (3, 5), np.float64, low=0.5, high=2.0)
    (out,) = run_fusion(lambda fd, x, y: (-x + y * 2 - 1 / y) / (x ** 2 + 1) - abs(x), a, b)
    expected = (-a + b * 2 - 1 / b) / (a ** 2 + 1) - np.abs(a)
    _assert_close(out, expected, np.float64)


@pytest.mark.parametrize("src,dst", [
    (np.float32, np.float64), (np.float64, np.float32), (np.float32, np.float16), (np.float16, np.float32),
    (np.float32, np.int64), (np.float64, np.int32), (np.int32, np.float32), (np.int64, np.float64),
    (np.float32, np.bool_), (np.bool_, np.float32), (np.int32, np.int64),
])
def test_cast(rng, src, dst):
    x = random_array(rng, (4, 5), src, low=-4, high=4)
    (out,) = run_fusion(lambda fd, t: fd.ops.cast(t, DATA_TYPE[np.dtype(dst)]), x)
    assert out.dtype == np.dtype(dst)
    np.testing.assert_array_equal(out, x.astype(dst))


def _round_to_bfloat16(x):
    """float32 -> nearest bfloat16 (ties to even) -> float32, in numpy."""
    bits = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16 << 16
    return rounded.astype(np.uint32).view(np.float32)


def test_bfloat16_through_casts(rng):
    x = random_array(rng, (8, 9), np.float32, low=-100, high=100)
    (out,) = run_fusion(lambda fd, t: fd.ops.cast(fd.ops.cast(t, DataType.BFloat16), DataType.Float), x)
    np.testing.assert_array_equal(out, _round_to_bfloat16(x))
    # Arithmetic on BFloat16 values: a fused chain may keep its intermediate in float32, so the result is
    # only within bfloat16's precision (8 significant bits) of the rounded one.
    (out,) = run_fusion(lambda fd, t: fd.ops.cast(fd.ops.mul(fd.ops.cast(t, DataType.BFloat16), 3.0), DataType.Float), x)
    np.testing.assert_allclose(out, _round_to_bfloat16(x) * np.float32(3.0), rtol=2.0**-8)


def test_set_is_a_copy(rng):
    x = random_array(rng, (3, 4), np.float32)
    (out,) = run_fusion(lambda fd, t: fd.ops.set(t), x)
    np.testing.assert_array_equal(out, x)
    assert not np.shares_memory(out, x)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64, np.int32])
@pytest.mark.parametrize("axes,keepdim", [([0], False), ([1], False), ([0, 1], False), ([-1], True), ([0, 2], True)])
@pytest.mark.parametrize("name", ["sum", "max", "mean"])
def test_reductions(rng, name, axes, keepdim, dtype):
    x = random_array(rng, (4, 6, 5), dtype)
    (out,) = run_fusion(lambda fd, t: getattr(fd.ops, name)(t, axes, keepdim=keepdim), x)
    integral = np.issubdtype(np.dtype(dtype), np.integer)
    reference = {"sum": np.sum, "max": np.max, "mean": np.mean}[name]
    expected = reference(x.astype(np.float64), axis=tuple(axes), keepdims=keepdim)
    out_dtype = {"sum": np.int64 if integral else dtype, "max": dtype, "mean": np.float32 if integral else dtype}[name]
    rtol, atol = tolerance(out_dtype)
    assert out.dtype == np.dtype(out_dtype)
    np.testing.assert_allclose(out.astype(np.float64), expected.astype(out_dtype).astype(np.float64),
                               rtol=max(rtol, 1e-5) if out_dtype == np.float32 else rtol, atol=max(atol, 1e-5))


def test_reduction_axis_as_int(rng):
    x = random_array(rng, (3, 4), np.float64)
    (out,) = run_fusion(lambda fd, t: fd.ops.sum(t, 1), x)
    _assert_close(out, x.sum(axis=1), np.float64)


@pytest.mark.parametrize("name", ["sum", "max", "mean"])
def test_reduced_axes_by_nvfusers_keyword_dims_or_by_axes(rng, name):
    """nvFuser writes fd.ops.sum(x, dims=[1]); meshfuse's first keyword, axes, stays; both or neither
    is a TypeError naming the op."""
    x = random_array(rng, (3, 4), np.float64)
    reference = getattr(np, name)(x, axis=1, keepdims=True)
    for kwargs in ({"dims": [1]}, {"axes": [1]}, {"dims": -1}):
        (out,) = run_fusion(lambda fd, t: getattr(fd.ops, name)(t, keepdim=True, **kwargs), x)
        _assert_close(out, reference, np.float64)
    with pytest.raises(TypeError, match=f"{name}: give the reduced axes once.*both"):
        run_fusion(lambda fd, t: getattr(fd.ops, name)(t, dims=[0], axes=[0]), x)


@pytest.mark.parametrize("name", ["sum", "max", "mean"])
def test_a_reduction_without_dims_reduces_every_axis(rng, name):
    # nvFuser's fd.ops.sum(x) and numpy's x.sum(): it used to be a TypeError ("got neither").
    x = random_array(rng, (3, 4, 2), np.float64)
    (out,) = run_fusion(lambda fd, t: getattr(fd.ops, name)(t), x)
    _assert_close(out, getattr(np, name)(x), np.float64)
    (out,) = run_fusion(lambda fd, t: getattr(fd.ops, name)(t, keepdim=True), x)
    _assert_close(out, getattr(np, name)(x, keepdims=True), np.float64)


def test_squeeze_broadcast_and_expand_as_nvfuser_writes_them(rng):
    x = random_array(rng, (3, 1, 4), np.float32)
    (out,) = run_fusion(lambda fd, t: fd.ops.squeeze(t, [1]), x, symbolic=False)
    np.testing.assert_array_equal(out, x[:, 0, :])
    (out,) = run_fusion(lambda fd, t: fd.ops.squeeze(t, -2), x, symbolic=False)
    assert out.shape == (3, 4)
    with pytest.raises(ValueError, match=r"squeeze: .*defined as 1, not -1"):
        run_fusion(lambda fd, t: fd.ops.squeeze(t, [1]), x)
    y = random_array(rng, (3, 4), np.float32)
    (out,) = run_fusion(lambda fd, t: fd.ops.broadcast(t, [True, False, True, False]), y)
    np.testing.assert_array_equal(out, y[None, :, None, :])
    (out,) = run_fusion(lambda fd, t: fd.ops.expand(t, [3, 5, -1]), x)
    np.testing.assert_array_equal(out, np.broadcast_to(x, (3, 5, 4)))
    with pytest.raises(ValueError, match="squeeze: .*extent 1"):
        run_fusion(lambda fd, t: fd.ops.squeeze(t, [0]), x, symbolic=False)
    with pytest.raises(ValueError, match="broadcast: .*False entries"):
        run_fusion(lambda fd, t: fd.ops.broadcast(t, [True, False]), y)
    with pytest.raises(ValueError, match="expand: shape"):
        run_fusion(lambda fd, t: fd.ops.expand(t, [3, 4]), x)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_clamp_matches_numpy_and_keeps_nan(rng, dtype):
    x = random_array(rng, (5, 6), dtype)
    x[0, 0] = np.nan
    (out,) = run_fusion(lambda fd, t: fd.ops.clamp(t, -0.5, 0.25), x)
    assert out.dtype == dtype
    np.testing.assert_array_equal(out, np.clip(x, dtype(-0.5), dtype(0.25)))
    (out,) = run_fusion(lambda fd, t: fd.ops.clamp(t, max=0.0), x)
    np.testing.assert_array_equal(out, np.minimum(x, dtype(0.0)))
    with pytest.raises(ValueError, match="clamp: give min"):
        run_fusion(lambda fd, t: fd.ops.clamp(t), x)
    # Tensor bounds, NaN among them: NaN, as np.clip and torch.clamp give.
    lo = np.array([np.nan, np.nan, 0, 0], dtype)
    hi = np.array([1, np.nan, np.nan, 1], dtype)
    v = np.array([-2, 0.5, 3, np.nan], dtype)
    (out,) = run_fusion(lambda fd, t, a, b: fd.ops.clamp(t, a, b), v, lo, hi)
    np.testing.assert_array_equal(out, np.clip(v, lo, hi))


@pytest.mark.parametrize("in_shape,out_shape,dims", [
    ((3,), (2, 3), [1]),
    ((3,), (3, 4), [0]),
    ((3, 1), (3, 4), [0, 1]),
    ((2, 3), (2, 5, 3), [0, 2]),
])
def test_broadcast_in_dim(rng, in_shape, out_shape, dims):
    x = random_array(rng, in_shape, np.float32)
    (out,) = run_fusion(lambda fd, t: fd.ops.broadcast_in_dim(t, out_shape, dims), x, symbolic=False)
    keep = [1] * len(out_shape)
    for i, d in enumerate(dims):
        keep[d] = in_shape[i]
    np.testing.assert_array_equal(out, np.broadcast_to(x.reshape(keep), out_shape))


@pytest.mark.parametrize("in_shape,new_shape", [((2, 6), [3, 4]), ((2, 6), [-1, 2]), ((2, 3, 4), [24]), ((12,), [2, 2, 3])])
def test_reshape(rng, in_shape, new_shape):
    x = random_array(rng, in_shape, np.float64)
    for symbolic in (False, True):
        (out,) = run_fusion(lambda fd, t: fd.ops.reshape(t, new_shape), x, symbolic=symbolic)
        np.testing.assert_array_equal(out, x.reshape(new_shape))


@pytest.mark.parametrize("dims", [[1, 0, 2], [2, 0, 1], [0, 2, 1]])
def test_permute(rng, dims):
    x = random_array(rng, (2, 3, 4), np.int32)
    (out,) = run_fusion(lambda fd, t: fd.ops.permute(t, dims), x)
    np.testing.assert_array_equal(out, np.transpose(x, dims))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("a_shape,b_shape", [((5, 7), (7, 3)), ((2, 5, 7), (7, 3)), ((2, 5, 7), (2, 7, 3)), ((7,), (7, 3)),
                                             ((5, 7), (7,))])
def test_matmul(rng, dtype, a_shape, b_shape):
    a = random_array(rng, a_shape, dtype)
    b = random_array(rng, b_shape, dtype)
    (out,) = run_fusion(lambda fd, x, y: fd.ops.matmul(x, y), a, b)
    expected = np.matmul(a.astype(np.float64), b.astype(np.float64))
    rtol, atol = (1e-5, 1e-5) if dtype == np.float32 else (1e-12, 1e-12)
    assert out.dtype == np.dtype(dtype)
    np.testing.assert_allclose(out, expected, rtol=rtol, atol=atol)


@pytest.mark.parametrize("with_bias", [False, True])
def test_linear(rng, with_bias):
    x = random_array(rng, (2, 5, 8), np.float32)
    w = random_array(rng, (6, 8), np.float32)
    b = random_array(rng, (6,), np.float32)
    if with_bias:
        (out,) = run_fusion(lambda fd, xt, wt, bt: fd.ops.linear(xt, wt, bt), x, w, b)
    else:
        (out,) = run_fusion(lambda fd, xt, wt: fd.ops.linear(xt, wt), x, w)
    expected = x.astype(np.float64) @ w.astype(np.float64).T + (b if with_bias else 0)
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)


def test_fused_chain_with_two_outputs(rng):
    x = random_array(rng, (16, 32), np.float32)
    w = random_array(rng, (8, 32), np.float32)
    outs = run_fusion(lambda fd, xt, wt: (lambda y: [fd.ops.relu(y), fd.ops.sum(fd.ops.exp(y), [1])])(fd.ops.linear(xt, wt)), x, w)
    y = x.astype(np.float64) @ w.T
    np.testing.assert_allclose(outs[0], np.maximum(y, 0), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(outs[1], np.exp(y).sum(axis=1), rtol=1e-5)


def test_broadcasts_between_pointwise_ops_stay_one_pointwise_segment(rng):
    """(x - mean) * rstd * w + b with the row statistics and weights broadcast between the pointwise
    ops (a LayerNorm's recomputation in a backward): the broadcasts are launched first, as one view
    segment, and the four pointwise ops are one segment."""
    x = random_array(rng, (6, 40), np.float32)
    mean, rstd = random_array(rng, (6,), np.float32), random_array(rng, (6,), np.float32)
    w, b = random_array(rng, (40,), np.float32), random_array(rng, (40,), np.float32)
    with FusionDefinition() as fd:
        tx, tm, tr, tw, tb = (fd.define_tensor(list(a.shape), DataType.Float) for a in (x, mean, rstd, w, b))
        y = fd.ops.sub(tx, fd.ops.broadcast_in_dim(tm, [6, 40], [0]))
        y = fd.ops.mul(y, fd.ops.broadcast_in_dim(tr, [6, 40], [0]))
        y = fd.ops.mul(y, fd.ops.broadcast_in_dim(tw, [6, 40], [1]))
        fd.add_output(fd.ops.add(y, fd.ops.broadcast_in_dim(tb, [6, 40], [1])))
    (out,) = fd.execute([x, mean, rstd, w, b])
    x64 = x.astype(np.float64)
    expected = (x64 - mean[:, None]) * rstd[:, None] * w + b
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)
    assert launches(fd) == ["view", "pointwise"], fd.host_ir()


def test_views_launched_one_after_another_run_as_one_segment(rng):
    """Views launched one after another are one view segment (host_ir/view_merging.h) whose outputs
    are the values read outside it: the heads split of attention's input (a reshape, three slices,
    their permutes) leaves the permuted heads, not the reshape and slices only its own views read.
    The pointwise op and the matmul between runs keep them apart (the heads merge; the product's
    reshape with the bias's broadcast). Results against numpy."""
    qkv = random_array(rng, (2, 5, 3 * 8), np.float32)
    bias = random_array(rng, (8,), np.float32)
    w = random_array(rng, (8, 8), np.float32)
    with FusionDefinition() as fd:
        tqkv = fd.define_tensor([2, 5, 24], DataType.Float)
        tb, tw = fd.define_tensor([8], DataType.Float), fd.define_tensor([8, 8], DataType.Float)
        heads = fd.ops.reshape(tqkv, [2, 5, 2, 12])
        q, k, v = (fd.ops.permute(fd.ops.slice(heads, [0, 0, 0, 4 * i], [2, 5, 2, 4 * i + 4]), [0, 2, 1, 3])
                   for i in range(3))
        qk = fd.ops.add(fd.ops.mul(q, k), v)  # [2, 2, 5, 4]
        merged = fd.ops.reshape(fd.ops.permute(qk, [0, 2, 1, 3]), [10, 8])
        projected = fd.ops.matmul(merged, tw)
        out = fd.ops.add(fd.ops.reshape(projected, [2, 5, 8]), fd.ops.broadcast_in_dim(tb, [2, 5, 8], [2]))
        fd.add_output(out)
    (got,) = fd.execute([qkv, bias, w])
    h = qkv.astype(np.float64).reshape(2, 5, 2, 12)
    q, k, v = (h[..., 4 * i:4 * i + 4].transpose(0, 2, 1, 3) for i in range(3))
    expected = ((q * k + v).transpose(0, 2, 1, 3).reshape(10, 8) @ w).reshape(2, 5, 8) + bias
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    ir = fd.host_ir()
    assert launches(fd) == ["view", "pointwise", "view", "matmul", "view", "pointwise"], ir
    split = next(line for line in ir.splitlines() if "=slice" in line)
    assert split.count("=slice") == 3 and split.count("=permute") == 3 and "=reshape" in split, split
    assert split.split("->")[1].split(")")[0].count("T") == 3, f"only q, k, v leave the segment: {split}"
    last_views = [line for line in ir.splitlines() if "LaunchSegment view" in line][-1]
    assert "=reshape" in last_views and "=broadcast_in_dim" in last_views, last_views


def test_broadcast_of_a_value_the_open_segment_computes_is_not_launched_ahead(rng):
    """A broadcast of the pointwise segment's own result needs that result: it runs after the
    segment, and the result is right."""
    x = random_array(rng, (5,), np.float32)
    y = random_array(rng, (4, 5), np.float32)
    with FusionDefinition() as fd:
        tx, ty = fd.define_tensor([5], DataType.Float), fd.define_tensor([4, 5], DataType.Float)
        e = fd.ops.exp(fd.ops.neg(tx))
        fd.add_output(fd.ops.mul(ty, fd.ops.broadcast_in_dim(e, [4, 5], [1])))
    (out,) = fd.execute([x, y])
    np.testing.assert_allclose(out, y.astype(np.float64) * np.exp(-x.astype(np.float64)), rtol=1e-5)
    assert launches(fd) == ["pointwise", "view", "pointwise"], fd.host_ir()


@pytest.mark.parametrize("n", [1, 1000, 70001])
def test_long_pointwise_chain_reusing_tile_buffers(rng, n):
    # One pointwise segment whose values outlive many steps (x is read first and last, y squared by
    # itself), with an intermediate that is also an output: the CPU executor reuses a value's tile
    # buffer once its last reader ran, which must never hand a live value's buffer to another.
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1])
        y = fd.define_tensor([-1])
        t = fd.ops.mul(y, y)
        mid = None
        for i in range(24):
            t = fd.ops.add(fd.ops.mul(t, 0.5), fd.ops.tanh(t)) if i % 2 else fd.ops.sub(t, fd.ops.mul(y, 0.25))
            if i == 11:
                mid = t
                fd.add_output(mid)
        fd.add_output(fd.ops.add(fd.ops.mul(t, x), mid))
    a, b = random_array(rng, [n], np.float32), random_array(rng, [n], np.float32)
    got_mid, got = fd.execute([a, b])
    x64, y64 = a.astype(np.float64), b.astype(np.float64)
    t = y64 * y64
    for i in range(24):
        t = t * 0.5 + np.tanh(t) if i % 2 else t - y64 * 0.25
        if i == 11:
            mid = t
    # Twenty-four float steps drift from float64 where t * x and mid cancel: over 20 draws the worst
    # element was 1.4-1.6x a 1e-5 bound (with either tanh the library has had). A buffer handed to the
    # wrong value is off by the size of the values themselves, far past this bound.
    np.testing.assert_allclose(got_mid, mid, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(got, t * x64 + mid, rtol=1e-4, atol=1e-4)
    assert launches(fd) == ["pointwise"]


@pytest.mark.parametrize("reduction", ["sum", "mean", "var_mean"])
@pytest.mark.parametrize("shape", [[0, 3], [-1, 3]], ids=["fixed", "symbolic"])
def test_a_reduction_over_an_empty_leading_axis_after_a_pointwise_op(reduction, shape):
    """An outer reduction over zero rows (a normalization segment with no rows) used to divide by the
    empty extent and kill the process (SIGFPE); numpy's answers: zeros, then NaN for mean and var."""
    with FusionDefinition() as fd:
        x = fd.define_tensor(shape, DataType.Float)
        y = fd.ops.mul(x, 2.0)
        out = fd.ops.var_mean(y, [0])[0] if reduction == "var_mean" else getattr(fd.ops, reduction)(y, [0])
        fd.add_output(out)
    x_np = np.ones((0, 3), np.float32)
    (got,) = fd.execute([x_np])
    with np.errstate(invalid="ignore", divide="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        ref = {"sum": np.sum, "mean": np.mean, "var_mean": np.var}[reduction](2.0 * x_np.astype(np.float64), axis=0)
    np.testing.assert_array_equal(got, ref.astype(np.float32))
    if shape[0] == -1:  # the same cached definition with rows
        np.testing.assert_allclose(fd.execute([np.ones((4, 3), np.float32)])[0], {"sum": 8.0, "mean": 2.0,
                                                                                   "var_mean": 0.0}[reduction])


def test_a_scalar_of_a_higher_kind_lifts_a_bool_tensor():
    """torch's rule: a scalar does not widen a tensor of its own kind, but an integer scalar lifts a Bool
    tensor to Int64 (and two scalar values promote together): where(c, True, 2) and maximum(b, 2) were
    Bool, and 2 came back as True."""
    with FusionDefinition() as fd:
        x = fd.define_tensor([3], DataType.Float)
        b = fd.define_tensor([3], DataType.Bool)
        i = fd.define_tensor([3], DataType.Int32)
        fd.add_output(fd.ops.where(fd.ops.gt(x, 0.0), True, 2))
        fd.add_output(fd.ops.maximum(b, 2))
        fd.add_output(fd.ops.add(b, 1.5))
        fd.add_output(fd.ops.add(i, 2))
    x_np = np.array([1.0, -1.0, 0.0], np.float32)
    b_np = np.array([True, False, True])
    i_np = np.array([1, 2, 3], np.int32)
    where, biggest, plus_float, plus_int = fd.execute([x_np, b_np, i_np])
    assert where.dtype == np.int64 and where.tolist() == [1, 2, 2]
    assert biggest.dtype == np.int64 and biggest.tolist() == [2, 2, 2]
    assert plus_float.dtype == np.float32 and plus_float.tolist() == [2.5, 1.5, 2.5]
    assert plus_int.dtype == np.int32 and plus_int.tolist() == [3, 4, 5]


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_maximum_and_max_let_nan_win_on_every_device(device):
    """numpy's rule, which the CPU kernels follow: a NaN on either side of maximum/minimum, or anywhere in
    a max reduction, gives NaN. CUDA's fmaxf returned the other operand (pointwise and plain reductions)."""
    from conftest import torch_cuda_available
    if device == "cuda" and not torch_cuda_available():
        pytest.skip("needs torch with a CUDA GPU")
    a = np.array([[1.0, np.nan, -2.0, 4.0], [np.nan, 0.5, 3.0, -np.inf]], np.float32)
    b = np.array([[np.nan, 2.0, -3.0, 5.0], [1.0, np.nan, 2.0, -1.0]], np.float32)
    with FusionDefinition() as fd:
        x = fd.define_tensor([2, 4], DataType.Float)
        y = fd.define_tensor([2, 4], DataType.Float)
        fd.add_output(fd.ops.maximum(x, y))
        fd.add_output(fd.ops.minimum(x, y))
        fd.add_output(fd.ops.max(x, [1]))
        fd.add_output(fd.ops.max(x, [0]))
    inputs = [a, b]
    if device == "cuda":
        import torch
        inputs = [torch.from_numpy(t).cuda() for t in inputs]
    outs = [o.cpu().numpy() if device == "cuda" else o for o in fd.execute(inputs)]
    for got, want in zip(outs, (np.maximum(a, b), np.minimum(a, b), np.max(a, axis=1), np.max(a, axis=0))):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("shape", [(5, 1000), (3, 64), (2, 127), (1031, 37), (4099, 600)])
def test_large_reductions_match_numpy_with_nans_and_ties(rng, shape):
    """The reduction kernels' vector paths: a max over the last axis keeps 64 lanes (tails of any
    length, NaN in any lane), a column reduction takes whole rows four at a time and splits the rows
    over threads. Against numpy, for sum, max and mean over either axis, with NaN rows and ties."""
    x = rng.standard_normal(shape).astype(np.float32)
    x[0, shape[1] // 3] = np.nan  # one NaN in row 0, in some lane
    x[-1, :] = 1.5  # a row of ties
    for op in ("sum", "max", "mean"):
        for axis in (0, 1):
            (out,) = run_fusion(lambda fd, t: getattr(fd.ops, op)(t, [axis]), x)
            want = getattr(np, op)(x.astype(np.float64), axis=axis)
            np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-4, err_msg=f"{op} axis {axis}")
    ints = rng.integers(-1000, 1000, shape).astype(np.int64)
    for axis in (0, 1):
        (out,) = run_fusion(lambda fd, t: fd.ops.max(t, [axis]), ints)
        np.testing.assert_array_equal(out, ints.max(axis=axis))
        (out,) = run_fusion(lambda fd, t: fd.ops.sum(t, [axis]), ints)
        np.testing.assert_array_equal(out, ints.sum(axis=axis))
