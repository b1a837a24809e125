"""Reliability from Python (run under mpirun -np 2 and -np 4 by scripts/test; also a world of 1):
a thousand cached executes keep resident memory and meshfuse's live CPU bytes flat on every rank,
and ranks whose definitions differ all get a ValueError naming the differing rank and line (execute's
agreement, every call: also when the ranks call cached fusions in another order, or from threads),
after which the world still executes correctly."""
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
    assert "Their definitions differ" in message
    assert f"rank {last} differs from rank 0" in message
    assert "the first difference is line" in message
    (out,) = _gather_relu().execute([MINE])  # nothing was left pending
    np.testing.assert_allclose(np.asarray(out), np.maximum(FULL, 0), rtol=1e-6)


@pytest.mark.skipif(WORLD < 2, reason="needs two or more ranks")
def test_definitions_that_differ_only_in_a_constant_raise_on_every_rank():
    """The definition's text named a constant without its value (mul(T2, S3)), so ranks scaling by 2
    and by 2.0000001 (a dropout probability, an eps) agreed and returned different 'replicated'
    outputs. The constants' values (to the last bit) are part of the definition now."""
    factor = 2.0 if RANK == 0 else np.nextafter(2.0, 3.0)
    with FusionDefinition() as fd:
        x = fd.define_tensor(shape=[2 * WORLD, 3], dtype=DataType.Float)
        y = fd.ops.mul(fd.ops.sum(x, [0]), factor)
        fd.add_output(y)
        x.set_device_mesh(DeviceMesh(range(WORLD)))
        x.outer_split(0, WORLD)
        x.axis(0).parallelize(ParallelType.mesh_x)
    with pytest.raises(ValueError, match="Their definitions differ") as info:
        fd.execute([MINE])
    assert "=2)'" in str(info.value) and "=2.0000000000000004)'" in str(info.value), str(info.value)


@pytest.mark.skipif(WORLD < 2, reason="needs two or more ranks")
def test_a_definition_one_rank_cannot_lower_raises_on_every_rank_at_once():
    """The last rank's output sits on a [1, WORLD] mesh the inputs' mesh cannot reach, so only it
    could not lower its program. The definitions differ, so every rank raises at once (not after
    MESHFUSE_TIMEOUT) in execute's agreement, before lowering, with a ValueError showing the line."""
    last = WORLD - 1
    fd = _gather_relu(output_mesh=DeviceMesh(list(range(WORLD)), [1, WORLD]) if RANK == last else None)
    start = time.monotonic()
    with pytest.raises(ValueError) as info:
        fd.execute([MINE])
    elapsed = time.monotonic() - start
    message = str(info.value)
    assert "called execute on different fusions" in message
    assert f"rank {last} differs from rank 0" in message
    assert f"[1, {WORLD}] = relu(T0)" in message, "the last rank's line is shown"
    assert elapsed < 5, f"rank {RANK} waited {elapsed:.1f} s for the failing rank"
    (out,) = _gather_relu().execute([MINE])  # nothing was left pending
    np.testing.assert_allclose(np.asarray(out), np.maximum(FULL, 0), rtol=1e-6)


CPU_BACKENDS = [b for b in (meshfuse.CommunicatorBackend.mpi, meshfuse.CommunicatorBackend.gloo,
                            meshfuse.CommunicatorBackend.ucc) if b in meshfuse.available_backends()]


def _gather_and_sum(backend):
    """Two fusions of the same input x [2*WORLD, 3] sharded on axis 0: x gathered (an allgather)
    and x summed over axis 0 (an allreduce)."""
    fds = []
    for make in (lambda fd, x: fd.ops.relu(x), lambda fd, x: fd.ops.sum(x, [0])):
        with FusionDefinition(backend_type=backend) as fd:
            x = fd.define_tensor(shape=[2 * WORLD, 3], dtype=DataType.Float)
            y = make(fd, x)
            fd.add_output(y)
            y.set_device_mesh(DeviceMesh(range(WORLD)))  # replicated
            x.set_device_mesh(DeviceMesh(range(WORLD)))
            x.outer_split(0, WORLD)
            x.axis(0).parallelize(ParallelType.mesh_x)
        fds.append(fd)
    return fds


@pytest.mark.skipif(WORLD < 2, reason="needs two or more ranks")
@pytest.mark.parametrize("backend", CPU_BACKENDS, ids=lambda b: b.name)
def test_cached_fusions_called_in_another_order_raise_on_every_rank(backend):
    """Rank 0 executes one cached fusion while the others execute another: their programs had passed
    the new-program check long before, and each rank ran its own (UCC returned wrong data without an
    error, MPI aborted the job on a truncated message). Every rank now raises, and the world recovers."""
    gather, total = _gather_and_sum(backend)
    gather.execute([MINE])
    total.execute([MINE])
    with pytest.raises(ValueError, match="called execute on different fusions") as info:
        (gather if RANK == 0 else total).execute([MINE])
    assert "the first difference is line" in str(info.value)
    (out,) = gather.execute([MINE])
    np.testing.assert_allclose(np.asarray(out), np.maximum(FULL, 0), rtol=1e-6)
    (out,) = total.execute([MINE])
    np.testing.assert_allclose(np.asarray(out), FULL.sum(axis=0), rtol=1e-5)


@pytest.mark.skipif(WORLD < 2, reason="needs two or more ranks")
@pytest.mark.parametrize("backend", CPU_BACKENDS, ids=lambda b: b.name)
def test_threads_executing_different_fusions_match_or_raise(backend):
    """Two threads a rank, each executing its own fusion in a loop: steps pair the ranks' executions
    in whatever order the threads take turns, so some pair different fusions. Each must return the
    right result or raise the mismatch on every rank (the job died with MPI_ERR_TRUNCATE; UCC raised
    internal errors from interleaved out-of-band exchanges)."""
    import threading

    gather, total = _gather_and_sum(backend)
    outcomes = {"matched": 0, "raised": 0, "wrong": []}
    lock = threading.Lock()

    def loop(fd, expected):
        for _ in range(20):
            try:
                (out,) = fd.execute([MINE])
                ok = np.allclose(np.asarray(out), expected, rtol=1e-5)
                with lock:
                    outcomes["matched" if ok else "wrong"] += 1 if ok else ["wrong result"]
            except ValueError as e:
                with lock:
                    if "called execute on different fusions" in str(e):
                        outcomes["raised"] += 1
                    else:
                        outcomes["wrong"].append(str(e))

    threads = [threading.Thread(target=loop, args=(gather, np.maximum(FULL, 0))),
               threading.Thread(target=loop, args=(total, FULL.sum(axis=0)))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "an execution hung"
    assert outcomes["wrong"] == [], outcomes["wrong"][:3]
    assert outcomes["matched"] + outcomes["raised"] == 40


@pytest.mark.skipif(WORLD < 2, reason="needs two or more ranks")
def test_a_wrappers_own_check_failing_on_one_rank_reaches_every_rank():
    """meshfuse.torch's layer checks its arguments before execute: a failure on one rank raised there
    alone, and the other ranks paired their step with that rank's next one (or waited out the
    timeout). report_error() hands it to the ranks in execute, which raise it too; the next step then
    runs in step on every rank."""
    fd = _gather_relu()
    if RANK == WORLD - 1:
        fd.report_error(TypeError("the batch is a list, not a tensor"))
    else:
        with pytest.raises(TypeError, match=f"rank {WORLD - 1} failed its input check.*the batch is a list"):
            fd.execute([MINE])
    (out,) = fd.execute([MINE])
    np.testing.assert_array_equal(out, np.maximum(FULL, 0))


@pytest.mark.skipif(WORLD < 2, reason="needs two or more ranks")
def test_a_wrong_dtype_on_one_rank_is_a_type_error_on_every_rank():
    """The rank that passed float64 raised TypeError, the others ValueError: one except clause could not
    handle the failure everywhere. Now every rank raises TypeError, the others naming the rank."""
    fd = _gather_relu()
    mine = MINE.astype(np.float64) if RANK == WORLD - 1 else MINE
    with pytest.raises(TypeError, match="expected dtype Float, got Double") as info:
        fd.execute([mine])
    if RANK != WORLD - 1:
        assert f"rank {WORLD - 1} failed its input check" in str(info.value)
    (out,) = fd.execute([MINE])  # nothing was left pending
    np.testing.assert_allclose(np.asarray(out), np.maximum(FULL, 0), rtol=1e-6)


def test_a_forked_child_is_no_rank_and_its_exit_leaves_the_world_alone():
    """A fork of a rank (a data loader's worker) that executed took part in the parent's collectives as
    the parent's rank, and the parent's next execute returned garbage; a child that exited ran MPI's
    finalize (or abort) on the parent's world and hung the job. Now the child's meshfuse raises, its
    exit (C's exit, so meshfuse's exit handler runs) leaves the world alone, and the ranks go on."""
    import ctypes
    fd = _gather_relu()
    np.testing.assert_array_equal(fd.execute([MINE])[0], np.maximum(FULL, 0))
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 3
        try:
            Communicator.instance()
            code = 10
        except ValueError as e:
            code = code if f"is a fork of rank {RANK}" in str(e) else 11
        try:
            fd.execute([MINE])
            code = 12
        except ValueError:
            pass
        ctypes.CDLL(None).exit(code)
        os._exit(13)  # not reached
    deadline = time.monotonic() + 60
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        assert time.monotonic() < deadline, "the forked child did not exit"
        time.sleep(0.05)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 3, status
    np.testing.assert_array_equal(fd.execute([MINE])[0], np.maximum(FULL, 0))


def test_a_process_a_rank_starts_is_no_rank_and_says_so():
    """A worker that a rank starts (multiprocessing's spawn, a subprocess) inherits the rank's launcher
    environment: MPI_Init there crashed ("orte_init failed") or hung the pool. It raises a clear error
    now, and the rank goes on."""
    import subprocess
    import sys
    code = ("from meshfuse.multidevice import Communicator\n"
            "try:\n"
            "    Communicator.instance()\n"
            "except ValueError as e:\n"
            "    print(e)\n"
            "    raise SystemExit(3)\n")
    env = dict(os.environ)
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    if "PMIX_NAMESPACE" not in env:  # not started by a launcher (a world of one): the child is a world of one
        assert child.returncode == 0, child.stderr
        return
    assert child.returncode == 3, (child.stdout, child.stderr)
    assert f"was started by rank {RANK}" in child.stdout and "is no rank" in child.stdout, child.stdout
    fd = _gather_relu()
    np.testing.assert_array_equal(fd.execute([MINE])[0], np.maximum(FULL, 0))
