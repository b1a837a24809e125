"""meshfuse: define a tensor program once with global shapes, shard it over a device mesh, and run it
on every rank with that rank's shards (nvFuser's multidevice Python API).

    from meshfuse import DataType, FusionDefinition, CommunicatorBackend, ParallelType
    from meshfuse.multidevice import DeviceMesh, Communicator
"""
import os as _os
import sys as _sys

# Open MPI loads its transport plugins with dlopen, and they need libmpi's symbols: libmpi (a
# dependency of _C through libmeshfuse) must be loaded RTLD_GLOBAL, or MPI_Init fails in Python.
# Only libmpi: _C itself stays RTLD_LOCAL, so nothing in it can interpose on the symbols of
# libraries loaded later (torch crashed when it resolved libstdc++ functions to a global _C).
def _load_libmpi_globally():
    import ctypes
    import ctypes.util

    for name in ("libmpi.so.40", "libmpi.so.12", ctypes.util.find_library("mpi")):
        if not name:
            continue
        try:
            ctypes.CDLL(name, mode=ctypes.RTLD_GLOBAL)
            return True
        except OSError:
            continue
    return False


if _load_libmpi_globally():
    from . import _C
else:  # an MPI library under another name: load _C (and with it libmpi) globally instead
    _saved_dlopen_flags = _sys.getdlopenflags()
    _sys.setdlopenflags(_os.RTLD_GLOBAL | _os.RTLD_NOW)
    try:
        from . import _C
    finally:
        _sys.setdlopenflags(_saved_dlopen_flags)

from ._C import CommunicationTimeout, CommunicatorBackend, DataType, ParallelType
from ._version import __version__
from .fusion_definition import FusionDefinition
from . import _abort_on_exception, _settings
from ._settings import SettingWarning

_abort_on_exception.install(_C.Communicator)
_settings.warn_about_ignored_settings()


def available_backends():
    """The communicator backends built into this meshfuse whose libraries load in this process. nccl and
    cuda carry CUDA tensors: they are listed wherever they were built, and an execution on them on a
    machine without a CUDA device raises on every rank ("no CUDA device")."""
    return list(_C.Communicator.instance().available_backends())


__all__ = [
    "CommunicationTimeout",
    "CommunicatorBackend",
    "DataType",
    "FusionDefinition",
    "ParallelType",
    "SettingWarning",
    "available_backends",
    "__version__",
]
