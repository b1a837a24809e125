"""Checks of execute()'s inputs against the definition, made before any C++ runs, so that a user
mistake is a ValueError/TypeError naming the tensor and the expected and actual value. (The C++
executor checks again, including extents, which need the sharding to interpret.)"""
from . import _arrays, _C
from ._operands import exact_float, is_number

DataType = _C.DataType


def _dtype_name(dtype):
    return dtype.name


def check_input_count(fusion_inputs, inputs):
    if not isinstance(inputs, (list, tuple)):
        raise TypeError(f"execute: inputs must be a list or tuple, got {type(inputs).__name__}")
    if len(inputs) != len(fusion_inputs):
        names = ", ".join(v.name for v in fusion_inputs)
        raise ValueError(f"execute: expected {len(fusion_inputs)} inputs ({names}), got {len(inputs)}")


def check_scalar(scalar, value):
    if not is_number(value):
        raise TypeError(f"{scalar.name}: expected a number for scalar input of dtype {_dtype_name(scalar.dtype)}, "
                        f"got {_arrays.type_name(value)}")
    if scalar.dtype in (DataType.Int, DataType.Int32) and not float(value).is_integer():
        raise TypeError(f"{scalar.name}: expected an integer for scalar input of dtype {_dtype_name(scalar.dtype)}, "
                        f"got {value!r}")
    return exact_float(value, scalar.name)


def _check_contiguity(tv, shape, strides):
    if strides is None or 0 in shape:
        return
    for i, must_be_contiguous in enumerate(tv.contiguity):
        if not must_be_contiguous or shape[i] == 1:
            continue
        inner = next((j for j in range(i + 1, len(shape)) if shape[j] != 1), None)
        expected = 1 if inner is None else strides[inner] * shape[inner]
        if strides[i] != expected:
            raise ValueError(f"{tv.name}: the definition says axis {i} is contiguous (contiguity {list(tv.contiguity)}), "
                             f"got strides {list(strides)} (in elements) for shape {list(shape)}; "
                             f"pass a contiguous array (numpy.ascontiguousarray / tensor.contiguous())")


def _check_dtype(tv, dtype, dtype_name, is_numpy):
    if dtype == tv.dtype:
        return
    hint = ""
    if tv.dtype == DataType.BFloat16 and is_numpy:
        hint = " (numpy has no bfloat16: pass a torch tensor, or define the input Float and cast it)"
    if dtype is None:
        raise TypeError(f"{tv.name}: dtype {dtype_name} is not supported; expected {_dtype_name(tv.dtype)}{hint}")
    raise TypeError(f"{tv.name}: expected dtype {_dtype_name(tv.dtype)}, got {_dtype_name(dtype)} ({dtype_name}){hint}")


def tensor_argument(tv, value, rank):
    """value as a meshfuse Tensor for input tv, or None when tv's mesh does not hold this rank."""
    mesh = tv.device_mesh
    if value is None:
        if mesh is not None and rank() not in mesh:
            return None
        where = f"rank {rank()} is in its mesh {mesh}" if mesh is not None else "it has no mesh, so every rank holds it"
        raise ValueError(f"{tv.name}: expected a tensor, got None ({where})")
    if not _arrays.is_array(value):
        raise TypeError(f"{tv.name}: expected a tensor (numpy array or torch tensor) of dtype "
                        f"{_dtype_name(tv.dtype)}, got {_arrays.type_name(value)}")
    layout = getattr(value, "layout", None) if _arrays.is_torch_tensor(value) else None
    if layout is not None and str(layout) != "torch.strided":
        raise ValueError(f"{tv.name}: a {layout} torch tensor; meshfuse reads dense (strided) tensors: "
                         f"pass tensor.to_dense()")
    dtype, dtype_name = _arrays.dtype_of(value)
    is_numpy = dtype_name is not None and not _arrays.is_torch_tensor(value) and not isinstance(value, _C.Tensor)
    if dtype_name is not None:
        _check_dtype(tv, dtype, dtype_name, is_numpy)
    try:
        tensor = _arrays.to_tensor(value)
    except (TypeError, ValueError, BufferError) as e:
        raise type(e)(f"{tv.name}: {e}") from None
    except RuntimeError as e:  # torch's exporter refusing a tensor (a conjugate or negative view, ...)
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ValueError(f"{tv.name}: cannot be read through DLPack: {reason}") from None
    # Checked on the imported Tensor, so any DLPack producer gets the same checks.
    _check_dtype(tv, tensor.dtype, _dtype_name(tensor.dtype), is_numpy)
    shape = tuple(tensor.shape)
    if len(shape) != tv.ndim:
        raise ValueError(f"{tv.name}: expected {tv.ndim} dimensions (definition shape {list(tv.shape)}), "
                         f"got {len(shape)} (shape {list(shape)})")
    _check_contiguity(tv, shape, tuple(tensor.strides))
    return tensor
