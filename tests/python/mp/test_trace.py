"""The Chrome trace of a stream-split execution (run under mpirun): rank 0 writes one JSON file with
every rank's events (pid = rank), compute on lane 0 and communication on lanes 1.., and one event
per chunk of both the matmul and the communication, ordered as the pipeline requires."""
import json
import os
import re
import sys
import tempfile

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir, os.pardir,
                                "benchmarks"))

import meshfuse  # noqa: E402
from meshfuse import CommunicatorBackend  # noqa: E402
from meshfuse.multidevice import Communicator  # noqa: E402
from overlap_patterns import ALLGATHER_LINEAR, PATTERNS, OverlapProgram  # noqa: E402

RANK, WORLD = Communicator.instance().rank, Communicator.instance().size
CHUNKS, STREAMS = 4, 2
ROUNDING_US = 0.002  # ts and dur are written with 3 decimals each
CHUNK_EVENT = re.compile(r"^(?P<op>\w+) \[chunk (?P<chunk>\d+)\]$")


def traced_run(pattern, path, use_env=False, monkeypatch=None):
    rows, k, cols = 8 * WORLD, 4 * WORLD, 4 * WORLD
    p = OverlapProgram(pattern, rows, k, cols, chunks=CHUNKS, backend=CommunicatorBackend.mpi,  # carries CPU tensors in every build
                       number_of_streams=STREAMS)
    x = np.arange(rows * k, dtype=np.float32).reshape(rows, k) / (rows * k)
    w = np.ones((cols, k), dtype=np.float32)
    if use_env:
        monkeypatch.setenv("MESHFUSE_TRACE", path)
        p.execute(p.local_inputs(x, w, RANK))
    else:
        p.execute(p.local_inputs(x, w, RANK), trace=path)


def load_events(path):
    with open(path) as f:
        doc = json.load(f)
    assert isinstance(doc, dict) and isinstance(doc.get("traceEvents"), list), doc
    return doc["traceEvents"]


def chunk_events(events, pid, category):
    """{chunk index: event} of one rank's chunk events in a category."""
    found = {}
    for e in events:
        m = CHUNK_EVENT.match(e.get("name", ""))
        if e.get("ph") == "X" and e["pid"] == pid and e["cat"] == category and m:
            assert int(m["chunk"]) not in found, f"two {category} events for chunk {m['chunk']} on rank {pid}"
            found[int(m["chunk"])] = e
    return found


@pytest.mark.parametrize("pattern", PATTERNS)
def test_trace_has_every_rank_lane_and_chunk(pattern):
    with tempfile.TemporaryDirectory() as tmp:  # per process: only rank 0's path gets a file
        path = os.path.join(tmp, "trace.json")
        traced_run(pattern, path)
        if RANK != 0:
            assert not os.path.exists(path), "only rank 0 writes the trace"
            return
        assert os.path.getsize(path) > 0
        events = load_events(path)

    spans = [e for e in events if e.get("ph") == "X"]
    assert {e["pid"] for e in spans} == set(range(WORLD)), "an event of every rank"
    for e in spans:
        assert e["dur"] >= 0 and e["ts"] >= 0, e
        assert (e["tid"] == 0) == (e["cat"] == "compute"), f"compute on lane 0, communication on lanes 1..: {e}"
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    for pid in range(WORLD):
        assert names[(pid, 0)] == "compute"
        assert {names[(pid, 1 + s)] for s in range(STREAMS)} == {f"comm stream {s}" for s in range(STREAMS)}
        compute = chunk_events(events, pid, "compute")
        comm = chunk_events(events, pid, "communication")
        assert sorted(compute) == sorted(comm) == list(range(CHUNKS)), (compute, comm)
        assert {e["tid"] for e in comm.values()} == {1, 2}, "the chunks alternate between the two streams"
        assert all(e["name"].startswith("linear") for e in compute.values())
        for i in range(CHUNKS):
            if pattern == ALLGATHER_LINEAR:
                assert comm[i]["name"].startswith("Allgather")
                # chunk i's matmul starts after its allgather, and the next allgather was already posted
                assert comm[i]["ts"] + comm[i]["dur"] <= compute[i]["ts"] + ROUNDING_US
                if i + 1 < CHUNKS:
                    assert comm[i + 1]["ts"] < compute[i]["ts"], "the next chunk is in flight during this matmul"
            else:
                assert comm[i]["name"].startswith("ReduceScatter")
                assert compute[i]["ts"] + compute[i]["dur"] <= comm[i]["ts"] + ROUNDING_US
                if i + 1 < CHUNKS:
                    assert compute[i + 1]["ts"] < comm[i]["ts"] + comm[i]["dur"], "in flight during the next matmul"
        # At most STREAMS chunks in flight, each on its own lane: a lane's events follow one another (the
        # reduce-scatter loop posted chunk i before waiting for chunk i - STREAMS, on the same lane).
        for lane in {e["tid"] for e in comm.values()}:
            on_lane = sorted((e for e in comm.values() if e["tid"] == lane), key=lambda e: e["ts"])
            for a, b in zip(on_lane, on_lane[1:]):
                assert a["ts"] + a["dur"] <= b["ts"] + ROUNDING_US, f"lane {lane} of rank {pid}: {a} overlaps {b}"


def test_trace_from_the_environment(monkeypatch):
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "env_trace.json")
        traced_run(ALLGATHER_LINEAR, path, use_env=True, monkeypatch=monkeypatch)
        if RANK == 0:
            events = load_events(path)
            assert {e["pid"] for e in events if e.get("ph") == "X"} == set(range(WORLD))


def gather_of_rows():
    """An allgather of a [2 * WORLD, 3] tensor's row blocks (no stream split), on MPI."""
    from meshfuse import DataType, FusionDefinition, ParallelType
    from meshfuse.multidevice import DeviceMesh
    mesh = DeviceMesh(range(WORLD))
    with FusionDefinition(backend_type=CommunicatorBackend.mpi) as fd:
        x = fd.define_tensor([2 * WORLD, 3], DataType.Float)
        y = fd.ops.set(x)
        fd.add_output(y)
        x.set_device_mesh(mesh)
        x.outer_split(0, WORLD)
        x.axis(0).parallelize(ParallelType.mesh_x)
        y.set_device_mesh(mesh)
    return fd


def test_a_trace_asked_on_one_rank_only_fails_on_every_rank():
    """A trace is gathered from every rank, so it is asked on all or none: rank 0 alone asking used to
    end the job in an MPI truncation error. Every rank raises, naming both, and the next execution,
    traced on every rank, writes its file."""
    fd = gather_of_rows()
    local = np.full((2, 3), RANK, np.float32)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "t.json")
        with pytest.raises(ValueError, match="rank 0 asks for a trace and rank 1 does not"):
            fd.execute([local], trace=path if RANK == 0 else None)
        (whole,) = fd.execute([local], trace=path)
        np.testing.assert_array_equal(whole[:, 0], np.repeat(np.arange(WORLD), 2))
        if RANK == 0:
            with open(path) as f:
                assert {e["pid"] for e in json.load(f)["traceEvents"] if "pid" in e} >= set(range(WORLD))


def test_a_trace_path_rank_0_cannot_write_fails_on_every_rank_before_running():
    """Rank 0 writes the trace: a path it cannot open used to raise there alone, after the program ran,
    while the other ranks returned normally."""
    fd = gather_of_rows()
    local = np.full((2, 3), RANK, np.float32)
    with pytest.raises(ValueError, match="cannot write the trace to /nonexistent-meshfuse-dir/t.json"):
        fd.execute([local], trace="/nonexistent-meshfuse-dir/t.json")
    # A folder is writable, but not as a file: it passed the check, and rank 0 alone raised after the run.
    with pytest.raises(ValueError, match="cannot write the trace to /tmp: it is a directory"):
        fd.execute([local], trace="/tmp")
    np.testing.assert_array_equal(fd.execute([local])[0][:, 0], np.repeat(np.arange(WORLD), 2))


@pytest.mark.parametrize("pattern", PATTERNS)
def test_a_host_trace_keeps_a_stream_loops_chunk_events(pattern):
    """trace_host=True traced a stream loop as one "stream loop" span: its chunks' communications and
    matmul launches were gone. They are host-timed events inside that span now."""
    rows, k, cols = 8 * WORLD, 4 * WORLD, 4 * WORLD
    p = OverlapProgram(pattern, rows, k, cols, chunks=CHUNKS, backend=CommunicatorBackend.mpi, number_of_streams=STREAMS)
    x = np.arange(rows * k, dtype=np.float32).reshape(rows, k) / (rows * k)
    w = np.ones((cols, k), dtype=np.float32)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "host.json")
        p.fd.execute(p.local_inputs(x, w, RANK), trace=path, trace_host=True)
        if RANK != 0:
            return
        events = load_events(path)
    for pid in range(WORLD):
        loop = [e for e in events if e.get("ph") == "X" and e["pid"] == pid and e["name"].startswith("stream loop")]
        assert len(loop) == 1 and loop[0]["cat"] == "host", loop
        compute, comm = chunk_events(events, pid, "compute"), chunk_events(events, pid, "communication")
        assert sorted(compute) == sorted(comm) == list(range(CHUNKS)), (compute, comm)
        begin, end = loop[0]["ts"], loop[0]["ts"] + loop[0]["dur"]
        for e in list(compute.values()) + list(comm.values()):
            assert begin - ROUNDING_US <= e["ts"] and e["ts"] + e["dur"] <= end + ROUNDING_US, (e, loop[0])
