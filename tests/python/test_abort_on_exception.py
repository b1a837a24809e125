"""The uncaught-exception hook (meshfuse/_abort_on_exception.py): when it aborts the job, and that it
never hides the traceback. The abort itself, across 4 ranks, is the reliability_python_rank_raises
ctest entry."""
import os
import subprocess
import sys

import pytest

import meshfuse
from meshfuse import _abort_on_exception

PYTHON_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir, "python")


@pytest.mark.parametrize(
    "world_size, interactive, setting, expected",
    [
        (4, False, None, True),
        (2, False, "1", True),
        (2, False, "0", False),
        (2, False, " off ", False),
        (2, False, "false", False),
        (2, False, " OFF ", False),  # read as the C++ exit handler reads it: case does not matter
        (2, False, "No", False),
        (2, True, None, False),  # an interactive interpreter survives its exceptions
        (1, False, None, False),  # a world of one has nobody waiting
        (1, False, "1", False),
    ],
)
def test_when_an_uncaught_exception_aborts_the_job(world_size, interactive, setting, expected):
    assert _abort_on_exception.should_abort_on_exception(world_size, interactive, setting) is expected


def _run(code, env_extra=None):
    env = dict(os.environ, PYTHONPATH=PYTHON_DIR, **(env_extra or {}))
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)


def test_importing_meshfuse_installs_the_hook_over_the_previous_one():
    done = _run(
        "import sys\n"
        "first = sys.excepthook\n"
        "import meshfuse\n"
        "assert sys.excepthook is not first\n"
        "assert sys.excepthook.meshfuse_previous is first\n"
    )
    assert done.returncode == 0, done.stderr


def test_in_a_world_of_one_the_traceback_is_printed_and_nothing_aborts():
    done = _run(
        "import meshfuse\n"
        "from meshfuse.multidevice import Communicator\n"
        "assert Communicator._exists() is False\n"
        "assert Communicator.instance().size == 1\n"
        "assert Communicator._exists() is True\n"
        "raise ValueError('raised on purpose')\n"
    )
    assert done.returncode == 1, done.stderr
    assert "ValueError: raised on purpose" in done.stderr
    assert "Traceback" in done.stderr
    assert "aborts the job" not in done.stderr


def test_without_a_communicator_the_hook_does_not_start_mpi():
    done = _run("import meshfuse\nraise KeyError('no world')\n")
    assert done.returncode == 1
    assert "KeyError: 'no world'" in done.stderr
    assert "aborts the job" not in done.stderr
