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


def test_ucc_plugin_loads_only_when_asked_for():
    path = os.pathsep.join(p for p in (os.path.join(ROOT, "python"), os.environ.get("PYTHONPATH")) if p)
    run = subprocess.run([sys.executable, "-c", CHILD], cwd=ROOT, env=dict(os.environ, PYTHONPATH=path),
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    lines = run.stdout.splitlines()
    assert "after a CPU fusion: False False" in lines, run.stdout
    assert "ucc available: True" in lines, run.stdout
    assert "after asking for UCC: True True" in lines, run.stdout
