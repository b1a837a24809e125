"""Under mpirun, a rank whose tests failed ends the whole job once pytest has printed its report.
Without this, a failure on one rank (pytest -x stops it) leaves the others to wait for it in their
next collective until MESHFUSE_TIMEOUT, while the failed rank blocks in MPI_Finalize's barrier."""
import os

from meshfuse.multidevice import Communicator

# CUDA attention's dropout is checked against float64 with the mask the CPU draws, which CUDA draws too
# only under MESHFUSE_ATTENTION_RNG=meshfuse (runtime/cuda/attention_rng.h); the default, cuDNN's
# in-kernel dropout, is checked by the tests that set it (test_attention_cudnn_rng.py, the sharded one
# in mp/test_attention_mp.py).
os.environ.setdefault("MESHFUSE_ATTENTION_RNG", "meshfuse")

_failed_status = {}


def pytest_sessionfinish(session, exitstatus):
    _failed_status["status"] = int(exitstatus)


def pytest_unconfigure(config):
    status = _failed_status.get("status", 0)
    if status not in (0, 5) and Communicator._exists() and Communicator.instance().size > 1:  # 5: none collected
        comm = Communicator.instance()
        comm._abort_job(status, f"pytest exited with status {status} on rank {comm.rank}: see its report above")
