"""Conversions between user arrays (numpy arrays, torch tensors, any DLPack producer) and
meshfuse._C.Tensor, zero-copy through DLPack in both directions."""
import sys

import numpy as np

from . import _C

DataType = _C.DataType

# numpy has no bfloat16: BFloat16 tensors travel as torch tensors only.
NUMPY_DTYPES = {
    np.dtype(np.float32): DataType.Float,
    np.dtype(np.float64): DataType.Double,
    np.dtype(np.float16): DataType.Half,
    np.dtype(np.int64): DataType.Int,
    np.dtype(np.int32): DataType.Int32,
    np.dtype(np.bool_): DataType.Bool,
}
_TORCH_DTYPE_NAMES = {
    "torch.float32": DataType.Float,
    "torch.float64": DataType.Double,
    "torch.float16": DataType.Half,
    "torch.bfloat16": DataType.BFloat16,
    "torch.int64": DataType.Int,
    "torch.int32": DataType.Int32,
    "torch.bool": DataType.Bool,
}
_KDL_CUDA = 2


def _torch():
    """torch if the user has imported it (meshfuse never imports it on its own)."""
    return sys.modules.get("torch")


_torch_dtype_map = {}


def torch_dtype_map():
    """{torch dtype: DataType} once torch is imported ({} before), without Bool (the fast path leaves
    it to the general one)."""
    if not _torch_dtype_map:
        torch = _torch()
        if torch is not None:
            for name, dtype in _TORCH_DTYPE_NAMES.items():
                if dtype != DataType.Bool and hasattr(torch, name.split(".")[1]):
                    _torch_dtype_map[getattr(torch, name.split(".")[1])] = dtype
    return _torch_dtype_map


def is_torch_tensor(obj):
    torch = _torch()
    return torch is not None and isinstance(obj, torch.Tensor)


def is_negative_view(obj):
    """Whether obj is a torch tensor with the negative bit set (a lazily negated view, as
    torch._neg_view and some autograd formulas make): its memory holds the values' negations, and
    torch 1.13's DLPack exporter hands that memory out without a word, so meshfuse would read every
    value with the wrong sign (torch 2 refuses to export it). Such a tensor is read resolved."""
    is_neg = getattr(obj, "is_neg", None)  # torch >= 1.10
    return is_neg is not None and is_torch_tensor(obj) and is_neg()


def is_array(obj):
    """Whether obj can be an execute() tensor input."""
    return isinstance(obj, (np.ndarray, _C.Tensor)) or is_torch_tensor(obj) or hasattr(obj, "__dlpack__")


def type_name(obj):
    t = type(obj)
    return t.__name__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"


def dtype_of(obj):
    """(meshfuse DataType or None, the array's own dtype name) of an array-like."""
    if isinstance(obj, np.ndarray):
        return NUMPY_DTYPES.get(obj.dtype), str(obj.dtype)
    if isinstance(obj, _C.Tensor):
        return obj.dtype, str(obj.dtype).split(".")[-1]
    if is_torch_tensor(obj):
        return _TORCH_DTYPE_NAMES.get(str(obj.dtype)), str(obj.dtype)
    return None, None  # another DLPack producer: known once imported


def shape_of(obj):
    return tuple(int(e) for e in obj.shape)


def strides_of(obj):
    """Strides in elements, or None where the array type does not tell without importing it."""
    if isinstance(obj, np.ndarray):
        return tuple(s // obj.itemsize for s in obj.strides) if obj.itemsize else tuple(0 for _ in obj.strides)
    if isinstance(obj, _C.Tensor):
        return tuple(obj.strides)
    if is_torch_tensor(obj):
        return tuple(obj.stride())
    return None


def to_tensor(obj):
    """A meshfuse Tensor sharing obj's memory."""
    if isinstance(obj, _C.Tensor):
        return obj
    if isinstance(obj, np.ndarray) and not obj.flags.writeable:
        # Unversioned DLPack cannot mark memory read-only, so numpy refuses to export it. Inputs are
        # never written: a copy is safe (broadcast_to views and read-only buffers land here).
        # Row-major: np.array keeps the source's axis order (order="K"), which for a broadcast view put
        # the stride-0 axis innermost and made the copy look column-major to the contiguity check.
        obj = np.array(obj, copy=True, order="C")
    if type(obj).__name__ == "PyCapsule":
        return _C.Tensor.from_dlpack(obj)
    if is_torch_tensor(obj) and obj.requires_grad:
        # torch refuses to export a tensor that requires grad. meshfuse records no autograd graph
        # (meshfuse.torch's autograd.Function does that), so it reads the data as nvFuser does: the
        # detached tensor shares the memory, and the outputs come back without grad.
        obj = obj.detach()
    if is_negative_view(obj):
        obj = obj.resolve_neg()  # a copy holding the values the view shows (is_negative_view says why)
    if _is_bool(obj) and not _exports_bool(obj):
        # numpy < 2 and torch < 2 cannot put bool in DLPack: pass the same bytes as uint8.
        return _C.Tensor.from_dlpack(dlpack_of(_uint8_view(obj)), uint8_as_bool=True)
    return _C.Tensor.from_dlpack(dlpack_of(obj))


def dlpack_of(obj):
    device_type, _ = obj.__dlpack_device__() if hasattr(obj, "__dlpack_device__") else (1, 0)
    if int(device_type) == _KDL_CUDA:
        # meshfuse's CUDA work runs on the legacy default stream (1) unless told otherwise: the
        # producer makes its pending work on its own stream visible there first.
        return obj.__dlpack__(stream=1)
    return obj.__dlpack__()


def _torch_stream_is_default(torch, device_index):
    raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    return raw_stream is not None and raw_stream(device_index) == 0


def _stream_is_default(torch, device_index, default_streams):
    """Whether torch's current stream on the CUDA device is the default (legacy) stream, where meshfuse
    queues its work. default_streams: None, or a memo {device index: the answer} that one execute's
    inputs share (and another its outputs), filled as their devices come (the current stream cannot
    change within the call), so that a call of many tensors asks torch once per device, not once per
    tensor. A new call starts a new memo: between calls the user may enter `torch.cuda.stream`."""
    if default_streams is None:
        return _torch_stream_is_default(torch, device_index)
    known = default_streams.get(device_index)
    if known is None:
        known = default_streams[device_index] = _torch_stream_is_default(torch, device_index)
    return known


def torch_dlpack_fast(tensor, default_streams=None):
    """A DLPack capsule of a torch tensor through torch's C exporter, skipping the stream handshake of
    `__dlpack__` (most of a small execute's time on CUDA) where no handshake is needed: a CPU tensor,
    or a CUDA tensor while its device's current stream is the default (_stream_is_default); else the
    handshake. Only for tensors that need no grad."""
    torch = _torch()
    if not tensor.is_cuda or _stream_is_default(torch, tensor.get_device(), default_streams):
        return torch.utils.dlpack.to_dlpack(tensor)
    return dlpack_of(tensor)


def _is_bool(obj):
    return (isinstance(obj, np.ndarray) and obj.dtype == np.bool_) or (is_torch_tensor(obj) and str(obj.dtype) == "torch.bool")


def _major_version(module):
    return int(module.__version__.split(".")[0])


def exports_bool(module):
    """Whether numpy or torch (the module) knows DLPack's bool code (numpy >= 2, torch >= 2)."""
    return _major_version(module) >= 2


def _exports_bool(obj):
    return exports_bool(np if isinstance(obj, np.ndarray) else _torch())


def _uint8_view(obj):
    return obj.view(np.uint8) if isinstance(obj, np.ndarray) else obj.view(_torch().uint8)


class _Bool8Capsule:
    """A DLPack producer of a Bool Tensor's bytes labelled uint8 (for numpy < 2 and torch < 2)."""

    def __init__(self, tensor):
        self._tensor = tensor

    def __dlpack__(self, stream=None):
        return self._tensor.dlpack_bool_as_uint8()

    def __dlpack_device__(self):
        return self._tensor.__dlpack_device__()


def to_numpy(tensor):
    """A numpy array sharing the Tensor's memory (CPU tensors, dtypes numpy has). With numpy >= 2 it
    is writable, unless it is a broadcast (below); numpy 1.x marks every array it takes through DLPack
    read-only. A view output (reshape, permute, slice, broadcast_in_dim) of an input shares the input's
    memory, as a numpy view does."""
    if tensor.dtype == DataType.BFloat16:
        raise TypeError("numpy has no bfloat16: pass torch tensors to get BFloat16 outputs, or cast to Float")
    if tensor.is_cuda:
        raise ValueError(f"a tensor on {tensor.device} cannot become a numpy array; pass torch tensors")
    if tensor.dtype == DataType.Bool and _major_version(np) < 2:
        array = np.from_dlpack(_Bool8Capsule(tensor)).view(np.bool_)
    else:
        array = np.from_dlpack(tensor)
    # A broadcast output (stride 0 over an axis of several elements) is read-only, as np.broadcast_to's
    # is: a write through one element would change a whole row of the result.
    if array.flags.writeable and any(st == 0 and n > 1 for st, n in zip(array.strides, array.shape)):
        array.flags.writeable = False
    return array


def to_torch(tensor, default_streams=None):
    """A torch tensor sharing the Tensor's memory. default_streams: as _stream_is_default's."""
    torch = _torch()
    if torch is None:
        import torch  # noqa: F811  (the user passed torch inputs, so it is installed)
    if tensor.dtype == DataType.Bool and _major_version(torch) < 2:
        return torch.utils.dlpack.from_dlpack(tensor.dlpack_bool_as_uint8()).view(torch.bool)
    importer = getattr(torch._C, "_from_dlpack", None)
    device_type, index = tensor.__dlpack_device__()
    if importer is not None and tensor.dtype != DataType.Bool and (
            device_type != _KDL_CUDA or _stream_is_default(torch, index, default_streams)):
        # Torch would consume on the default stream, where meshfuse's work already is: the capsule
        # straight into torch's C importer, without from_dlpack's stream handshake.
        return importer(tensor.__dlpack__())
    return torch.from_dlpack(tensor)
