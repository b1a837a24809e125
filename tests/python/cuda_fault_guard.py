"""A pytest plugin for the GPU runs: after a test dies of a CUDA fault (a misaligned or illegal
address, a launch failure), the process's CUDA context is unusable, and every later CUDA test would
fail with the same error, burying the one that caused it (18 such failures in session 15). The CUDA
tests after the first fault are therefore reported as errors that name it, without running them.
They still fail the run: nothing is skipped."""
import pytest

# What torch and meshfuse put in the message of an error that leaves the context unusable.
CUDA_FAULT_MARKERS = ("CUDA error", "misaligned address", "illegal memory access", "unspecified launch failure",
                      "an illegal instruction")

# Per pytest session (not per process: a session run inside another one, as the plugin's own test does,
# starts clean): (test id, first line of its error) of the first fault.
FIRST_FAULT = pytest.StashKey[tuple]()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    stash = item.config.stash
    if FIRST_FAULT not in stash and report.failed and call.excinfo is not None:
        text = str(call.excinfo.value)
        if any(marker in text for marker in CUDA_FAULT_MARKERS):
            stash[FIRST_FAULT] = (item.nodeid, text.strip().splitlines()[0][:200])


def pytest_runtest_setup(item):
    fault = item.config.stash.get(FIRST_FAULT, None)
    if fault is not None and "cuda" in item.name:
        pytest.fail(f"not run: {fault[0]} hit a CUDA fault ({fault[1]}), which leaves this process's CUDA "
                    f"context unusable", pytrace=False)
