"""torch when it is installed and sees a CUDA GPU, else None: the CUDA tests' skip condition, shared by
the single-process tests (conftest.torch_cuda_available) and the mp ones (which put tests/python on
sys.path; their own conftest shadows this directory's)."""


def torch_cuda():
    try:
        import torch
    except ImportError:
        return None
    return torch if torch.cuda.is_available() else None
