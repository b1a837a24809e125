"""The ops added for issue 12 (rsqrt, reciprocal, erf, silu, square, comparisons, logical ops, where,
full, uniform/normal, slice, cat, stride_order, var_mean, define_tensor's stride_order/is_cpu)
against float64 numpy references, and the errors bad input gets before any kernel runs."""
import math

import numpy as np
import pytest
from conftest import DATA_TYPE, random_array, run_fusion
from host_ir_lines import launches
import philox_reference

from meshfuse import DataType, FusionDefinition

FLOATS = [np.float32, np.float64, np.float16]
erf64 = np.vectorize(math.erf)

UNARY = {
    "rsqrt": (lambda x: 1 / np.sqrt(x), (0.1, 4.0)),
    "reciprocal": (lambda x: 1 / x, (0.25, 4.0)),
    "erf": (erf64, (-3.0, 3.0)),
    "silu": (lambda x: x / (1 + np.exp(-x)), (-6.0, 6.0)),
    "square": (lambda x: x * x, (-3.0, 3.0)),
}


def assert_close(got, expected, dtype):
    rtol = {np.float16: 2e-3, np.float32: 2e-6, np.float64: 1e-12}[dtype]
    assert got.dtype == np.dtype(dtype)
    np.testing.assert_allclose(got.astype(np.float64), expected, rtol=rtol, atol=rtol)


def defined(build, *arrays):
    """(fd, outputs) of a definition with one input per array (exact shapes)."""
    with FusionDefinition() as fd:
        tvs = [fd.define_tensor(list(a.shape), DATA_TYPE[a.dtype]) for a in arrays]
        outs = build(fd, *tvs)
        for out in outs if isinstance(outs, (list, tuple)) else [outs]:
            fd.add_output(out)
    return fd, fd.execute(list(arrays))


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("shape", [(1,), (7,), (3, 37), (2, 4097)])
@pytest.mark.parametrize("name", list(UNARY))
def test_unary(rng, name, shape, dtype):
    ref, (low, high) = UNARY[name]
    x = random_array(rng, shape, dtype, low, high)
    (out,) = run_fusion(lambda fd, t: getattr(fd.ops, name)(t), x)
    assert_close(out, ref(x.astype(np.float64)), dtype)


@pytest.mark.parametrize("name", ["rsqrt", "reciprocal", "erf", "silu"])
def test_unary_of_integers_gives_float(rng, name):
    x = rng.integers(1, 6, size=(4, 5))
    (out,) = run_fusion(lambda fd, t: getattr(fd.ops, name)(t), x)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, UNARY[name][0](x.astype(np.float64)), rtol=2e-6)


def test_square_of_integers_stays_integer(rng):
    x = random_array(rng, (3, 5), np.int64)
    (out,) = run_fusion(lambda fd, t: fd.ops.square(t), x)
    np.testing.assert_array_equal(out, x * x)
    assert out.dtype == np.int64


def test_unary_special_values():
    x = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-30], np.float32)
    outs = run_fusion(lambda fd, t: [fd.ops.rsqrt(t), fd.ops.reciprocal(t), fd.ops.erf(t), fd.ops.silu(t)], x)
    with np.errstate(divide="ignore", invalid="ignore"):
        x64 = x.astype(np.float64)
        for got, exp in zip(outs, [1 / np.sqrt(x64), 1 / x64, erf64(x64), x64 / (1 + np.exp(-x64))]):
            np.testing.assert_allclose(got, exp.astype(np.float32), rtol=2e-6)


COMPARISONS = {"lt": np.less, "le": np.less_equal, "gt": np.greater, "ge": np.greater_equal, "eq": np.equal,
               "ne": np.not_equal}


@pytest.mark.parametrize("dtypes", [(np.float32, np.float32), (np.int64, np.int64), (np.int64, np.float32),
                                    (np.float16, np.float64), (np.int32, np.int64)])
@pytest.mark.parametrize("name", list(COMPARISONS))
def test_comparisons(rng, name, dtypes):
    # Values on a coarse grid, so that equal pairs occur.
    a = (rng.integers(-3, 4, size=(5, 7)) / 2).astype(dtypes[0])
    b = (rng.integers(-3, 4, size=(7,)) / 2).astype(dtypes[1])
    outs = run_fusion(lambda fd, x, y: [getattr(fd.ops, name)(x, y), getattr(fd.ops, name)(x, 0.5),
                                        getattr(fd.ops, name)(1, y)], a, b)
    f = COMPARISONS[name]
    for got, exp in zip(outs, [f(a, b), f(a, 0.5), f(1, b)]):
        assert got.dtype == np.bool_
        np.testing.assert_array_equal(got, exp)


def test_comparisons_with_nan():
    a = np.array([np.nan, 1.0, np.nan], np.float32)
    b = np.array([np.nan, np.nan, 2.0], np.float32)
    outs = run_fusion(lambda fd, x, y: [getattr(fd.ops, n)(x, y) for n in COMPARISONS], a, b)
    for got, n in zip(outs, COMPARISONS):
        np.testing.assert_array_equal(got, COMPARISONS[n](a, b), err_msg=n)


@pytest.mark.parametrize("dtype", [np.bool_, np.float32, np.int64])
def test_logical_ops(rng, dtype):
    a, b = random_array(rng, (4, 9), dtype), random_array(rng, (9,), dtype)
    if dtype != np.bool_:
        a[a > 1] = 0
        b[::3] = 0
    outs = run_fusion(lambda fd, x, y: [fd.ops.logical_and(x, y), fd.ops.logical_or(x, y), fd.ops.logical_not(x),
                                        fd.ops.logical_and(x, True), fd.ops.logical_or(False, y)], a, b)
    expected = [np.logical_and(a, b), np.logical_or(a, b), np.logical_not(a), np.logical_and(a, True),
                np.logical_or(False, b)]
    for got, exp in zip(outs, expected):
        assert got.dtype == np.bool_
        np.testing.assert_array_equal(got, exp)


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64, np.int64])
def test_where(rng, dtype):
    c = random_array(rng, (6, 1), np.bool_)
    a, b = random_array(rng, (6, 11), dtype), random_array(rng, (11,), dtype)
    outs = run_fusion(lambda fd, tc, ta, tb: [fd.ops.where(tc, ta, tb), fd.ops.where(tc, ta, 3),
                                              fd.ops.where(tc, 2, tb)], c, a, b)
    for got, exp in zip(outs, [np.where(c, a, b), np.where(c, a, dtype(3)), np.where(c, dtype(2), b)]):
        assert got.dtype == np.dtype(dtype) and got.shape == exp.shape
        np.testing.assert_array_equal(got, exp.astype(dtype))


def test_where_promotes_and_takes_numbers(rng):
    c = random_array(rng, (3, 4), np.bool_)
    i, f = random_array(rng, (3, 4), np.int64), random_array(rng, (3, 4), np.float32)
    outs = run_fusion(lambda fd, tc, ti, tf: [fd.ops.where(tc, ti, tf), fd.ops.where(tc, 1.5, 0),
                                              fd.ops.where(tc, 1, 0), fd.ops.where(fd.ops.gt(tf, 0), tf, 0.0)], c, i, f)
    assert [o.dtype for o in outs] == [np.float32, np.float32, np.int64, np.float32]
    np.testing.assert_array_equal(outs[0], np.where(c, i, f).astype(np.float32))
    np.testing.assert_array_equal(outs[1], np.where(c, 1.5, 0.0).astype(np.float32))
    np.testing.assert_array_equal(outs[2], np.where(c, 1, 0))
    np.testing.assert_array_equal(outs[3], np.maximum(f, 0))


def test_comparison_where_chain_is_one_pointwise_segment(rng):
    x = random_array(rng, (8, 13), np.float32)
    fd, (out,) = defined(lambda fd, t: fd.ops.where(fd.ops.logical_and(fd.ops.ge(t, -1.0), fd.ops.lt(t, 1.0)),
                                                   fd.ops.square(t), fd.ops.rsqrt(fd.ops.abs(t))), x)
    assert launches(fd) == ["pointwise"]
    np.testing.assert_allclose(out, np.where((x >= -1) & (x < 1), x * x, 1 / np.sqrt(np.abs(x))), rtol=2e-6)


@pytest.mark.parametrize("dtype,fill", [(DataType.Float, 2.5), (DataType.Double, -1e-3), (DataType.Half, 0.1),
                                        (DataType.Int, 7), (DataType.Bool, 1), (DataType.Int32, -4)])
def test_full(dtype, fill):
    with FusionDefinition() as fd:
        t = fd.define_tensor([2, 3])
        fd.add_output(fd.ops.full([4, 2, 3], fill, dtype))
        fd.add_output(fd.ops.add(t, fd.ops.full([3], 1.0, DataType.Float)))
    full, added = fd.execute([np.zeros((2, 3), np.float32)])
    np_dtype = {DataType.Float: np.float32, DataType.Double: np.float64, DataType.Half: np.float16,
                DataType.Int: np.int64, DataType.Bool: np.bool_, DataType.Int32: np.int32}[dtype]
    assert full.dtype == np_dtype and full.shape == (4, 2, 3)
    np.testing.assert_array_equal(full, np.full((4, 2, 3), fill, np_dtype))
    np.testing.assert_array_equal(added, np.ones((2, 3), np.float32))


def test_full_of_a_scalar_input():
    with FusionDefinition() as fd:
        s = fd.define_scalar(dtype=DataType.Double) if hasattr(fd, "define_scalar") else None
        if s is None:
            pytest.skip("no define_scalar")
        fd.add_output(fd.ops.full([3], s, DataType.Float))
    (out,) = fd.execute([1.25])
    np.testing.assert_array_equal(out, np.full(3, 1.25, np.float32))


# ---- slice, cat, stride_order -------------------------------------------------------------------
@pytest.mark.parametrize("starts,ends,strides", [
    ([0, 0], [5, 9], None), ([1, 2], [4, 9], None), ([0, 1], [5, 8], [2, 3]), ([4, 0], [5, 9], [1, 1]),
    ([2, 3], [2, 7], None)])
def test_slice(rng, starts, ends, strides):
    x = random_array(rng, (5, 9), np.float32)
    (out,) = run_fusion(lambda fd, t: fd.ops.slice(t, starts, ends, strides), x, symbolic=False)
    steps = strides or [1, 1]
    np.testing.assert_array_equal(out, x[starts[0]:ends[0]:steps[0], starts[1]:ends[1]:steps[1]])


def test_slice_with_too_few_indices_names_the_indices_given():
    """The default strides (one per axis) used to be cited as if the user had passed them."""
    with FusionDefinition() as fd:
        x = fd.define_tensor([5, 9])
        with pytest.raises(ValueError, match=r"slice\(T0\): expected 2 start and end indices \(one per axis\), "
                                             r"got 2 and 1"):
            fd.ops.slice(x, [0, 0], [1])


def test_slice_of_a_non_contiguous_input_then_pointwise(rng):
    x = random_array(rng, (8, 10), np.float64).T  # column-major view
    (out,) = run_fusion(lambda fd, t: fd.ops.mul(fd.ops.slice(t, [1, 2], [9, 7], [2, 1]), 2.0), x, symbolic=False)
    np.testing.assert_array_equal(out, 2 * x[1:9:2, 2:7])


@pytest.mark.parametrize("dim", [0, 1, -1, 2])
def test_cat(rng, dim):
    shapes = {0: [(1, 3, 4), (2, 3, 4), (3, 3, 4)], 1: [(2, 1, 4), (2, 5, 4), (2, 2, 4)],
              -1: [(2, 3, 1), (2, 3, 7), (2, 3, 2)], 2: [(2, 3, 4), (2, 3, 4), (2, 3, 3)]}[dim]
    arrays = [random_array(rng, s, np.float32) for s in shapes]
    (out,) = run_fusion(lambda fd, *ts: fd.ops.cat(list(ts), dim), *arrays, symbolic=False)
    np.testing.assert_array_equal(out, np.concatenate(arrays, axis=dim))


def test_cat_of_computed_and_sliced_values(rng):
    x = random_array(rng, (4, 6), np.float32)
    (out,) = run_fusion(lambda fd, t: fd.ops.cat([fd.ops.slice(t, [0, 3], [4, 6]), fd.ops.neg(fd.ops.slice(t, [0, 0], [4, 3]))], 1),
                        x, symbolic=False)
    np.testing.assert_array_equal(out, np.concatenate([x[:, 3:], -x[:, :3]], axis=1))


def test_cat_of_bool_and_int(rng):
    a, b = random_array(rng, (2, 3), np.bool_), random_array(rng, (1, 3), np.bool_)
    (out,) = run_fusion(lambda fd, x, y: fd.ops.cat([x, y], 0), a, b, symbolic=False)
    np.testing.assert_array_equal(out, np.concatenate([a, b]))
    i, j = random_array(rng, (2, 2), np.int64), random_array(rng, (2, 1), np.int64)
    (out,) = run_fusion(lambda fd, x, y: fd.ops.cat([x, y], 1), i, j, symbolic=False)
    np.testing.assert_array_equal(out, np.concatenate([i, j], 1))


@pytest.mark.parametrize("order", [[1, 0], [0, 1]])
def test_stride_order_2d(rng, order):
    x = random_array(rng, (5, 7), np.float32)
    (out,) = run_fusion(lambda fd, t: fd.ops.stride_order(t, order), x)
    np.testing.assert_array_equal(out, x)
    # stride_order[i]: axis i's place from the innermost (0) outwards.
    assert (out.strides[0] < out.strides[1]) == (order == [0, 1])


def test_stride_order_3d(rng):
    x = random_array(rng, (2, 3, 4), np.float64)
    (out,) = run_fusion(lambda fd, t: fd.ops.stride_order(t, [1, 2, 0]), x)
    np.testing.assert_array_equal(out, x)
    assert out.strides == (4 * 8, 8 * 8, 8)  # axis 1 outermost, then axis 0, axis 2 innermost


def test_define_tensor_stride_order_and_is_cpu(rng):
    x = np.asfortranarray(random_array(rng, (4, 6), np.float32))
    with FusionDefinition() as fd:
        t = fd.define_tensor([4, 6], DataType.Float, contiguity=[True, True], stride_order=[0, 1], is_cpu=False)
        fd.add_output(fd.ops.mul(t, 2.0))
    (out,) = fd.execute([x])
    np.testing.assert_array_equal(out, 2 * x)
    with FusionDefinition() as fd:
        t = fd.define_tensor([4, 6], DataType.Float, contiguity=[None, True])
        fd.add_output(fd.ops.neg(t))
    np.testing.assert_array_equal(fd.execute([np.ascontiguousarray(x)])[0], -x)


# ---- var_mean -----------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
@pytest.mark.parametrize("keepdim", [True, False])
@pytest.mark.parametrize("dims,correction", [([1], 0), ([1], 1), ([0], 1), ([0, 1], 0), ([-1], 0)])
def test_var_mean(rng, dims, correction, keepdim, dtype):
    x = random_array(rng, (6, 37), dtype) + 3  # an offset: a one-pass E[x^2] - E[x]^2 would lose digits
    var, mean = run_fusion(lambda fd, t: list(fd.ops.var_mean(t, dims, correction, keepdim)), x)
    x64 = x.astype(np.float64)
    tol = {np.float16: 3e-3, np.float32: 1e-5, np.float64: 1e-12}[dtype]
    assert var.dtype == mean.dtype == np.dtype(dtype)
    np.testing.assert_allclose(var, x64.var(tuple(dims), ddof=correction, keepdims=keepdim), rtol=tol, atol=tol)
    np.testing.assert_allclose(mean, x64.mean(tuple(dims), keepdims=keepdim), rtol=tol, atol=tol)


def test_var_mean_default_arguments(rng):
    x = random_array(rng, (3, 5), np.float32)
    var, mean = run_fusion(lambda fd, t: list(fd.ops.var_mean(t, [1])), x)
    np.testing.assert_allclose(var, x.astype(np.float64).var(1), rtol=1e-5)
    assert mean.shape == (3,)


# ---- uniform / normal ---------------------------------------------------------------------------
def random_fd(name, a, b, shape, dtype, seed=None, offset=None):
    with FusionDefinition() as fd:
        kw = {} if seed is None else dict(rng_seed=seed, rng_offset=offset)
        t = getattr(fd.ops, name)(a, b, shape, dtype, **kw)
        fd.add_output(fd.ops.cast(t, DataType.Float) if dtype == DataType.BFloat16 else t)
    return fd


@pytest.mark.parametrize("name", ["uniform", "normal"])
def test_random_same_seed_and_offset_same_numbers(name):
    a = random_fd(name, 0.0, 1.0, [7, 33], DataType.Float, 11, 3).execute([])[0]
    again = random_fd(name, 0.0, 1.0, [7, 33], DataType.Float, 11, 3)
    np.testing.assert_array_equal(again.execute([])[0], a)
    np.testing.assert_array_equal(again.execute([])[0], a)  # and across executions of one definition
    other_offset = random_fd(name, 0.0, 1.0, [7, 33], DataType.Float, 11, 4).execute([])[0]
    other_seed = random_fd(name, 0.0, 1.0, [7, 33], DataType.Float, 12, 3).execute([])[0]
    assert np.mean(other_offset == a) < 0.01 and np.mean(other_seed == a) < 0.01


@pytest.mark.parametrize("name", ["uniform", "normal"])
def test_random_element_depends_only_on_its_global_index(name):
    # A [4, 9] draw is the first 36 elements of a [100] draw with the same seed and offset.
    small = random_fd(name, 0.0, 1.0, [4, 9], DataType.Float, 5, 1).execute([])[0]
    flat = random_fd(name, 0.0, 1.0, [100], DataType.Float, 5, 1).execute([])[0]
    np.testing.assert_array_equal(small.ravel(), flat[:36])


@pytest.mark.parametrize("name", ["uniform", "normal"])
def test_unseeded_draws_differ_per_execution(name):
    fd = random_fd(name, 0.0, 1.0, [64], DataType.Float)
    a, b = fd.execute([])[0], fd.execute([])[0]
    assert np.mean(a == b) < 0.05
    c = random_fd(name, 0.0, 1.0, [64], DataType.Float).execute([])[0]
    assert np.mean(c == a) < 0.05 and np.mean(c == b) < 0.05


@pytest.mark.parametrize("name", ["uniform", "normal"])
def test_an_rng_offset_given_to_execute_draws_the_same_numbers_again(name):
    """execute(rng_offset=k) pins the unseeded draws (a recomputation replays them): the k-th draw is the
    one an explicit rng_offset=k would give with the default seed; without it, draws are fresh again."""
    with FusionDefinition() as fd:
        fd.add_output(getattr(fd.ops, name)(0.0, 1.0, [64], DataType.Float))
        fd.add_output(getattr(fd.ops, name)(0.0, 1.0, [64], DataType.Float))
    first, second = fd.execute([], rng_offset=12345)
    for a, b in zip(fd.execute([], rng_offset=12345), (first, second)):
        np.testing.assert_array_equal(a, b)
    seeded = random_fd(name, 0.0, 1.0, [64], DataType.Float, 0x6d657368, 12346).execute([])[0]
    np.testing.assert_array_equal(second, seeded)       # the second draw at offset + 1
    assert np.mean(fd.execute([], rng_offset=12346)[0] == first) < 0.05
    assert np.mean(fd.execute([])[0] == first) < 0.05
    for bad, error in ((1.5, TypeError), (True, TypeError), (-1, ValueError), (2 ** 53, ValueError)):
        with pytest.raises(error, match="rng_offset"):
            fd.execute([], rng_offset=bad)


def test_seed_and_offset_as_scalar_inputs():
    with FusionDefinition() as fd:
        if not hasattr(fd, "define_scalar"):
            pytest.skip("no define_scalar")
        seed, offset = fd.define_scalar(dtype=DataType.Int), fd.define_scalar(dtype=DataType.Int)
        fd.add_output(fd.ops.uniform(0.0, 1.0, [50], DataType.Float, rng_seed=seed, rng_offset=offset))
    a = fd.execute([3, 0])[0]
    np.testing.assert_array_equal(fd.execute([3, 0])[0], a)
    np.testing.assert_array_equal(a, random_fd("uniform", 0.0, 1.0, [50], DataType.Float, 3, 0).execute([])[0])
    assert np.mean(fd.execute([3, 1])[0] == a) < 0.05


@pytest.mark.parametrize("dtype", [DataType.Float, DataType.Double, DataType.Half, DataType.BFloat16])
@pytest.mark.parametrize("low,high", [(0.0, 1.0), (2.0, 5.0), (-3.0, -1.0)])
def test_uniform_statistics_and_range(dtype, low, high):
    n = 1 << 18
    u = random_fd("uniform", low, high, [n], dtype, 7, 2).execute([])[0].astype(np.float64)
    # [minval, maxval): rounding to a narrow dtype must not reach maxval.
    assert u.min() >= low and u.max() < high, (u.min(), u.max())
    width = high - low
    assert abs(u.mean() - (low + high) / 2) < 5 * width * np.sqrt(1 / 12 / n) + (width / 256 if dtype == DataType.BFloat16 else 0)
    assert abs(u.var() / (width * width / 12) - 1) < 0.02
    hist, _ = np.histogram(u, bins=16, range=(low, high))
    assert hist.min() > 0.9 * n / 16 and hist.max() < 1.1 * n / 16


@pytest.mark.parametrize("dtype", [DataType.Float, DataType.Double, DataType.Half, DataType.BFloat16])
def test_normal_statistics(dtype):
    n = 1 << 18
    z = random_fd("normal", 1.5, 2.0, [n], dtype, 9, 0).execute([])[0].astype(np.float64)
    assert np.isfinite(z).all()
    assert abs(z.mean() - 1.5) < 5 * 2.0 / np.sqrt(n) + 0.01
    assert abs(z.std() / 2.0 - 1) < 0.01
    s = (z - 1.5) / 2.0
    assert abs(np.mean(np.abs(s) < 1) - 0.6827) < 0.01  # the shape, not only the moments
    assert abs(np.mean(s ** 3)) < 0.05 and abs(np.mean(s ** 4) - 3) < 0.1


def test_random_fuses_with_pointwise_consumers(rng):
    x = random_array(rng, (5, 8), np.float32)
    with FusionDefinition() as fd:
        t = fd.define_tensor([5, 8])
        fd.add_output(fd.ops.mul(t, fd.ops.lt(fd.ops.uniform(0.0, 1.0, [5, 8], DataType.Float, rng_seed=1, rng_offset=0), 0.5)))
    (out,) = fd.execute([x])
    u = random_fd("uniform", 0.0, 1.0, [5, 8], DataType.Float, 1, 0).execute([])[0]
    np.testing.assert_array_equal(out, x * (u < 0.5))


@pytest.mark.parametrize("dtype", [DataType.Float, DataType.Double], ids=["float", "double"])
@pytest.mark.parametrize("shape", [[17], [1000], [3, 1001], [2, 5, 7]], ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("name", ["uniform", "normal"])
def test_random_matches_the_numpy_philox(name, shape, dtype):
    # philox_reference.py re-implements the stream in numpy: a Float uniform is word g % 4 of counter
    # g / 4, a Double uniform and a Float normal two words of counter g / 2, a Double normal counter g.
    seed, offset = (1 << 40) + 3, (1 << 33) + 7
    a, b = (-2.0, 3.0) if name == "uniform" else (1.0, 2.0)
    got = random_fd(name, a, b, shape, dtype, seed, offset).execute([])[0]
    want = getattr(philox_reference, name)(shape, a, b, dtype == DataType.Double, seed, offset)
    assert got.dtype == want.dtype
    if name == "uniform":
        np.testing.assert_array_equal(got, want)
    else:  # numpy's log and cos are not the C library's: to a few ulp
        tol = 1e-13 if dtype == DataType.Double else 4e-6
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", [DataType.Float, DataType.Double], ids=["float", "double"])
def test_broadcast_draw_matches_the_numpy_philox(dtype):
    # The draw is recomputed inside a larger program (its global indices repeat across the new
    # axis and do not follow the program's): each copy is the [6, 1001] draw.
    np_dtype = np.float64 if dtype == DataType.Double else np.float32
    with FusionDefinition() as fd:
        t = fd.define_tensor([4, 6, 1001], dtype=dtype)
        fd.add_output(fd.ops.add(t, fd.ops.uniform(0.0, 1.0, [6, 1001], dtype, rng_seed=5, rng_offset=9)))
    (out,) = fd.execute([np.zeros([4, 6, 1001], dtype=np_dtype)])
    want = philox_reference.uniform([6, 1001], 0.0, 1.0, dtype == DataType.Double, 5, 9)
    np.testing.assert_array_equal(out, np.broadcast_to(want, out.shape))


# ---- errors before any kernel runs --------------------------------------------------------------
def _define(build, shapes, dtypes=None):
    with FusionDefinition() as fd:
        tvs = [fd.define_tensor(s, (dtypes or [DataType.Float] * len(shapes))[i]) for i, s in enumerate(shapes)]
        build(fd, *tvs)


@pytest.mark.parametrize("build,shapes,dtypes,error,match", [
    (lambda fd, t: fd.ops.var_mean(t, [2]), [[3, 4]], None, ValueError, "out of range"),
    (lambda fd, t: fd.ops.var_mean(t, [1]), [[3, 4]], [DataType.Bool], TypeError, "floating point"),
    (lambda fd, t: fd.ops.var_mean(t, [1]), [[3, 4]], [DataType.Int], TypeError, "floating point"),
    (lambda fd, t: fd.ops.var_mean(t, [1], -1), [[3, 4]], None, ValueError, "correction"),
    (lambda fd, t: fd.ops.sum(t, [3]), [[3, 4]], None, ValueError, "out of range"),
    (lambda fd, t: fd.ops.slice(t, [0, 0], [4, 4]), [[3, 4]], None, ValueError, "out of range"),
    (lambda fd, t: fd.ops.slice(t, [-1, 0], [3, 4]), [[3, 4]], None, ValueError, "out of range"),
    (lambda fd, t: fd.ops.slice(t, [2, 0], [1, 4]), [[3, 4]], None, ValueError, "out of range"),
    (lambda fd, t: fd.ops.slice(t, [0], [3]), [[3, 4]], None, ValueError, "one per axis"),
    (lambda fd, t: fd.ops.slice(t, [0, 0], [3, 4], [1, 0]), [[3, 4]], None, ValueError, "step"),
    (lambda fd, t: fd.ops.slice(t, [0, 0.5], [3, 4]), [[3, 4]], None, TypeError, "integer"),
    (lambda fd, t, u: fd.ops.cat([t, u], 0), [[3, 4], [3, 5]], None, ValueError, "differs"),
    (lambda fd, t, u: fd.ops.cat([t, u], 0), [[3, 4], [3, 4]], [DataType.Float, DataType.Half], ValueError, "dtype"),
    (lambda fd, t, u: fd.ops.cat([t, u], 0), [[3, 4], [4]], None, ValueError, "rank"),
    (lambda fd, t, u: fd.ops.cat([t, u], 2), [[3, 4], [3, 4]], None, ValueError, "out of range"),
    (lambda fd, t: fd.ops.cat([], 0), [[3, 4]], None, ValueError, "at least one"),
    (lambda fd, t: fd.ops.cat([t, 1.0], 0), [[3, 4]], None, TypeError, "TensorView"),
    (lambda fd, t: fd.ops.where(t, t, 0.0), [[3, 4]], None, TypeError, "Bool"),
    (lambda fd, t: fd.ops.where(t, t, 0.0), [[3, 4]], [DataType.Int], TypeError, "Bool"),
    (lambda fd, t: fd.ops.where(True, 1.0, 0.0), [[3, 4]], None, ValueError, "TensorView"),
    (lambda fd, t, u: fd.ops.where(t, u, 0.0), [[3, 4], [5]], [DataType.Bool, DataType.Float], ValueError, "extent"),
    (lambda fd, t, u: fd.ops.lt(t, u), [[3, 4], [3]], None, ValueError, "extent"),
    (lambda fd, t: fd.ops.uniform(0.0, 1.0, [3], DataType.Int), [[3]], None, TypeError, "floating point"),
    (lambda fd, t: fd.ops.uniform(0.0, 1.0, [3], DataType.Bool), [[3]], None, TypeError, "floating point"),
    (lambda fd, t: fd.ops.normal(0.0, 1.0, [3], DataType.Int32), [[3]], None, TypeError, "floating point"),
    (lambda fd, t: fd.ops.uniform(t, 1.0, [3], DataType.Float), [[3]], None, TypeError, "number or Scalar"),
    (lambda fd, t: fd.ops.uniform(0.0, 1.0, [3], DataType.Float, rng_seed=1), [[3]], None, ValueError, "both"),
    (lambda fd, t: fd.ops.uniform(0.0, 1.0, [-1], DataType.Float), [[3]], None, ValueError, "known extents"),
    (lambda fd, t: fd.ops.full([2], t, DataType.Float), [[3]], None, TypeError, "number or Scalar"),
    (lambda fd, t: fd.ops.full([2], 1.0, "float"), [[3]], None, TypeError, "DataType"),
    (lambda fd, t: fd.ops.stride_order(t, [0, 0]), [[3, 4]], None, ValueError, "twice"),
    (lambda fd, t: fd.ops.stride_order(t, [0]), [[3, 4]], None, ValueError, "entries"),
    (lambda fd, t: fd.ops.rsqrt(1.0), [[3]], None, TypeError, "TensorView"),
])
def test_bad_input_raises_at_definition(build, shapes, dtypes, error, match):
    with pytest.raises(error, match=match):
        _define(build, shapes, dtypes)


def test_define_tensor_bad_stride_order_and_is_cpu():
    with FusionDefinition() as fd:
        with pytest.raises(ValueError, match="permutation"):
            fd.define_tensor([3, 4], stride_order=[0, 2])
        with pytest.raises(TypeError, match="is_cpu"):
            fd.define_tensor([3, 4], is_cpu="yes")


def test_execute_with_wrong_rank_or_dtype_raises_before_running(rng):
    fd = FusionDefinition()
    with fd:
        t = fd.define_tensor([-1, -1])
        var, mean = fd.ops.var_mean(t, [1], 0, True)
        fd.add_output(fd.ops.mul(fd.ops.sub(t, mean), fd.ops.rsqrt(fd.ops.add(var, 1e-5))))
    with pytest.raises(ValueError):
        fd.execute([random_array(rng, (3,), np.float32)])
    with pytest.raises((TypeError, ValueError)):
        fd.execute([random_array(rng, (3, 4), np.bool_)])
