"""Turning Python values into IR operands: Vals pass through, Python and numpy numbers become
constant Scalars of the fusion they are combined with."""
import numbers

import numpy as np

from . import _C
from ._arrays import NUMPY_DTYPES

DataType = _C.DataType


def is_number(x):
    return isinstance(x, (numbers.Real, np.number, np.bool_)) and not isinstance(x, (complex, np.complexfloating))


def dtype_of_number(x):
    """The DataType a Python/numpy number has as a constant (bool, int -> Int, float -> Double)."""
    if isinstance(x, np.generic):
        dtype = NUMPY_DTYPES.get(x.dtype)
        if dtype is None:
            raise TypeError(f"numpy scalar of dtype {x.dtype} is not supported as an operand")
        return dtype
    if isinstance(x, bool):
        return DataType.Bool
    if isinstance(x, numbers.Integral):
        return DataType.Int
    return DataType.Double


# Scalars travel as doubles (IR constants, execute's scalar arguments): integers beyond 2**53 would be
# rounded, silently.
EXACT_INTEGER_LIMIT = 2 ** 53


def exact_float(x, what):
    """float(x), refusing an integer that a double cannot hold exactly."""
    if isinstance(x, (numbers.Integral, np.integer)) and not isinstance(x, (bool, np.bool_)) \
            and abs(int(x)) > EXACT_INTEGER_LIMIT:
        raise ValueError(f"{what}: the integer {int(x)} is beyond 2**53, which meshfuse's scalars (doubles) "
                         f"cannot hold exactly; pass it in a tensor instead")
    return float(x)


def as_operand(owner, x, op):
    """x as a Val of owner's fusion (a number becomes a constant there)."""
    if isinstance(x, _C.Val):
        return x
    if is_number(x):
        return _C.ops.constant(owner, exact_float(x, f"{op}: constant"), dtype_of_number(x))
    raise TypeError(f"{op}: operands must be TensorViews, Scalars or numbers, got {type(x).__name__}")


def _binary(op_name):
    op = getattr(_C.ops, op_name)

    def forward(a, b):
        if not (isinstance(b, _C.Val) or is_number(b)):
            return NotImplemented
        return op(a, as_operand(a, b, op_name))

    def reflected(a, b):
        if not is_number(b):
            return NotImplemented
        return op(as_operand(a, b, op_name), a)

    return forward, reflected


def install_tensor_view_operators():
    """`x + y`, `2 * x`, `-x`, `x ** 2`, ... on TensorViews, appending to x's fusion."""
    for dunder, op_name in (("add", "add"), ("sub", "sub"), ("mul", "mul"), ("truediv", "div"), ("pow", "pow")):
        forward, reflected = _binary(op_name)
        setattr(_C.TensorView, f"__{dunder}__", forward)
        setattr(_C.TensorView, f"__r{dunder}__", reflected)
    _C.TensorView.__neg__ = lambda x: _C.ops.neg(x)
    _C.TensorView.__abs__ = lambda x: _C.ops.abs(x)
