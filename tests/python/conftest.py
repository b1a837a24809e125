"""Makes the in-tree package importable (python/meshfuse with the built _C beside it) and provides
helpers shared by the front-end tests."""
import os
import sys
import zlib

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir, "python"))

import meshfuse  # noqa: E402
from meshfuse import DataType, FusionDefinition  # noqa: E402
from torch_gpu import torch_cuda  # noqa: E402

# CUDA attention's dropout is checked against float64 with the mask the CPU draws, which CUDA draws too
# only under MESHFUSE_ATTENTION_RNG=meshfuse (runtime/cuda/attention_rng.h); the default, cuDNN's
# in-kernel dropout, is checked by the tests that set it (test_attention_cudnn_rng.py, the sharded one
# in mp/test_attention_mp.py).
os.environ.setdefault("MESHFUSE_ATTENTION_RNG", "meshfuse")

# After a CUDA fault, the later CUDA tests report it instead of each failing on a dead context; the torch
# tests skipped for want of torch are listed for scripts/test's second interpreter (torch_skips.py).
pytest_plugins = ["cuda_fault_guard", "torch_skips"]

NUMPY_DTYPE = {
    DataType.Float: np.float32,
    DataType.Double: np.float64,
    DataType.Half: np.float16,
    DataType.Int: np.int64,
    DataType.Int32: np.int32,
    DataType.Bool: np.bool_,
}
DATA_TYPE = {np.dtype(v): k for k, v in NUMPY_DTYPE.items()}


@pytest.fixture
def rng(request):
    # A seed per test (stable across runs, different between tests).
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))


def random_array(rng, shape, dtype, low=-2.0, high=2.0):
    """Random values of a numpy dtype; integers in [-5, 5], bools half true."""
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return rng.random(shape) < 0.5
    if np.issubdtype(dtype, np.integer):
        return rng.integers(-5, 6, size=shape).astype(dtype)
    return rng.uniform(low, high, size=shape).astype(dtype)


def run_fusion(build, *arrays, symbolic=True):
    """Defines a fusion with one input per array (symbolic extents unless told otherwise), adds the
    output(s) that build(fd, *tvs) returns, and executes it on the arrays."""
    with FusionDefinition() as fd:
        tvs = [fd.define_tensor([-1] * a.ndim if symbolic else list(a.shape), DATA_TYPE[a.dtype]) for a in arrays]
        outs = build(fd, *tvs)
        for out in outs if isinstance(outs, (list, tuple)) else [outs]:
            fd.add_output(out)
    return fd.execute(list(arrays))


def tolerance(dtype):
    """(rtol, atol) for results computed in a dtype, against a float64 reference."""
    dtype = np.dtype(dtype)
    if dtype == np.float16:
        return 2e-3, 2e-3
    if dtype == np.float32:
        return 2e-5, 1e-6
    if dtype == np.float64:
        return 1e-12, 1e-14
    return 0, 0


def torch_cuda_available():
    """Whether torch is installed and sees a CUDA GPU (the CUDA tests' skip condition)."""
    return torch_cuda() is not None
