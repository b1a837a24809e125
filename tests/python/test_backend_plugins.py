"""The UCC backend is a plugin (multidevice/backend_plugins.h): a process that never asks for UCC does
not load UCX, whose memory hooks cost 0.4 s of every process's start on the development VM; one that
asks gets it. Each case runs in a child process, whose loaded libraries it reads from /proc."""
import os
import subprocess
import sys

import pytest

import meshfuse
from meshfuse import CommunicatorBackend

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir)

pytestmark = pytest.mark.skipif(CommunicatorBackend.ucc not in meshfuse.available_backends(),
                                reason="this build has no UCC backend")

CHILD = """
import numpy as np
from meshfuse import CommunicatorBackend, FusionDefinition
from meshfuse.multidevice import Communicator

def loaded(name):
    with open("/proc/self/maps") as maps:
        return name in maps.read()

with FusionDefinition() as fd:
    fd.add_output(fd.ops.add(fd.define_tensor([4]), 1.0))
(out,) = fd.execute([np.zeros(4, np.float32)])
assert (out == 1).all()
print("after a CPU fusion:", loaded("libmeshfuse_ucc"), loaded("libucs"))
print("ucc available:", Communicator.instance().is_available(CommunicatorBackend.ucc))
print("after asking for UCC:", loaded("libmeshfuse_ucc"), loaded("libucs"))
"""


def _run_child(code, **env):
    path = os.pathsep.join(p for p in (os.path.join(ROOT, "python"), os.environ.get("PYTHONPATH")) if p)
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=dict(os.environ, PYTHONPATH=path, **env),
                          capture_output=True, text=True, timeout=120)


def test_ucc_plugin_loads_only_when_asked_for():
    run = _run_child(CHILD)
    assert run.returncode == 0, run.stdout + run.stderr
    lines = run.stdout.splitlines()
    assert "after a CPU fusion: False False" in lines, run.stdout
    assert "ucc available: True" in lines, run.stdout
    assert "after asking for UCC: True True" in lines, run.stdout


BROKEN_CHILD = """
import numpy as np
from meshfuse import CommunicatorBackend, FusionDefinition
from meshfuse.multidevice import Communicator

assert not Communicator.instance().is_available(CommunicatorBackend.ucc)
assert CommunicatorBackend.ucc not in Communicator.instance().available_backends()
try:
    with FusionDefinition(backend_type=CommunicatorBackend.ucc) as fd:
        fd.add_output(fd.ops.add(fd.define_tensor([4]), 1.0))
except ValueError as e:
    print("error:", e)
with FusionDefinition(backend_type=CommunicatorBackend.mpi) as fd:  # the other backends still work
    fd.add_output(fd.ops.add(fd.define_tensor([4]), 1.0))
(out,) = fd.execute([np.zeros(4, np.float32)])
assert (out == 1).all()
print("mpi ran")
"""


def test_a_plugin_that_does_not_load_says_why(tmp_path):
    # As when a wheel moves to a machine without the UCC it was built with: the loader finds an empty
    # libucc.so.1 first (LD_LIBRARY_PATH is searched before the plugin's run path) and refuses it.
    (tmp_path / "libucc.so.1").write_bytes(b"")
    run = _run_child(BROKEN_CHILD, LD_LIBRARY_PATH=os.pathsep.join(
        p for p in (str(tmp_path), os.environ.get("LD_LIBRARY_PATH")) if p))
    assert run.returncode == 0, run.stdout + run.stderr
    error = next((line for line in run.stdout.splitlines() if line.startswith("error: ")), None)
    assert error is not None, run.stdout
    assert "communicator backend ucc is not available in this build (its plugin " in error, error
    assert "libmeshfuse_ucc.so did not load: " in error and "libucc.so.1" in error, error
    assert "available: " in error and "mpi" in error.split("available: ")[-1], error
    assert "mpi ran" in run.stdout.splitlines(), run.stdout
