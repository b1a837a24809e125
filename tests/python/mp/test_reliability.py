"""Reliability from Python (run under mpirun -np 2 and -np 4 by scripts/test; also a world of 1):
a thousand cached executes keep resident memory and meshfuse's live CPU bytes flat on every rank,
and ranks whose definitions differ all get a ValueError naming the differing rank and line (the
consistency check of a new program), after which the world still executes correctly."""
import os
import time

import numpy as np
import pytest

import meshfuse
from meshfuse import DataType, FusionDefinition, ParallelType
from meshfuse.multidevice import Communicator, DeviceMesh

RANK, WORLD = Communicator.instance().rank, Communicator.instance().size


def _resident_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _gather_relu(negate=False, output_mesh=None):
    """x [2*WORLD, 3] sharded on axis 0; out = relu(x) (or -x) replicated: an allgather (on
    `output_mesh` when given)."""
    with FusionDefinition() as fd:
        x = fd.define_tensor(shape=[2 * WORLD, 3], dtype=DataType.Float)
        y = fd.ops.neg(x) if negate else fd.ops.relu(x)
        fd.add_output(y)
        mesh = DeviceMesh(range(WORLD))
        x.set_device_mesh(mesh)
        y.set_device_mesh(mesh if output_mesh is None else output_mesh)
        x.outer_split(0, WORLD)
        x.axis(0).parallelize(ParallelType.mesh_x)
    return fd


FULL = np.random.default_rng(7).standard_normal((2 * WORLD, 3)).astype(np.float32)
MINE = FULL[2 * RANK : 2 * RANK + 2].copy()


def test_cached_execute_loop_keeps_memory_flat():
    fd = _gather_relu()
    expected = np.maximum(FULL.astype(np.float64), 0)
    for _ in range(200):  # warm-up: the program is lowered and cached, pools fill
        (out,) = fd.execute([MINE])
    np.testing.assert_allclose(np.asarray(out), expected, rtol=1e-6)
    del out
    rss, live = _resident_bytes(), meshfuse._C.cpu_bytes_in_use()
    for _ in range(1000):
        (out,) = fd.execute([MINE])
        assert out.shape == (2 * WORLD, 3)
    np.testing.assert_allclose(np.asarray(out), expected, rtol=1e-6)
    del out
    assert meshfuse._C.cpu_bytes_in_use() == live, f"rank {RANK}: live CPU tensor bytes changed"
    grown = _resident_bytes() - rss
    assert grown < 2 << 20, f"rank {RANK}: resident memory grew by {grown} bytes over 1000 executes"


@pytest.mark.skipif(WORLD < 2, reason="needs two or more ranks")
def test_different_definitions_raise_on_every_rank_then_the_world_recovers():
    last = WORLD - 1
    fd = _gather_relu(negate=RANK == last)
    with pytest.raises(ValueError) as info:
        fd.execute([MINE])
    message = str(info.value)
    assert "lowered different programs" in message
    assert f"rank {last} differs from rank 0" in message
    assert "the first difference is line" in message
    (out,) = _gather_relu().execute([MINE])  # nothing was left pending
    np.testing.assert_allclose(np.asarray(out), np.maximum(FULL, 0), rtol=1e-6)


@pytest.mark.skipif(WORLD < 2, reason="needs two or more ranks")
def test_lowering_failure_on_one_rank_raises_on_every_rank_at_once():
    """The last rank's output sits on a [1, WORLD] mesh the inputs' mesh cannot reach, so only its
    lowering fails: it joins the consistency check with its error, and every rank raises at once
    (not after MESHFUSE_TIMEOUT) with a ValueError naming it."""
    last = WORLD - 1
    fd = _gather_relu(output_mesh=DeviceMesh(list(range(WORLD)), [1, WORLD]) if RANK == last else None)
    start = time.monotonic()
    with pytest.raises(ValueError) as info:
        fd.execute([MINE])
    elapsed = time.monotonic() - start
    message = str(info.value)
    if RANK == last:
        assert "cannot move" in message
    else:
        assert f"rank {last} failed while lowering this fusion" in message
        assert "cannot move" in message, "the failing rank's error is shown"
    assert elapsed < 5, f"rank {RANK} waited {elapsed:.1f} s for the failing rank"
    (out,) = _gather_relu().execute([MINE])  # nothing was left pending
    np.testing.assert_allclose(np.asarray(out), np.maximum(FULL, 0), rtol=1e-6)
