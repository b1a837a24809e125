"""The README's numeric rules, where a fusion once gave another answer than numpy: scalars held as
their dtype holds them, each op's result in its dtype's range and precision whatever else the fusion
computes (Int32 wraps, Int64 stays exact, Float overflows), Half keeping float32 precision between
fused ops (as nvFuser), abs(-0.0), full(0.5, Bool), a max over an empty axis and var_mean's correction
beyond the count, each against numpy on the CPU."""
import numpy as np
import pytest
from conftest import run_fusion

from meshfuse import DataType, FusionDefinition

INT32_MAX = np.iinfo(np.int32).max


def _plus_scalar(value, scalar_dtype, as_input):
    """A Double zero plus a scalar of scalar_dtype, a constant or a scalar input."""
    with FusionDefinition() as fd:
        x = fd.define_tensor([1], DataType.Double)
        s = fd.define_scalar(dtype=scalar_dtype) if as_input else fd.define_scalar(value, dtype=scalar_dtype)
        fd.add_output(fd.ops.add(x, s))
    return fd.execute([np.zeros(1)] + ([value] if as_input else []))[0][0]


@pytest.mark.parametrize("as_input", [False, True], ids=["constant", "input"])
@pytest.mark.parametrize("value, dtype, expected", [
    (0.1, DataType.Float, float(np.float32(0.1))),
    (0.1, DataType.Half, float(np.float16(0.1))),
    (0.1, DataType.BFloat16, 0.10009765625),
    (1e6, DataType.Half, np.inf),
    (0.5, DataType.Bool, 1.0),
    (0.0, DataType.Bool, 0.0),
    (0.1, DataType.Double, 0.1),
])
def test_a_scalar_is_held_as_its_dtype_holds_it(value, dtype, expected, as_input):
    assert _plus_scalar(value, dtype, as_input) == expected


def test_an_int32_scalar_beyond_its_range_is_refused():
    with pytest.raises(ValueError, match=r"Int32 constant must be within \[-2\*\*31, 2\*\*31\), got 1099511627776"):
        _plus_scalar(2 ** 40, DataType.Int32, as_input=False)
    with pytest.raises(ValueError, match=r"Int32 scalar; got 2147483648, beyond Int32's range"):
        _plus_scalar(2 ** 31, DataType.Int32, as_input=True)
    assert _plus_scalar(-2 ** 31, DataType.Int32, as_input=True) == -2 ** 31


def test_full_of_a_fraction_as_bool_is_true():
    with FusionDefinition() as fd:
        fd.add_output(fd.ops.full([3], 0.5, DataType.Bool))
        fd.add_output(fd.ops.full([3], 0.0, DataType.Bool))
    yes, no = fd.execute([])
    np.testing.assert_array_equal(yes, np.full(3, 0.5).astype(bool))
    np.testing.assert_array_equal(no, np.zeros(3, bool))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_abs_of_negative_zero_is_positive_zero(dtype):
    x = np.array([-0.0, 0.0, -2.5, np.nan], dtype)
    absolute, inverse = run_fusion(lambda fd, t: [fd.ops.abs(t), fd.ops.reciprocal(fd.ops.abs(t))], x)
    np.testing.assert_array_equal(np.signbit(absolute), np.signbit(np.abs(x)))
    with np.errstate(divide="ignore"):
        np.testing.assert_array_equal(inverse, 1 / np.abs(x))


def test_int32_intermediates_wrap_as_int32_arithmetic_does():
    """x + 1 at INT32_MAX is INT32_MIN, also where the fusion goes on computing with it (it stayed
    2**31 in the int64 computation: lt(x + 1, 0) was False), and x * x of 65536 is 0 before a cast."""
    x = np.array([INT32_MAX, 5], np.int32)
    y, negative = run_fusion(lambda fd, t: [fd.ops.add(t, 1), fd.ops.lt(fd.ops.add(t, 1), 0)], x)
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(y, x + np.int32(1))
        np.testing.assert_array_equal(negative, (x + np.int32(1)) < 0)
    big = np.array([65536, 3], np.int32)
    (wide,) = run_fusion(lambda fd, t: fd.ops.cast(fd.ops.mul(t, t), DataType.Int), big)
    np.testing.assert_array_equal(wide, (big * big).astype(np.int64))


def test_an_int64_result_stays_exact_next_to_floating_ops():
    """A floating op in the same fusion made the segment compute in double: 2**62 + 1 + 1 lost its
    low bits (...904 instead of ...906)."""
    x = np.array([2 ** 62 + 1, -7], np.int64)
    y, half = run_fusion(lambda fd, t: [fd.ops.add(t, 1), fd.ops.div(t, 2)], x)
    np.testing.assert_array_equal(y, x + 1)
    np.testing.assert_allclose(half, x / 2)


def test_a_float_result_overflows_whatever_else_the_fusion_computes():
    """(x * x) / x of a Float 1e20 is inf (x * x overflows float32), also next to a Double output,
    which made the whole segment compute in double (1e20)."""
    x = np.array([1e20, 3.0], np.float32)
    d = np.array([1.0, 2.0])
    with np.errstate(over="ignore"):
        expected = (x * x) / x
    (alone,) = run_fusion(lambda fd, t: fd.ops.div(fd.ops.mul(t, t), t), x)
    with_double = run_fusion(lambda fd, t, u: [fd.ops.div(fd.ops.mul(t, t), t), fd.ops.add(u, 1.0)], x, d)[0]
    np.testing.assert_array_equal(alone, expected)
    np.testing.assert_array_equal(with_double, expected)


def test_half_intermediates_keep_float32_precision_within_a_fusion():
    """As in nvFuser's fused kernels (README): a Half value between two ops of one fusion is not rounded,
    so (x * x) / x of 300 is 300 where torch eager's rounded x * x is inf."""
    x = np.array([300.0, 2.0], np.float16)
    (y,) = run_fusion(lambda fd, t: fd.ops.div(fd.ops.mul(t, t), t), x)
    np.testing.assert_array_equal(y, x)


@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32])
def test_a_max_over_an_empty_axis_raises_as_numpy_does(fused, dtype):
    x = np.zeros((0, 3), dtype)
    with pytest.raises(ValueError, match="reducing an axis of extent 0 has no identity"):
        run_fusion(lambda fd, t: fd.ops.max(fd.ops.add(t, 1) if fused else t, [0]), x)
    (empty,) = run_fusion(lambda fd, t: fd.ops.max(fd.ops.add(t, 1) if fused else t, [1]), x)
    assert empty.shape == (0,)


@pytest.mark.parametrize("symbolic", [False, True])
def test_var_mean_with_a_correction_beyond_the_count_divides_by_zero(symbolic):
    """max(N - correction, 0), as torch: a symbolic count gave a negative variance (N - 3 = -1)."""
    x = np.array([[1.0, 2.0], [3.0, 7.0]])
    var, _ = run_fusion(lambda fd, t: list(fd.ops.var_mean(t, [1], correction=3)), x, symbolic=symbolic)
    np.testing.assert_array_equal(var, [np.inf, np.inf])
    empty = np.zeros((2, 0))
    with np.errstate(invalid="ignore", divide="ignore"):
        var, _ = run_fusion(lambda fd, t: list(fd.ops.var_mean(t, [1], correction=1)), empty, symbolic=symbolic)
    assert np.isnan(var).all()


def test_negating_a_bool_is_refused_as_numpy_and_torch_do():
    """neg of a Bool returned it unchanged (-True is not a Bool)."""
    with pytest.raises(ValueError, match=r"neg: T0 is Bool, which has no negation; use logical_not\(T0\)"):
        with FusionDefinition() as fd:
            fd.add_output(fd.ops.neg(fd.define_tensor([2], DataType.Bool)))


@pytest.mark.parametrize("np_dtype", [np.int64, np.int32, np.bool_])
@pytest.mark.parametrize("op", ["logical_and", "logical_or"])
@pytest.mark.parametrize("constant", [0.5, -0.25, 2.5, 0.0])
def test_a_logical_op_tests_a_fractional_constant_itself_for_zero(np_dtype, op, constant):
    # An integer program held the constant as an integer: 0.5 became 0, so logical_or(0, 0.5) was
    # False (numpy and torch: True). Alone, and fused after an integer op.
    x = np.array([0, 1, 0, 1], dtype=np_dtype)
    (alone,) = run_fusion(lambda fd, t: getattr(fd.ops, op)(t, constant), x)
    np.testing.assert_array_equal(alone, getattr(np, op)(x, constant))
    if np_dtype != np.bool_:
        (fused,) = run_fusion(lambda fd, t: getattr(fd.ops, op)(fd.ops.mul(t, 1), constant), x)
        np.testing.assert_array_equal(fused, getattr(np, op)(x, constant))
