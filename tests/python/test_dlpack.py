"""DLPack in and out: zero-copy imports of numpy arrays, torch tensors and raw capsules, the
lifetime of shared memory in both directions, and numpy-in/numpy-out, torch-in/torch-out."""
import ctypes
import gc
import weakref

import numpy as np
import pytest
from conftest import NUMPY_DTYPE, random_array

from meshfuse import DataType, FusionDefinition, _arrays, _C

# numpy 1.x marks every array it takes through DLPack read-only; numpy 2 reads the versioned
# capsule's flags, and meshfuse's outputs are writable.
NUMPY_2 = int(np.__version__.split(".")[0]) >= 2

_capsule_is_valid = ctypes.pythonapi.PyCapsule_IsValid
_capsule_is_valid.restype = ctypes.c_int
_capsule_is_valid.argtypes = [ctypes.py_object, ctypes.c_char_p]


@pytest.mark.parametrize("dtype", sorted(NUMPY_DTYPE, key=lambda d: d.name))
def test_numpy_import_is_zero_copy(rng, dtype):
    a = random_array(rng, (3, 5), NUMPY_DTYPE[dtype])
    t = _arrays.to_tensor(a)  # bool goes as uint8 bytes where numpy < 2 cannot export it
    assert t.dtype == dtype and t.shape == [3, 5] and t.strides == [5, 1]
    assert t.data_ptr == a.ctypes.data and t.device == "cpu"
    for i in (0, 7, 14):
        assert t.item(i) == pytest.approx(float(a.reshape(-1)[i]))


def test_strided_and_offset_views_keep_their_layout(rng):
    a = random_array(rng, (6, 8), np.float32)
    view = a[1:5:2, 2:].T  # an offset, a step and a transpose
    t = _C.Tensor.from_dlpack(view)
    assert t.shape == [6, 2] and t.strides == [1, 16]
    assert t.data_ptr == view.ctypes.data
    assert not t.is_contiguous()
    np.testing.assert_array_equal(np.from_dlpack(t), view)


def test_imported_memory_lives_as_long_as_the_tensor():
    a = np.arange(10, dtype=np.float64)
    alive = weakref.ref(a)
    t = _C.Tensor.from_dlpack(a)
    del a
    gc.collect()
    assert alive() is not None, "the Tensor must keep the array alive"
    assert t.item(9) == 9.0
    del t
    gc.collect()
    assert alive() is None, "releasing the Tensor must call the producer's deleter"


def test_raw_capsule_is_consumed_and_renamed():
    a = np.ones(4, np.int32)
    capsule = a.__dlpack__()
    assert _capsule_is_valid(capsule, b"dltensor")
    t = _C.Tensor.from_dlpack(capsule)
    assert _capsule_is_valid(capsule, b"used_dltensor") and not _capsule_is_valid(capsule, b"dltensor")
    assert t.data_ptr == a.ctypes.data
    with pytest.raises(ValueError, match="already consumed"):
        _C.Tensor.from_dlpack(capsule)


def test_rejected_capsule_is_not_consumed():
    capsule = np.ones(4, np.uint8).__dlpack__()
    with pytest.raises(TypeError, match="uint8 is not supported"):
        _C.Tensor.from_dlpack(capsule)
    assert _capsule_is_valid(capsule, b"dltensor"), "the producer still owns it and frees it with the capsule"
    with pytest.raises(TypeError, match="complex64"):
        _C.Tensor.from_dlpack(np.ones(2, np.complex64))
    with pytest.raises(TypeError, match="expected a DLPack capsule or an object with __dlpack__"):
        _C.Tensor.from_dlpack([1, 2, 3])


def test_export_to_numpy_shares_memory_and_outlives_the_tensor():
    gc.collect()
    base = _C.cpu_bytes_in_use()
    t = _C.Tensor.zeros([4, 3], DataType.Double)
    assert _C.cpu_bytes_in_use() == base + 96
    a = np.from_dlpack(t)
    assert a.ctypes.data == t.data_ptr and a.shape == (4, 3) and a.dtype == np.float64
    if NUMPY_2:
        a[2, 1] = 5.0  # writable, and the same memory
        assert t.item(7) == 5.0
    del t
    gc.collect()
    assert a[2, 1] == (5.0 if NUMPY_2 else 0.0) and _C.cpu_bytes_in_use() == base + 96
    del a
    gc.collect()
    assert _C.cpu_bytes_in_use() == base, "the consumer's deleter must release the storage"


def test_unconsumed_export_capsule_frees_the_storage():
    gc.collect()
    base = _C.cpu_bytes_in_use()
    capsule = _C.Tensor.zeros([16], DataType.Float).__dlpack__()
    assert _C.cpu_bytes_in_use() == base + 64
    del capsule
    gc.collect()
    assert _C.cpu_bytes_in_use() == base


def test_export_protocol_keywords():
    t = _C.Tensor.zeros([2, 2], DataType.Int32)
    assert t.__dlpack_device__() == (1, 0)
    assert _capsule_is_valid(t.__dlpack__(), b"dltensor")
    # A consumer that reads DLPack 1.x gets the versioned capsule, so numpy >= 2 can write the array.
    capsule = t.__dlpack__(stream=None, max_version=(1, 0), dl_device=(1, 0), copy=False)
    assert _capsule_is_valid(capsule, b"dltensor_versioned")
    again = _C.Tensor.from_dlpack(capsule)  # and meshfuse reads it back
    assert again.data_ptr == t.data_ptr and _capsule_is_valid(capsule, b"used_dltensor_versioned")
    copied = np.from_dlpack(_C.Tensor.from_dlpack(t.__dlpack__(copy=True)))
    assert copied.ctypes.data != t.data_ptr
    with pytest.raises(BufferError, match=r"on cpu cannot be exported to DLPack device \(2, 0\)"):
        t.__dlpack__(dl_device=(2, 0))


def test_versioned_import_from_numpy(rng):
    a = random_array(rng, (4, 3), np.float32)
    try:
        capsule = a.__dlpack__(max_version=(1, 0))
    except TypeError:
        pytest.skip("this numpy exports unversioned DLPack only")
    t = _C.Tensor.from_dlpack(capsule)
    assert t.data_ptr == a.ctypes.data and t.shape == [4, 3]
    np.testing.assert_array_equal(np.from_dlpack(t), a)


def test_bfloat16_cannot_become_numpy():
    with pytest.raises(TypeError, match="numpy has no bfloat16"):
        _arrays.to_numpy(_C.Tensor.zeros([2], DataType.BFloat16))


def test_bool_round_trip(rng):
    a = random_array(rng, (5, 4), np.bool_)
    b = random_array(rng, (5, 4), np.bool_)
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], DataType.Bool)
        y = fd.define_tensor([-1, -1], DataType.Bool)
        fd.add_output(fd.ops.maximum(x, y))  # logical or
    (out,) = fd.execute([a, b])
    assert out.dtype == np.bool_
    np.testing.assert_array_equal(out, a | b)


def test_execute_numpy_out_owns_its_memory(rng):
    x = random_array(rng, (64, 64), np.float32)
    gc.collect()
    base = _C.cpu_bytes_in_use()
    with FusionDefinition() as fd:
        t = fd.define_tensor([-1, -1])
        fd.add_output(fd.ops.exp(t))
    (out,) = fd.execute([x])
    assert isinstance(out, np.ndarray) and out.flags.writeable == NUMPY_2
    assert not np.shares_memory(out, x)
    np.testing.assert_allclose(out, np.exp(x.astype(np.float64)), rtol=2e-6)
    assert _C.cpu_bytes_in_use() >= base + out.nbytes
    del out, fd
    gc.collect()
    assert _C.cpu_bytes_in_use() == base, "outputs and the inputs' imports must all be released"


# ---- torch (not in the CPU venv; runs where torch is installed) --------------------------------

def test_torch_in_torch_out(rng):
    torch = pytest.importorskip("torch")
    x = torch.from_numpy(random_array(rng, (6, 4), np.float32))
    w = torch.from_numpy(random_array(rng, (3, 4), np.float32))
    with FusionDefinition() as fd:
        xt = fd.define_tensor([-1, 4])
        wt = fd.define_tensor([3, 4])
        fd.add_output(fd.ops.relu(fd.ops.linear(xt, wt)))
    (out,) = fd.execute([x, w])
    assert isinstance(out, torch.Tensor) and out.dtype == torch.float32
    torch.testing.assert_close(out, torch.relu(x.double() @ w.double().T).float(), rtol=1e-5, atol=1e-5)


def test_torch_tensors_that_require_grad_are_read_and_outputs_have_no_grad(rng):
    """torch refuses to export a tensor that requires grad (an nn.Parameter, say); meshfuse records no
    autograd graph, so it reads the detached data, as nvFuser does (meshfuse.torch is for autograd)."""
    torch = pytest.importorskip("torch")
    w = torch.nn.Parameter(torch.from_numpy(random_array(rng, (3, 4), np.float32)))
    x = torch.from_numpy(random_array(rng, (6, 4), np.float32)).requires_grad_(True)
    with FusionDefinition() as fd:
        fd.add_output(fd.ops.linear(fd.define_tensor([-1, 4]), fd.define_tensor([3, 4])))
    for _ in range(2):  # the second call is a cached one
        (out,) = fd.execute([x, w])
        assert not out.requires_grad and w.requires_grad and x.requires_grad
        torch.testing.assert_close(out, (x.detach().double() @ w.detach().double().T).float(), rtol=1e-5, atol=1e-5)
    # The general path (a sharded input, an input the fast plan does not cover) reads it in place too.
    t = _arrays.to_tensor(w)
    assert t.data_ptr == w.data_ptr() and t.shape == [3, 4] and t.item(5) == pytest.approx(float(w.detach()[1, 1]))


def test_torch_negative_views_are_read_with_their_sign(rng):
    """A tensor with torch's negative bit set holds its values' negations in memory; torch 1.13's
    DLPack exporter hands that memory out (torch 2 refuses), so meshfuse reads it resolved."""
    torch = pytest.importorskip("torch")
    if not hasattr(torch, "_neg_view"):
        pytest.skip("this torch has no negative views")
    x = torch.from_numpy(random_array(rng, (3, 4), np.float32))
    negated = torch._neg_view(x)
    with FusionDefinition() as fd:
        fd.add_output(fd.ops.mul(fd.define_tensor([-1, 4]), 2.0))
    assert fast_inputs(fd, [negated]) == [False]
    for _ in range(2):  # the second call is a cached one
        (out,) = fd.execute([negated])
        torch.testing.assert_close(out, -2.0 * x, rtol=0, atol=0)


def test_torch_tensors_that_are_not_dense_are_named_errors():
    torch = pytest.importorskip("torch")
    with FusionDefinition() as fd:
        fd.add_output(fd.ops.add(fd.define_tensor([-1, 4]), 1.0))
    with pytest.raises(ValueError, match=r"T0 \(input 0\): a torch.sparse_coo torch tensor.*to_dense\(\)"):
        fd.execute([torch.ones(2, 4).to_sparse()])


def test_torch_import_is_zero_copy_and_keeps_the_tensor_alive():
    torch = pytest.importorskip("torch")
    x = torch.arange(12, dtype=torch.int64).reshape(3, 4)
    t = _C.Tensor.from_dlpack(x)
    assert t.data_ptr == x.data_ptr() and t.dtype == DataType.Int and t.shape == [3, 4]
    del x
    gc.collect()
    assert t.item(11) == 11.0


@pytest.mark.parametrize("dtype_name", ["bfloat16", "float16", "bool"])
def test_torch_dtypes_numpy_lacks_or_differs(dtype_name):
    torch = pytest.importorskip("torch")
    dtype = getattr(torch, dtype_name)
    x = (torch.randn(4, 5) > 0) if dtype_name == "bool" else torch.randn(4, 5).to(dtype)
    mf_dtype = {"bfloat16": DataType.BFloat16, "float16": DataType.Half, "bool": DataType.Bool}[dtype_name]
    with FusionDefinition() as fd:
        t = fd.define_tensor([-1, -1], mf_dtype)
        fd.add_output(fd.ops.set(t))
    (out,) = fd.execute([x])
    assert out.dtype == dtype
    assert torch.equal(out, x)


def test_torch_cuda_in_cuda_out():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or not _C.Communicator.instance().is_available(_C.CommunicatorBackend.cuda):
        pytest.skip("needs a GPU and a meshfuse built with CUDA")
    x = torch.randn(32, 16, device="cuda")
    with FusionDefinition() as fd:
        t = fd.define_tensor([-1, 16])
        fd.add_output(fd.ops.mul(fd.ops.sigmoid(t), 2.0))
    (out,) = fd.execute([x])
    assert out.is_cuda
    torch.testing.assert_close(out, torch.sigmoid(x) * 2.0, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_torch_fast_path_matches_and_rejects_what_it_cannot_take(device):
    """Contiguous torch tensors of the defined dtype take execute's fast path (no per-input
    validation); a wrong dtype, a non-contiguous view or a tensor that requires grad goes through
    the general checks (that input alone), which raise their usual errors."""
    torch = pytest.importorskip("torch")
    if device == "cuda" and (not torch.cuda.is_available()
                             or not _C.Communicator.instance().is_available(_C.CommunicatorBackend.cuda)):
        pytest.skip("needs a GPU and a meshfuse built with CUDA")
    with FusionDefinition() as fd:
        a = fd.define_tensor([-1, -1])
        b = fd.define_tensor([-1, -1], DataType.BFloat16)
        fd.add_output(fd.ops.add(a, fd.ops.cast(b, DataType.Float)))
        fd.add_output(fd.ops.cast(fd.ops.mul(a, 3.0), DataType.BFloat16))
    x = torch.randn(16, 24, device=device)
    y = torch.randn(16, 24, device=device).to(torch.bfloat16)
    assert fast_inputs(fd, [x, y]) == [True, True]
    for _ in range(2):  # the second run is served from the cache
        out, scaled = fd.execute([x, y])
        torch.testing.assert_close(out, x + y.float(), rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(scaled, (x * 3.0).to(torch.bfloat16), rtol=1e-2, atol=1e-2)
        assert out.device == x.device and scaled.dtype == torch.bfloat16
    with pytest.raises(TypeError, match="expected dtype Float"):
        fd.execute([x.double(), y])
    view = torch.randn(24, 16, device=device).t()
    assert fast_inputs(fd, [view, y]) == [True, True]  # the definition promises no layout: any strides do
    # A tensor that requires grad, and an nn.Parameter, are read detached on the fast path too.
    assert fast_inputs(fd, [x.requires_grad_(True), y]) == [True, True]
    assert fast_inputs(fd, [torch.nn.Parameter(x.detach()), y]) == [True, True]

    class Subclass(torch.Tensor):  # may override what it exports: the general checks see it
        pass

    assert fast_inputs(fd, [x.detach().as_subclass(Subclass), y]) == [False, True]
    out, _ = fd.execute([view, y])
    torch.testing.assert_close(out, view + y.float(), rtol=1e-6, atol=1e-6)


def fast_inputs(fd, inputs):
    """Which inputs execute() would take through its fast path."""
    plan, _ = fd._fast_plan()
    return [fd._fast_argument(e, x, _arrays.torch_dtype_map()) is not None for e, x in zip(plan, inputs)]


def test_torch_inputs_on_a_side_stream_are_ordered():
    """On a torch side stream the fast import/export is not used: the stream handshake orders
    torch's pending work on that stream before meshfuse reads, and meshfuse's before torch reads.
    Each call asks which stream is current once per device and keeps the answer for its other
    tensors only: a call on the default stream before side-stream calls changes nothing."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or not _C.Communicator.instance().is_available(_C.CommunicatorBackend.cuda):
        pytest.skip("needs a GPU and a meshfuse built with CUDA")
    with FusionDefinition() as fd:
        t = fd.define_tensor([-1])
        u = fd.define_tensor([-1])
        fd.add_output(fd.ops.mul(t, 2.0))
        fd.add_output(fd.ops.add(t, u))
    side = torch.cuda.Stream()
    for _ in range(2):
        # The default stream first: an answer kept from this call would send the side-stream calls
        # below through the fast path, unordered with torch's work there.
        x = torch.randn(1 << 10, device="cuda")
        out, total = fd.execute([x, x])
        torch.testing.assert_close(total, x * 2.0, rtol=1e-6, atol=1e-6)
        with torch.cuda.stream(side):
            for _ in range(3):
                x = torch.randn(1 << 22, device="cuda")
                y = x * 3.0  # queued on the side stream; meshfuse must see it finished
                z = x * 5.0  # the second input: the call's memo must say "side stream" for it too
                out, total = fd.execute([y, z])
                torch.testing.assert_close(out, x * 6.0, rtol=1e-6, atol=1e-6)
                torch.testing.assert_close(total, x * 8.0, rtol=1e-6, atol=1e-6)


def test_numpy_inputs_take_the_fast_path_one_by_one(rng):
    """Each input takes the fast path where it can: a strided view where the definition promises
    contiguity (or a bool mask under numpy < 2) is checked alone, the result is the same, and a bad
    input among fast ones is still an error naming it. A strided view (a transpose, a reversed view)
    of an input without that promise (the default) takes the fast path."""
    with FusionDefinition() as fd:
        a = fd.define_tensor([-1, -1])
        keep = fd.define_tensor([-1, -1], DataType.Bool)
        b = fd.define_tensor([-1, -1])
        s = fd.define_scalar(dtype=DataType.Double)
        c = fd.define_tensor([-1, -1], contiguity=True)
        fd.add_output(fd.ops.where(keep, fd.ops.add(a, fd.ops.mul(b, s)), fd.ops.sub(c, a)))
    x = rng.standard_normal((5, 7)).astype(np.float32)
    mask = rng.random((5, 7)) < 0.5
    view = rng.standard_normal((7, 5)).astype(np.float32).T
    dense = rng.standard_normal((5, 7)).astype(np.float32)
    assert fast_inputs(fd, [x, mask, view, 1.5, dense]) == [True, _arrays.exports_bool(np), True, True, True]
    assert fast_inputs(fd, [view, mask, x[::-1], 1.5, view]) == [True, _arrays.exports_bool(np), True, True, False]
    (out,) = fd.execute([x, mask, view, 1.5, dense])
    np.testing.assert_allclose(out, np.where(mask, x + view * 1.5, dense - x), rtol=1e-6, atol=1e-6)
    (out,) = fd.execute([view, mask, x[::-1], 1.5, dense])
    np.testing.assert_allclose(out, np.where(mask, view + x[::-1] * 1.5, dense - view), rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="contiguous"):
        fd.execute([x, mask, view, 1.5, view])  # c promised contiguity: the general path names it
    with pytest.raises(TypeError, match="expected dtype Float, got Double"):
        fd.execute([x, mask, np.ascontiguousarray(view, dtype=np.float64), 1.5, dense])
    with pytest.raises(ValueError, match="expected 5 inputs"):
        fd.execute([x, mask, view])


def test_a_broadcast_numpy_output_is_read_only_and_a_plain_one_writable():
    """A stride-0 output (broadcast_in_dim) written through one element changed a whole row; it comes
    back read-only, as np.broadcast_to's does, while the reshaped view and a computed output stay writable."""
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    with FusionDefinition() as fd:
        t = fd.define_tensor([2, 3])
        fd.add_output(fd.ops.reshape(t, [3, 2]))
        fd.add_output(fd.ops.broadcast_in_dim(fd.ops.slice(t, [0, 0], [1, 3]), [4, 3], [0, 1]))
        fd.add_output(fd.ops.neg(t))
    r, b, n = fd.execute([x])
    np.testing.assert_array_equal(b, np.broadcast_to(x[:1], (4, 3)))
    assert not b.flags.writeable
    with pytest.raises(ValueError, match="read-only"):
        b[3, 1] = -7.0
    if int(np.__version__.split(".")[0]) >= 2:  # numpy 1.x takes every DLPack array read-only
        assert r.flags.writeable and n.flags.writeable
        n[0, 0] = 5.0
        assert x[0, 0] == 0.0


def test_a_read_only_broadcast_input_is_copied_row_major():
    """A read-only numpy array (np.broadcast_to's) is copied before import; the copy kept the view's axis
    order, column-major here, so a definition of contiguous axes refused it naming strides it was never
    given ([1, 6])."""
    row = np.arange(8, dtype=np.float32)
    view = np.broadcast_to(row, (6, 8))
    with FusionDefinition() as fd:
        x = fd.define_tensor([6, 8], DataType.Float, contiguity=True)
        fd.add_output(fd.ops.mul(x, 2.0))
    np.testing.assert_array_equal(fd.execute([view])[0], 2.0 * view)
