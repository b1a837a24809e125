"""FusionDefinition: the nvFuser-style way to write a meshfuse program.

Two styles:

    with FusionDefinition(backend_type=CommunicatorBackend.mpi) as fd:
        x = fd.define_tensor([-1, 8])
        fd.add_output(fd.ops.relu(x))
    (y,) = fd.execute([x_np])

    class Relu(FusionDefinition):
        def definition(self):
            self.add_output(self.ops.relu(self.define_tensor([-1, 8])))
    fd = Relu()          # the definition is built on first use
    (y,) = fd.execute([x_np])

Each instance has its own fusion, executor cache and parameters (backend, streams, timeout): there
is no global state, and instances can execute from different threads at once. Executions over
several ranks take turns within a process (their collectives share the world), and every rank must
call them in the same order: a step at which ranks execute different definitions raises ValueError
on every rank.
"""
import datetime
import numbers
import re
import threading

import numpy as np

from . import _arrays, _C, _validation
from ._operands import (EXACT_INTEGER_LIMIT, dtype_of_number, exact_float, install_tensor_view_operators,
                        is_number)

DataType = _C.DataType
CommunicatorBackend = _C.CommunicatorBackend

install_tensor_view_operators()


def _check_backend(backend):
    if not isinstance(backend, CommunicatorBackend):
        raise TypeError(f"backend must be a CommunicatorBackend, got {type(backend).__name__}")
    if backend == CommunicatorBackend.auto:
        return
    # why_unavailable loads only this backend's plugin (UCC's loads UCX: backend_plugins.h says why).
    why = _C.Communicator.instance().why_unavailable(backend)
    if why:
        names = ", ".join(b.name for b in _C.Communicator.instance().available_backends())
        raise ValueError(f"communicator backend {backend.name} is {why}; available: {names}")


def _int_list(values, what):
    try:
        items = list(values)
    except TypeError:
        raise TypeError(f"{what} must be a sequence of integers, got {type(values).__name__}") from None
    for i, e in enumerate(items):
        if isinstance(e, bool) or not hasattr(e, "__index__"):
            raise TypeError(f"{what}[{i}] must be an integer, got {type(e).__name__} {e!r}")
    return [int(e) for e in items]


# The executor waits in whole milliseconds, and the binding converts through int64 microseconds.
_MIN_TIMEOUT = datetime.timedelta(milliseconds=1)
_MAX_TIMEOUT = datetime.timedelta(days=100000)


def _timeout(value):
    """timeout= as a timedelta. A zero or negative one (or one under a millisecond, which truncates to
    zero) would make every multi-rank execute fail at once with a CommunicationTimeout."""
    if isinstance(value, datetime.timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, (bool, np.bool_)) or not is_number(value):
        raise TypeError(f"timeout must be a number of seconds or a datetime.timedelta, got {type(value).__name__} "
                        f"{value!r}")
    else:
        seconds = float(value)
    if not seconds > 0:  # also NaN
        raise ValueError(f"timeout must be a positive number of seconds, got {value!r}")
    if seconds < _MIN_TIMEOUT.total_seconds():
        raise ValueError(f"timeout must be at least 0.001 s (the executor waits in whole milliseconds), got {value!r}")
    if seconds >= _MAX_TIMEOUT.total_seconds():  # inf included: the longest, as MESHFUSE_TIMEOUT has it
        return _MAX_TIMEOUT
    return value if isinstance(value, datetime.timedelta) else datetime.timedelta(seconds=seconds)


class _Ops:
    """fd.ops: each op checks its operands belong to this definition, then appends one expression."""

    def __init__(self, fd):
        self._fd = fd

    def _tensor(self, x, op, what="x"):
        self._fd._check_mutable(op)
        if not isinstance(x, _C.TensorView):
            raise TypeError(f"{op}: {what} must be a TensorView, got {type(x).__name__}")
        self._fd._check_owned(x, op)
        return x

    def _operand(self, x, op):
        if isinstance(x, _C.Val):
            self._fd._check_owned(x, op)
            return x
        if is_number(x):
            return self._fd._fusion.new_scalar(dtype_of_number(x), exact_float(x, f"{op}: constant"))
        raise TypeError(f"{op}: operands must be TensorViews, Scalars or numbers, got {type(x).__name__}")

    def _unary(name):
        def op(self, x):
            return getattr(_C.ops, name)(self._tensor(x, name))

        op.__name__ = name
        op.__doc__ = f"Elementwise {name}(x)."
        return op

    def _binary(name):
        def op(self, a, b):
            self._fd._check_mutable(name)
            if not isinstance(a, _C.TensorView) and not isinstance(b, _C.TensorView):
                raise ValueError(f"{name}: at least one operand must be a TensorView, got "
                                 f"{type(a).__name__} and {type(b).__name__}")
            return getattr(_C.ops, name)(self._operand(a, name), self._operand(b, name))

        op.__name__ = name
        op.__doc__ = f"Elementwise {name}(a, b) with numpy broadcasting; numbers become constants."
        return op

    neg = _unary("neg")
    abs = _unary("abs")
    exp = _unary("exp")
    log = _unary("log")
    sqrt = _unary("sqrt")
    relu = _unary("relu")
    sigmoid = _unary("sigmoid")
    tanh = _unary("tanh")
    gelu = _unary("gelu")
    rsqrt = _unary("rsqrt")
    reciprocal = _unary("reciprocal")
    erf = _unary("erf")
    silu = _unary("silu")
    square = _unary("square")
    logical_not = _unary("logical_not")
    add = _binary("add")
    sub = _binary("sub")
    mul = _binary("mul")
    div = _binary("div")
    maximum = _binary("maximum")
    minimum = _binary("minimum")
    pow = _binary("pow")
    lt = _binary("lt")
    le = _binary("le")
    gt = _binary("gt")
    ge = _binary("ge")
    eq = _binary("eq")
    ne = _binary("ne")
    logical_and = _binary("logical_and")
    logical_or = _binary("logical_or")
    del _unary, _binary

    def where(self, cond, a, b):
        """a where cond is true, else b (numpy broadcasting; a and b may be numbers)."""
        self._fd._check_mutable("where")
        if not any(isinstance(v, _C.TensorView) for v in (cond, a, b)):
            raise ValueError("where: at least one operand must be a TensorView")
        cond, a, b = (self._operand(v, "where") for v in (cond, a, b))
        if cond.dtype != DataType.Bool:
            raise TypeError(f"where: the condition {cond.name} must be Bool, got {cond.dtype.name} "
                            f"(compare it first, e.g. fd.ops.ne(x, 0))")
        return _C.ops.where(cond, a, b)

    def _scalar(self, x, op, what):
        """A number or Scalar of this definition as a Scalar (tensors are refused)."""
        if isinstance(x, _C.TensorView):
            raise TypeError(f"{op}: {what} must be a number or Scalar, got TensorView {x.name}")
        if not isinstance(x, _C.Val) and not is_number(x):
            raise TypeError(f"{op}: {what} must be a number or Scalar, got {type(x).__name__}")
        return self._operand(x, op)

    def full(self, shape, fill_value, dtype):
        """A tensor of `shape` filled with fill_value (a number or Scalar)."""
        self._fd._check_mutable("full")
        if not isinstance(dtype, DataType):
            raise TypeError(f"full: dtype must be a DataType, got {type(dtype).__name__}")
        return _C.ops.full(_int_list(shape, "full: shape"), self._scalar(fill_value, "full", "fill_value"), dtype)

    def _random(self, name, a, b, shape, dtype, rng_seed, rng_offset, names):
        self._fd._check_mutable(name)
        if not isinstance(dtype, DataType):
            raise TypeError(f"{name}: dtype must be a DataType, got {type(dtype).__name__}")
        if dtype not in (DataType.Float, DataType.Double, DataType.Half, DataType.BFloat16):
            raise TypeError(f"{name}: dtype must be floating point, got {dtype.name}")
        if (rng_seed is None) != (rng_offset is None):
            raise ValueError(f"{name}: give both rng_seed and rng_offset, or neither")
        seed = offset = None
        if rng_seed is not None:
            seed = self._scalar(rng_seed, name, "rng_seed")
            offset = self._scalar(rng_offset, name, "rng_offset")
        return getattr(_C.ops, name)(self._scalar(a, name, names[0]), self._scalar(b, name, names[1]),
                                     _int_list(shape, f"{name}: shape"), dtype, seed, offset)

    def uniform(self, minval, maxval, shape, dtype=DataType.Float, rng_seed=None, rng_offset=None):
        """Uniform random numbers in [minval, maxval) (Philox 4x32-10, counter-based): the same
        (rng_seed, rng_offset) give the same tensor on CPU and CUDA, and a sharded output holds its
        block of the one global tensor. Without a seed, each execution draws fresh numbers. Element g
        (row-major in the global tensor) is word g % 4 of Philox counter g / 4 (a Double: 53 bits from
        two words of counter g / 2)."""
        if is_number(minval) and is_number(maxval) and not minval <= maxval:
            raise ValueError(f"uniform: minval {minval} is greater than maxval {maxval}")
        return self._random("uniform", minval, maxval, shape, dtype, rng_seed, rng_offset, ("minval", "maxval"))

    def normal(self, mean, std, shape, dtype=DataType.Float, rng_seed=None, rng_offset=None):
        """Normal random numbers (Box-Muller over Philox 4x32-10, the cosine half): element g takes
        two words of counter g / 2 (a Double: the four of counter g); see uniform()."""
        if is_number(std) and not std >= 0:  # also NaN
            raise ValueError(f"normal: std must be non-negative, got {std}")
        return self._random("normal", mean, std, shape, dtype, rng_seed, rng_offset, ("mean", "std"))

    def var_mean(self, x, dims, correction=0, keepdim=False):
        """(variance, mean) of x over `dims`; the variance divides by N - correction."""
        x = self._tensor(x, "var_mean")
        if x.dtype not in (DataType.Float, DataType.Double, DataType.Half, DataType.BFloat16):
            raise TypeError(f"var_mean: {x.name} must be floating point, got {x.dtype.name}")
        if isinstance(correction, bool) or not hasattr(correction, "__index__") and not (
                is_number(correction) and float(correction).is_integer()):
            raise TypeError(f"var_mean: correction must be an integer (N - correction divides), got {correction!r}")
        if int(correction) < 0:
            raise ValueError(f"var_mean: correction must be non-negative, got {correction}")
        var, mean = _C.ops.var_mean(x, self._axes(dims), int(correction), bool(keepdim))
        return var, mean

    _FLOATS = (DataType.Float, DataType.Double, DataType.Half, DataType.BFloat16)

    def _attention_tensors(self, op, named):
        """The tensor operands, checked: TensorViews of this definition, floating point, one dtype."""
        for what, t in named:
            self._tensor(t, op, what)
        first_name, first = named[0]
        if first.dtype not in self._FLOATS:
            raise TypeError(f"{op}: {first_name} {first.name} must be floating point, got {first.dtype.name}")
        for what, t in named[1:]:
            if t.dtype != first.dtype:
                raise TypeError(f"{op}: operands must share one dtype: {first_name} {first.name} is "
                                f"{first.dtype.name} but {what} {t.name} is {t.dtype.name}")

    def _attention_scalars(self, op, dropout_p, is_causal, scale):
        if dropout_p is not None and is_number(dropout_p):
            if not 0.0 <= float(dropout_p) < 1.0:
                raise ValueError(f"{op}: dropout_p must be in [0, 1), got {dropout_p}")
            dropout_p = self._fd._fusion.new_scalar(DataType.Double, float(dropout_p))
        if is_causal is not None and is_number(is_causal):
            is_causal = self._fd._fusion.new_scalar(DataType.Bool, float(bool(is_causal)))
        if scale is not None and is_number(scale):
            scale = self._fd._fusion.new_scalar(DataType.Double, float(scale))
        return tuple(None if x is None else self._scalar(x, op, what)
                     for x, what in ((dropout_p, "dropout_p"), (is_causal, "is_causal"), (scale, "scale")))

    def sdpfa_fwd(self, query, key, value, dropout_p=None, is_causal=None, scale=None):
        """Fused attention softmax(q k^T * scale) v (nvFuser's sdpfa_fwd): q [b, h, s_q, d], k [b, h, s_kv, d],
        v [b, h, s_kv, d_v]. Returns (out [b, h, s_q, d_v], log_sumexp [b, h, s_q] Float, philox_seed,
        philox_offset), the last two 0-dim Int tensors that make the dropout mask reproducible. On CPU
        tensors the mask keeps element (b, h, i, j) where fd.ops.uniform over [b, h, s_q, s_kv] with that
        seed and offset is >= dropout_p; on CUDA tensors cuDNN draws it in-kernel from the same pair, in
        a layout of its own (the CPU's mask with MESHFUSE_ATTENTION_RNG=meshfuse: README's settings).
        Defaults: dropout_p 0, is_causal False (top-left aligned), scale 1/sqrt(d)."""
        self._attention_tensors("sdpfa_fwd", [("query", query), ("key", key), ("value", value)])
        dropout_p, is_causal, scale = self._attention_scalars("sdpfa_fwd", dropout_p, is_causal, scale)
        return _C.ops.sdpfa_fwd(query, key, value, dropout_p, is_causal, scale)

    def sdpfa_bwd(self, grad_output, query, key, value, output, log_sumexp, dropout_p, is_causal, philox_seed,
                  philox_offset, scale=None):
        """(grad_query, grad_key, grad_value) of sdpfa_fwd (nvFuser's sdpfa_bwd), from its out, log_sumexp,
        philox_seed and philox_offset."""
        op = "sdpfa_bwd"
        self._attention_tensors(op, [("grad_output", grad_output), ("query", query), ("key", key),
                                     ("value", value), ("output", output)])
        for what, t in (("log_sumexp", log_sumexp), ("philox_seed", philox_seed), ("philox_offset", philox_offset)):
            self._tensor(t, op, what)
        if log_sumexp.dtype != DataType.Float:
            raise TypeError(f"{op}: log_sumexp {log_sumexp.name} must be Float, got {log_sumexp.dtype.name}")
        dropout_p, is_causal, scale = self._attention_scalars(op, dropout_p, is_causal, scale)
        return _C.ops.sdpfa_bwd(grad_output, query, key, value, output, log_sumexp, dropout_p, is_causal,
                                philox_seed, philox_offset, scale)

    def slice(self, x, start_indices, end_indices, strides=None):
        """x[start:end:stride] on every axis (nvFuser's slice)."""
        x = self._tensor(x, "slice")
        starts = _int_list(start_indices, "slice: start_indices")
        ends = _int_list(end_indices, "slice: end_indices")
        if len(starts) != x.ndim or len(ends) != x.ndim:  # said here: the default strides are not the user's
            raise ValueError(f"slice({x.name}): expected {x.ndim} start and end indices (one per axis), got "
                             f"{len(starts)} and {len(ends)}")
        steps = [1] * x.ndim if strides is None else _int_list(strides, "slice: strides")
        return _C.ops.slice(x, starts, ends, steps)

    def cat(self, tensors, dim):
        """The tensors joined along `dim` (same dtype, same extents elsewhere)."""
        self._fd._check_mutable("cat")
        items = list(tensors)
        if not items:
            raise ValueError("cat: needs at least one tensor")
        for t in items:
            self._tensor(t, "cat", "tensors[i]")
        return _C.ops.cat(items, int(dim))

    def stride_order(self, x, stride_order):
        """A copy of x laid out so that axis i has the stride_order[i]-th smallest stride."""
        return _C.ops.stride_order(self._tensor(x, "stride_order"), _int_list(stride_order, "stride_order"))

    def cast(self, x, dtype):
        if not isinstance(dtype, DataType):
            raise TypeError(f"cast: dtype must be a DataType, got {type(dtype).__name__}")
        return _C.ops.cast(self._tensor(x, "cast"), dtype)

    def set(self, x):
        """A copy of x (the point where a sharding can change)."""
        return _C.ops.set(self._tensor(x, "set"))

    @staticmethod
    def _axes(axes):
        return [int(axes)] if hasattr(axes, "__index__") else _int_list(axes, "axes")

    @classmethod
    def _reduced_axes(cls, op, x, dims, axes):
        # `dims` is nvFuser's keyword (fd.ops.sum(x, dims=[1])), `axes` this API's first name for it.
        # Neither reduces every axis, as nvFuser's fd.ops.sum(x) and numpy's x.sum() do.
        if dims is not None and axes is not None:
            raise TypeError(f"{op}: give the reduced axes once, as dims (or axes), got both")
        if dims is None and axes is None:
            return list(range(x.ndim))
        return cls._axes(dims if axes is None else axes)

    def sum(self, x, dims=None, keepdim=False, *, axes=None):
        """The sum over `dims` (every axis when none are given)."""
        x = self._tensor(x, "sum")
        return _C.ops.sum(x, self._reduced_axes("sum", x, dims, axes), bool(keepdim))

    def max(self, x, dims=None, keepdim=False, *, axes=None):
        """The maximum over `dims` (every axis when none are given)."""
        x = self._tensor(x, "max")
        return _C.ops.max(x, self._reduced_axes("max", x, dims, axes), bool(keepdim))

    def mean(self, x, dims=None, keepdim=False, *, axes=None):
        """The mean over `dims` (every axis when none are given)."""
        x = self._tensor(x, "mean")
        return _C.ops.mean(x, self._reduced_axes("mean", x, dims, axes), bool(keepdim))

    # nvFuser's shape ops, written with broadcast_in_dim and reshape (so they shard as those do).
    def squeeze(self, x, dims):
        """x without the axes `dims`, each of extent 1 (nvFuser's fd.ops.squeeze)."""
        x = self._tensor(x, "squeeze")
        gone = {d + x.ndim if d < 0 else d for d in self._axes(dims)}
        bad = [d for d in sorted(gone) if not 0 <= d < x.ndim or x.shape[d] != 1]
        if bad:  # a symbolic (-1) extent is not known to be 1: nvFuser squeezes broadcast axes, defined as 1
            raise ValueError(f"squeeze: {x.name} of shape {list(x.shape)}: dims must name axes of extent 1 "
                             f"(defined as 1, not -1), got {self._axes(dims)}")
        return _C.ops.reshape(x, [e for i, e in enumerate(x.shape) if i not in gone])

    def broadcast(self, x, is_broadcast_dim):
        """x with a new axis of extent 1 wherever is_broadcast_dim is True (nvFuser's fd.ops.broadcast);
        its own axes fill the other places, in order."""
        x = self._tensor(x, "broadcast")
        flags = [bool(f) for f in is_broadcast_dim]
        if sum(not f for f in flags) != x.ndim:
            raise ValueError(f"broadcast: is_broadcast_dim {flags} has {sum(not f for f in flags)} False entries, "
                             f"but {x.name} has {x.ndim} axes")
        kept = [i for i, f in enumerate(flags) if not f]
        shape = [1] * len(flags)
        for axis, i in enumerate(kept):
            shape[i] = x.shape[axis]
        return _C.ops.broadcast_in_dim(x, shape, kept)

    def expand(self, x, shape):
        """x broadcast to `shape` of the same rank: an axis of extent 1 may take any extent, -1 keeps
        an axis (nvFuser's fd.ops.expand)."""
        x = self._tensor(x, "expand")
        shape = _int_list(shape, "expand: shape")
        if len(shape) != x.ndim:
            raise ValueError(f"expand: shape {shape} must have {x.ndim} axes, as {x.name} does")
        target = [x.shape[i] if e == -1 else e for i, e in enumerate(shape)]
        return _C.ops.broadcast_in_dim(x, target, list(range(x.ndim)))

    def clamp(self, x, min=None, max=None):  # noqa: A002 (torch's and nvFuser's names)
        """x limited to [min, max] (either may be None; numbers or tensors), as torch.clamp and
        np.clip: a NaN in x or in a bound gives NaN (maximum and minimum let NaN win)."""
        x = self._tensor(x, "clamp")
        if min is None and max is None:
            raise ValueError("clamp: give min, max or both")
        out = x
        if min is not None:
            out = self.maximum(out, min)
        if max is not None:
            out = self.minimum(out, max)
        return out

    def broadcast_in_dim(self, x, shape, broadcast_dims):
        """x with its axis i placed at output axis broadcast_dims[i] of `shape` (as nvFuser/XLA)."""
        return _C.ops.broadcast_in_dim(self._tensor(x, "broadcast_in_dim"), _int_list(shape, "shape"),
                                       _int_list(broadcast_dims, "broadcast_dims"))

    def reshape(self, x, new_shape):
        return _C.ops.reshape(self._tensor(x, "reshape"), _int_list(new_shape, "new_shape"))

    def permute(self, x, dims):
        return _C.ops.permute(self._tensor(x, "permute"), _int_list(dims, "dims"))

    def matmul(self, a, b):
        return _C.ops.matmul(self._tensor(a, "matmul", "a"), self._tensor(b, "matmul", "b"))

    def linear(self, x, weight, bias=None):
        """x @ weight.T (+ bias), weight of shape [out_features, in_features] as torch.nn.functional.linear."""
        if bias is not None:
            bias = self._tensor(bias, "linear", "bias")
        return _C.ops.linear(self._tensor(x, "linear"), self._tensor(weight, "linear", "weight"), bias)


# The modules of the torch types the fast input path takes: torch.Tensor and nn.Parameter (read
# detached). Other subclasses (FakeTensor, DTensor, a user's) may override what DLPack exports, so
# they get the general checks.
_PLAIN_TORCH_MODULES = ("torch", "torch.nn.parameter")


# How another rank's TypeError reaches this one (C++ says "rank R failed its input check, so no rank
# executes: " and the message that rank reported).
_OTHER_RANKS_TYPE_ERROR = "so no rank executes: TypeError: "

class FusionDefinition:
    """A program over global shapes. See the module docstring for the two ways to write one."""

    def __init__(self, backend_type=CommunicatorBackend.auto, *, number_of_streams=None, timeout=None):
        self._fusion = _C.Fusion()
        self._params = _C.MultiDeviceExecutorParams()
        self._lock = threading.RLock()
        self._cache = None  # created at the first execute; the definition is frozen from then on
        self._needs_definition = type(self).definition is not FusionDefinition.definition
        self.ops = _Ops(self)
        self.set_backend(backend_type)
        if number_of_streams is not None:
            # An integer, not anything int() takes: 2.7 was 2, True 1 and "3" 3, silently.
            if isinstance(number_of_streams, (bool, np.bool_)) or not isinstance(number_of_streams,
                                                                                 (numbers.Integral, np.integer)):
                raise TypeError(f"number_of_streams must be an integer, got {number_of_streams!r}")
            if int(number_of_streams) < 1:
                raise ValueError(f"number_of_streams must be at least 1, got {number_of_streams}")
            self._params.executor.number_of_streams = int(number_of_streams)
        if timeout is not None:
            self._params.executor.timeout = _timeout(timeout)

    # ---- the two ways of defining -------------------------------------------------------------
    def definition(self):
        """Override in a subclass to define the fusion (called once, on first use)."""

    def multidevice_schedule(self):
        """Override in a subclass to set meshes and shardings (called right after definition())."""

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        return False

    def _ensure_defined(self):
        with self._lock:
            if not self._needs_definition:
                return
            try:
                self.definition()
                self.multidevice_schedule()
            except BaseException:
                self._fusion = _C.Fusion()  # drop the half-built fusion: the next use starts over
                raise
            self._needs_definition = False

    def _check_mutable(self, what):
        if self._cache is not None:
            raise RuntimeError(f"{what}: this FusionDefinition has already executed and can no longer change; "
                               f"create a new FusionDefinition")

    def _check_owned(self, val, what):
        if not self._fusion.owns(val):
            raise ValueError(f"{what}: {val.name} belongs to another FusionDefinition")

    # ---- building -----------------------------------------------------------------------------
    def define_tensor(self, shape, dtype=DataType.Float, contiguity=None, *, stride_order=None, is_cpu=False):
        """An input tensor of global `shape` (-1 = symbolic extent, bound at execution).

        contiguity: None (no promise: any strides), True (row-major contiguous), or one bool (or None,
        nvFuser's mark of a broadcast axis) per axis (axis i contiguous with the next inner axis).
        stride_order (nvFuser's): axis i has the stride_order[i]-th smallest stride; a layout other
        than row-major makes no contiguity promise (any strides are accepted). is_cpu is accepted so
        that definitions exported from nvFuser load unchanged; inputs must share one device."""
        self._check_mutable("define_tensor")
        shape = _int_list(shape, "define_tensor: shape")
        for i, e in enumerate(shape):
            if e < -1:
                raise ValueError(f"define_tensor: shape[{i}] = {e}: an extent is a size or -1 (symbolic)")
        if not isinstance(dtype, DataType):
            raise TypeError(f"define_tensor: dtype must be a DataType, got {type(dtype).__name__}")
        if contiguity is None or isinstance(contiguity, bool):
            flags = [bool(contiguity)] * len(shape)
        else:
            flags = [True if c is None else bool(c) for c in contiguity]
            if len(flags) != len(shape):
                raise ValueError(f"define_tensor: contiguity has {len(flags)} entries for shape {shape} "
                                 f"of {len(shape)} dimensions")
        if stride_order is not None:
            order = _int_list(stride_order, "define_tensor: stride_order")
            if sorted(order) != list(range(len(shape))):
                raise ValueError(f"define_tensor: stride_order {order} is not a permutation of 0..{len(shape) - 1}")
            if order != list(range(len(shape) - 1, -1, -1)):
                flags = [False] * len(shape)
        if not isinstance(is_cpu, bool):
            raise TypeError(f"define_tensor: is_cpu must be a bool, got {type(is_cpu).__name__}")
        tv = self._fusion.new_tensor(dtype, shape, flags)
        self._fusion.add_input(tv)
        return tv

    def define_scalar(self, value=None, dtype=None):
        """A constant (value given) or a scalar input bound at execution (value=None)."""
        self._check_mutable("define_scalar")
        if dtype is not None and not isinstance(dtype, DataType):
            raise TypeError(f"define_scalar: dtype must be a DataType, got {type(dtype).__name__}")
        if value is None:
            scalar = self._fusion.new_scalar(dtype if dtype is not None else DataType.Double, None)
            self._fusion.add_input(scalar)
            return scalar
        if not is_number(value):
            raise TypeError(f"define_scalar: value must be a number, got {type(value).__name__}")
        return self._fusion.new_scalar(dtype if dtype is not None else dtype_of_number(value),
                                       exact_float(value, "define_scalar"))

    def add_output(self, tv):
        self._check_mutable("add_output")
        if not isinstance(tv, _C.Val):
            raise TypeError(f"add_output: expected a TensorView of this FusionDefinition, got {type(tv).__name__}")
        if not self._fusion.owns(tv):
            raise ValueError(f"add_output: {tv.name} is not a tensor of this FusionDefinition (it belongs to another)")
        if not tv.is_tensor:
            raise ValueError(f"add_output: {tv.name} is a scalar; outputs are tensors")
        self._fusion.add_output(tv)

    # ---- backend and parameters ---------------------------------------------------------------
    @property
    def backend_type(self):
        return self._params.lower.communicator_backend

    def set_backend(self, backend):
        """The communicator backend of this instance's next lowering (a new cache entry if it changed)."""
        _check_backend(backend)
        with self._lock:
            self._params.lower.communicator_backend = backend

    @property
    def number_of_streams(self):
        return self._params.executor.number_of_streams

    # ---- running ------------------------------------------------------------------------------
    def execute(self, inputs, *, trace=None, trace_host=False, rng_offset=None):
        """Runs on this rank's inputs (numpy arrays, torch tensors, numbers; None for a tensor whose
        mesh excludes this rank). Returns one output per add_output: numpy arrays for numpy inputs,
        torch tensors when any input is a torch tensor, None where an output is not on this rank.
        trace: a path to write a Chrome trace of this execution to. Its segment spans are device
        time (each segment synchronized); with trace_host=True they are the host's time to launch
        each one instead, nothing synchronized (category "host", and a "host program" span around
        them): where a pass whose GPU waits on its host spends the host's time.
        rng_offset: an integer in [0, 2**53) pinning the random draws that have no rng_seed of their
        own (uniform, normal, sdpfa_fwd's dropout; the k-th draws at rng_offset + k): the same offset
        draws the same values again (a recomputation). Every rank passes one (the largest is used) or
        none does. Default: the process's counter, which gives every execution fresh draws."""
        self._ensure_defined()
        with self._lock:
            if not self._fusion.outputs():
                raise ValueError("execute: the FusionDefinition has no outputs (call add_output)")
            params = self._params
            if trace is not None or rng_offset is not None:
                params = _C.MultiDeviceExecutorParams(self._params)
            if trace is not None:
                params.executor.trace_path = str(trace)
                params.executor.trace_host = bool(trace_host)
            elif trace_host:
                raise ValueError("execute: trace_host=True needs trace=<path> to write the trace to")
            self._executor_cache()
            try:
                if rng_offset is not None:
                    params.executor.rng_offset = self._checked_rng_offset(rng_offset)
                args, torch_out = self._arguments(inputs)
            except (TypeError, ValueError) as error:
                self._fail_other_ranks(error, params)
                raise
            try:
                results = self._cache.execute(args, params)
            except ValueError as error:  # the C++ checks (extents, shardings) know inputs by IR name only
                named = self._naming_inputs_in(str(error))
                # Another rank's TypeError (a wrong dtype or type there; _fail_other_ranks marks it) is
                # a TypeError here too, so that one except clause handles the failure on every rank.
                kind = TypeError if _OTHER_RANKS_TYPE_ERROR in str(error) else ValueError
                if named is None and kind is ValueError:
                    raise
                raise kind(named or str(error)) from None
        return self._exported(results, torch_out)

    def _naming_inputs_in(self, message):
        """message with the definition's input names added where it cites "Tk (input i)" (this rank's
        error, or another rank's quoted in it); None when there is nothing to add."""
        names = getattr(self, "input_names", None)
        if not callable(names) or "(input " not in message:
            return None
        try:
            names = names()
        except Exception:  # a broken input_names() must not hide the user's error
            return None
        named = re.sub(r"\b(T\d+) \(input (\d+)\)",
                       lambda m: (f"{m.group(1)} (input {m.group(2)}, {names[int(m.group(2))]})"
                                  if int(m.group(2)) < len(names) and names[int(m.group(2))] else m.group(0)), message)
        return None if named == message else named

    @staticmethod
    def _exported(results, torch_out):
        """execute()'s outputs from the C++ results: torch tensors when any input was one, else numpy
        arrays; None stays None."""
        if torch_out:
            default_streams = {}  # the outputs' own memo of torch's current streams (to_torch)
            return [None if t is None else _arrays.to_torch(t, default_streams) for t in results]
        return [None if t is None else _arrays.to_numpy(t) for t in results]

    def _fast_plan(self):
        """Per input, what a plain array needs to take the fast path: (numpy dtype or None, rank,
        DataType, whether any strides do) for a tensor without a mesh, "scalar" for a scalar, None for
        an input the general checks must see. Any strides do where the definition marks no axis
        contiguous (the default): then a strided view (the layer's attention output, a transpose)
        takes the fast path too. Built once: reading TensorView properties through pybind11 on every
        execute cost more than the execution of a small cached fusion."""
        if getattr(self, "_plan", None) is None:
            numpy_of = {dt: npd for npd, dt in _arrays.NUMPY_DTYPES.items()}
            # numpy < 2 cannot put bool in DLPack (the general path then passes its bytes as uint8).
            if not _arrays.exports_bool(np):
                numpy_of.pop(DataType.Bool, None)
            plan = []
            for v in self._fusion.inputs():
                if not v.is_tensor:
                    plan.append("int scalar" if v.dtype in (DataType.Int, DataType.Int32) else "scalar")
                    continue
                any_strides = not any(v.contiguity)
                plan.append((numpy_of.get(v.dtype), v.ndim, v.dtype, any_strides) if v.device_mesh is None else None)
            bf16_out = any(o.dtype == DataType.BFloat16 for o in self._fusion.outputs())
            self._plan = (plan, bf16_out)
        return self._plan

    @staticmethod
    def _fast_argument(expected, x, torch_dtypes, default_streams=None):
        """(C++ argument, whether x is a torch tensor) for an input that needs no checks beyond the
        plan's (a numpy array or torch tensor of the defined dtype and rank, C-contiguous unless any
        strides do; a number), else None: the general path then checks it and names what is wrong,
        an export DLPack refuses among it. default_streams: the call's memo of torch's current
        streams (_arrays.torch_dlpack_fast)."""
        if expected is None:
            return None
        if expected == "scalar" or expected == "int scalar":  # ints a double holds exactly; floats where not Int
            if type(x) is int and -EXACT_INTEGER_LIMIT <= x <= EXACT_INTEGER_LIMIT:
                return float(x), False
            return (x, False) if type(x) is float and expected == "scalar" else None
        np_dtype, ndim, dtype, any_strides = expected
        try:
            if type(x) is np.ndarray:
                if np_dtype is None or x.dtype != np_dtype or x.ndim != ndim or not x.flags.writeable \
                        or not (any_strides or x.flags.c_contiguous):
                    return None
                return _C.Tensor.from_dlpack(x.__dlpack__()), False
            if torch_dtypes and torch_dtypes.get(getattr(x, "dtype", None)) == dtype \
                    and type(x).__module__ in _PLAIN_TORCH_MODULES and x.dim() == ndim \
                    and (any_strides or x.is_contiguous()) and not x.is_neg():
                if x.requires_grad:  # read detached, as the general path does (_arrays.to_tensor says why)
                    x = x.detach()
                return _C.Tensor.from_dlpack(_arrays.torch_dlpack_fast(x, default_streams)), True
        except (TypeError, ValueError, BufferError, RuntimeError, AttributeError):  # torch's refusals are
            return None  # RuntimeErrors (AttributeError: a torch without is_neg); the general checks decide
        return None

    def _arguments(self, inputs):
        """The checked C++ arguments for `inputs`, and whether outputs are torch tensors. Each input
        takes the fast path where it can (_fast_argument); the others get the general checks, which
        explain what is wrong: one odd input (a bool mask, a strided view, a sharded tensor) no longer
        sends every input of the call through them."""
        plan, bf16_out = self._fast_plan()
        fusion_inputs = None
        if not isinstance(inputs, (list, tuple)) or len(inputs) != len(plan):
            fusion_inputs = self._fusion.inputs()
            _validation.check_input_count(fusion_inputs, inputs)
        torch_dtypes = _arrays.torch_dtype_map()  # {} until the user imports torch
        rank = None
        args, torch_out, default_streams = [], False, {}
        for i, (expected, x) in enumerate(zip(plan, inputs)):
            fast = self._fast_argument(expected, x, torch_dtypes, default_streams)
            if fast is not None:
                args.append(fast[0])
                torch_out = torch_out or fast[1]
                continue
            if fusion_inputs is None:
                fusion_inputs = self._fusion.inputs()
                rank = _lazy_rank()
            v = fusion_inputs[i]
            try:
                args.append(_validation.tensor_argument(v, x, rank) if v.is_tensor else _validation.check_scalar(v, x))
            except (TypeError, ValueError) as error:
                raise type(error)(self._naming_the_input(str(error), i, v)) from None
            torch_out = torch_out or _arrays.is_torch_tensor(x)
        if bf16_out and not torch_out:
            for out in self._fusion.outputs():
                if out.dtype == DataType.BFloat16:
                    raise TypeError(f"{out.name}: a BFloat16 output cannot be returned as a numpy array (numpy "
                                    f"has no bfloat16): cast it to Float in the definition, or pass torch tensors")
        return args, torch_out

    def _naming_the_input(self, message, index, v):
        """An input check's message, which opens with the input's IR name (T23), with where the input
        sits in execute()'s list after it, and its name where the definition names its inputs (an
        input_names() method, as the transformer layer's have): "T23 (input 23, fc1_out): ...". Only
        on the error path, so a call that passes pays nothing for it."""
        names = getattr(self, "input_names", None)
        try:
            name = names()[index] if callable(names) else None
        except Exception:  # a broken input_names() must not hide the user's error
            name = None
        where = f"input {index}" + (f", {name}" if name else "")
        if message.startswith(v.name):
            return f"{v.name} ({where}){message[len(v.name):]}"
        return f"{v.name} ({where}): {message}"

    @staticmethod
    def _checked_rng_offset(rng_offset):
        if isinstance(rng_offset, bool) or not hasattr(rng_offset, "__index__"):
            raise TypeError(f"execute: rng_offset must be an integer, got {type(rng_offset).__name__}")
        if not 0 <= int(rng_offset) < 2 ** 53:
            raise ValueError(f"execute: rng_offset must be in [0, 2**53), got {int(rng_offset)}")
        return int(rng_offset)

    def report_error(self, error):
        """For a wrapper that checks its own arguments before execute() (meshfuse.torch's layer): tells
        the other ranks, waiting in this fusion's execute(), that this rank failed `error` (a TypeError
        or ValueError), so that they raise it too instead of waiting out the timeout. Returns; the
        caller raises `error` itself. A collective step: call it where this rank would have executed."""
        if not isinstance(error, (TypeError, ValueError)):
            raise TypeError(f"report_error: error must be a TypeError or ValueError, got {type(error).__name__}")
        self._ensure_defined()
        with self._lock:
            self._executor_cache()
            self._fail_other_ranks(error, self._params)

    def _executor_cache(self):
        """The C++ executor cache, made at first use (execute or report_error; the definition is frozen
        from then on). Called with self._lock held."""
        if self._cache is None:
            self._cache = _C.FusionExecutorCache(self._fusion)
        return self._cache

    def _fail_other_ranks(self, error, params):
        """The other ranks wait in execute() for this rank's inputs: tell them this rank's were bad, so
        every rank raises instead of waiting out the timeout. (A world of one returns at once.)"""
        try:
            self._cache.report_input_error(("TypeError: " if isinstance(error, TypeError) else "") + str(error),
                                           params)
        except ValueError:
            pass  # it always raises the error it reported; this rank raises the original instead

    def num_cached_programs(self):
        """How many lowered programs (one per distinct input signature and parameters) are cached."""
        return 0 if self._cache is None else self._cache.num_cached_programs()

    # ---- inspecting ---------------------------------------------------------------------------
    def fusion_ir(self):
        """The definition as the IR prints it."""
        self._ensure_defined()
        return self._fusion.to_string()

    def _executed(self, what):
        if self._cache is None:
            raise RuntimeError(f"{what}: nothing has been lowered yet; it is lowered for the inputs at execute()")
        return self._cache

    def host_ir(self):
        """This rank's host program of the last execution: segments and communications with their backend."""
        return self._executed("host_ir").last_host_ir()

    def output_shardings(self):
        """Where each output of the last execution lives, as sharding propagation placed it: one TensorView
        per output, in order, with the output's mesh (None: whole on every rank), loop domain and global
        extents (symbolic ones as the inputs bound them). Hand one to `multidevice.gather_tensor` to
        assemble the global array from the ranks' results, or to `multidevice.shard_tensor`."""
        return self._executed("output_shardings").last_output_shardings().outputs()

    def last_lowered_fusion(self):
        """The fusion after sharding propagation and resharding insertion, of the last execution."""
        return self._executed("last_lowered_fusion").last_lowered_fusion()

    def __repr__(self):
        return f"<{type(self).__name__} backend={self.backend_type.name}>\n{self.fusion_ir()}"


def _lazy_rank():
    """This process's world rank, asked for only when an input is None (it starts MPI)."""
    cached = []

    def rank():
        if not cached:
            cached.append(_C.Communicator.instance().rank)
        return cached[0]

    return rank
