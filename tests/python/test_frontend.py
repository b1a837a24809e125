"""FusionDefinition's two styles, symbolic shapes, the program cache, per-instance backends,
threads, introspection, and the multidevice annotations on a world of one process."""
import pickle
import socket
import threading

import numpy as np
import pytest
from conftest import random_array

import meshfuse
from meshfuse import CommunicatorBackend, DataType, FusionDefinition, ParallelType
from meshfuse.multidevice import Communicator, DeviceMesh, shard_tensor


def _relu_linear_reference(x, w):
    return np.maximum(x.astype(np.float64) @ w.astype(np.float64).T, 0)


def test_public_names():
    assert meshfuse.__version__ == "0.1.0"
    assert {b.name for b in CommunicatorBackend.__members__.values()} == {"auto", "nccl", "ucc", "mpi", "gloo", "cuda"}
    assert {p.name for p in ParallelType.__members__.values()} == {"serial", "mesh_x", "mesh_y", "mesh_z", "stream"}
    assert {d.name for d in DataType.__members__.values()} == {"Float", "Double", "Half", "BFloat16", "Int", "Int32", "Bool"}
    backends = meshfuse.available_backends()
    assert CommunicatorBackend.mpi in backends and CommunicatorBackend.auto not in backends


def test_context_manager_style(rng):
    with FusionDefinition(backend_type=CommunicatorBackend.mpi) as fd:
        x = fd.define_tensor(shape=[-1, 16], dtype=DataType.Float)
        w = fd.define_tensor(shape=[8, 16], dtype=DataType.Float)
        fd.add_output(fd.ops.relu(fd.ops.linear(x, w)))
    assert fd.backend_type == CommunicatorBackend.mpi
    xn, wn = random_array(rng, (5, 16), np.float32), random_array(rng, (8, 16), np.float32)
    outputs = fd.execute([xn, wn])
    assert isinstance(outputs, list) and len(outputs) == 1
    assert isinstance(outputs[0], np.ndarray) and outputs[0].dtype == np.float32
    np.testing.assert_allclose(outputs[0], _relu_linear_reference(xn, wn), rtol=1e-5, atol=1e-5)


class ScaledSum(FusionDefinition):
    """Subclass style: the definition is built on first use, once."""

    calls = 0

    def definition(self):
        ScaledSum.calls += 1
        self.x = self.define_tensor([-1, -1], DataType.Double)
        self.scale = self.define_scalar(dtype=DataType.Double)  # bound at execute
        self.add_output(self.ops.sum(self.ops.mul(self.x, self.scale), [0]))


def test_subclass_style_builds_once_on_first_use(rng):
    ScaledSum.calls = 0
    fd = ScaledSum()
    assert ScaledSum.calls == 0
    x = random_array(rng, (6, 3), np.float64)
    (out,) = fd.execute([x, 2.5])
    np.testing.assert_allclose(out, (x * 2.5).sum(axis=0), rtol=1e-12)
    (out,) = fd.execute([x, -1.0])
    np.testing.assert_allclose(out, -x.sum(axis=0), rtol=1e-12)
    assert ScaledSum.calls == 1
    assert "sum" in fd.fusion_ir() and "mul" in fd.fusion_ir()


def test_subclass_fusion_ir_builds_the_definition():
    fd = ScaledSum()
    text = fd.fusion_ir()
    assert "T0_Double[-1, -1]" in text and "outputs: T" in text


class FailsOnce(FusionDefinition):
    fail = True

    def definition(self):
        x = self.define_tensor([-1])
        if FailsOnce.fail:
            FailsOnce.fail = False
            raise RuntimeError("definition failed")
        self.add_output(self.ops.neg(x))


def test_failed_definition_leaves_no_half_built_fusion(rng):
    fd = FailsOnce()
    with pytest.raises(RuntimeError, match="definition failed"):
        fd.execute([np.zeros(3, np.float32)])
    x = random_array(rng, (4,), np.float32)
    (out,) = fd.execute([x])  # the retry starts from an empty fusion: one input, not two
    np.testing.assert_array_equal(out, -x)


def test_symbolic_extents_and_the_program_cache(rng):
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1])
        b = fd.define_tensor([-1])
        fd.add_output(fd.ops.tanh(fd.ops.add(x, b)))
    assert fd.num_cached_programs() == 0
    for rows, cols in ((3, 5), (7, 2)):
        xn, bn = random_array(rng, (rows, cols), np.float32), random_array(rng, (cols,), np.float32)
        (out,) = fd.execute([xn, bn])
        assert out.shape == (rows, cols)
        np.testing.assert_allclose(out, np.tanh(xn.astype(np.float64) + bn), rtol=2e-5, atol=1e-6)
    assert fd.num_cached_programs() == 2
    # The same shapes again (new data) reuse the cached program: no second lowering.
    xn, bn = random_array(rng, (3, 5), np.float32), random_array(rng, (5,), np.float32)
    (out,) = fd.execute([xn, bn])
    np.testing.assert_allclose(out, np.tanh(xn.astype(np.float64) + bn), rtol=2e-5, atol=1e-6)
    assert fd.num_cached_programs() == 2


def test_a_different_dtype_signature_is_rejected_not_recached(rng):
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1])
        fd.add_output(fd.ops.neg(x))
    fd.execute([random_array(rng, (4,), np.float32)])
    with pytest.raises(TypeError):
        fd.execute([random_array(rng, (4,), np.float64)])
    assert fd.num_cached_programs() == 1


def test_host_ir_and_lowered_fusion(rng):
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, 4])
        fd.add_output(fd.ops.exp(x))
    with pytest.raises(RuntimeError, match="execute"):
        fd.host_ir()
    fd.execute([random_array(rng, (2, 4), np.float32)])
    host_ir = fd.host_ir()
    assert "HostIrContainer" in host_ir and "exp" in host_ir
    assert "exp" in fd.last_lowered_fusion()
    assert "exp" in repr(fd)


def test_backends_are_per_instance():
    first, second = FusionDefinition(), FusionDefinition(backend_type=CommunicatorBackend.mpi)
    assert first.backend_type == CommunicatorBackend.auto
    first.set_backend(CommunicatorBackend.mpi)
    second.set_backend(CommunicatorBackend.auto)
    assert first.backend_type == CommunicatorBackend.mpi
    assert second.backend_type == CommunicatorBackend.auto


def test_set_backend_changes_the_next_lowering(rng):
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1])
        fd.add_output(fd.ops.abs(x))
    xn = random_array(rng, (5,), np.float32)
    fd.execute([xn])
    fd.set_backend(CommunicatorBackend.mpi)
    (out,) = fd.execute([xn])
    np.testing.assert_array_equal(out, np.abs(xn))
    # Lowering parameters are part of the cache key: the new backend got its own program.
    assert fd.num_cached_programs() == 2


def test_a_schedule_changed_after_execute_is_lowered_again(rng):
    # Meshes and shardings are set on TensorViews, which stay writable after the first execute; the
    # lowering reads them, so the program cache must not serve the program of the old schedule (on
    # two ranks, sharding the output after an execute returned the whole [4, 8] output, not a shard).
    with FusionDefinition() as fd:
        x = fd.define_tensor(shape=[4, 8])
        y = fd.ops.relu(x)
        fd.add_output(y)
    xn = random_array(rng, (4, 8), np.float32)
    fd.execute([xn])
    assert "DeviceMesh" not in fd.last_lowered_fusion()
    for tv in (x, y):
        tv.set_device_mesh(DeviceMesh([0]))
    y.outer_split(0, 1)
    y.axis(0).parallelize(ParallelType.mesh_x)
    (out,) = fd.execute([xn])
    np.testing.assert_array_equal(out, np.maximum(xn, 0))
    assert "DeviceMesh{0}" in fd.last_lowered_fusion() and "mesh_x" in fd.last_lowered_fusion()
    assert fd.num_cached_programs() == 2
    fd.execute([xn])  # the same schedule again: the cached program
    assert fd.num_cached_programs() == 2


def test_concurrent_executions_of_separate_definitions(rng):
    def make(k):
        with FusionDefinition() as fd:
            x = fd.define_tensor([-1, 32])
            fd.add_output(fd.ops.mul(fd.ops.sigmoid(x), float(k)))
        return fd

    definitions = [make(k) for k in range(4)]
    data = [random_array(rng, (64, 32), np.float32) for _ in range(4)]
    errors = []

    def worker(k):
        try:
            for _ in range(20):
                (out,) = definitions[k].execute([data[k]])
                expected = k / (1.0 + np.exp(-data[k].astype(np.float64)))
                np.testing.assert_allclose(out, expected, rtol=2e-5, atol=1e-6)
        except Exception as e:  # noqa: BLE001  (reported below, on the main thread)
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "an execution did not finish"
    assert not errors, errors


def test_trace_is_written(rng, tmp_path):
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1])
        fd.add_output(fd.ops.relu(x))
    path = tmp_path / "trace.json"
    fd.execute([random_array(rng, (8,), np.float32)], trace=path)
    import json

    events = json.loads(path.read_text())
    events = events["traceEvents"] if isinstance(events, dict) else events
    assert any("relu" in json.dumps(e) or "pointwise" in json.dumps(e) for e in events), events


def test_trace_host_spans_each_segments_launch_inside_the_host_program(rng, tmp_path):
    """trace_host=True: one "host" span per segment (the host's time to launch it, nothing
    synchronized), in program order, inside one "host program" span, and the executor's steps inside
    them ("host detail"); the default trace has neither."""
    import json

    with FusionDefinition() as fd:
        x, w = fd.define_tensor([-1, -1]), fd.define_tensor([-1, -1])
        m = fd.ops.matmul(fd.ops.relu(x), w)  # a pointwise segment, then the matmul's
        fd.add_output(fd.ops.mul(fd.ops.sum(m, [1]), 2.0))  # and a reduction's
    a, b = random_array(rng, (16, 8), np.float32), random_array(rng, (8, 4), np.float32)

    def events(**kwargs):
        path = tmp_path / "trace.json"
        (out,) = fd.execute([a, b], trace=path, **kwargs)
        np.testing.assert_allclose(out, (np.maximum(a, 0) @ b).sum(1) * 2, rtol=1e-4)
        loaded = json.loads(path.read_text())
        loaded = loaded["traceEvents"] if isinstance(loaded, dict) else loaded
        return [e for e in loaded if e.get("ph") == "X"]

    host = events(trace_host=True)
    program = [e for e in host if e["name"] == "host program"]
    segments = [e for e in host if e["cat"] == "host" and e["name"] != "host program"]
    assert len(program) == 1 and len(segments) >= 2, host
    assert not [e for e in host if e["cat"] == "compute"], host
    starts = [e["ts"] for e in segments]
    assert starts == sorted(starts), segments
    first, last = program[0]["ts"], program[0]["ts"] + program[0]["dur"]
    assert all(first <= e["ts"] and e["ts"] + e["dur"] <= last + 1 for e in segments), host
    # The executor's own steps (runtime/host_span.h; on the CPU its allocations), each inside a segment's span.
    details = [e for e in host if e["cat"] == "host detail"]
    assert {e["name"] for e in details} >= {"host allocate"}, host
    inside = lambda d: any(s["ts"] <= d["ts"] and d["ts"] + d["dur"] <= s["ts"] + s["dur"] + 1 for s in segments)
    assert all(inside(d) for d in details if d["name"] == "host allocate"), host
    default = events()
    assert not [e for e in default if e["cat"] in ("host", "host detail")], "the default trace is of device time"
    with pytest.raises(ValueError, match="trace_host"):
        fd.execute([a, b], trace_host=True)


def test_non_contiguous_input_when_the_definition_allows_it(rng):
    base = random_array(rng, (6, 4), np.float32)
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], contiguity=None)
        fd.add_output(fd.ops.mul(x, 3.0))
    (out,) = fd.execute([base.T])  # strides (1, 4)
    np.testing.assert_allclose(out, base.T * 3.0, rtol=1e-6)


def test_read_only_and_broadcast_views_are_accepted(rng):
    row = random_array(rng, (5,), np.float32)
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1])
        fd.add_output(fd.ops.add(x, 1.0))
    (out,) = fd.execute([np.broadcast_to(row, (3, 5))])  # read-only, stride 0
    np.testing.assert_allclose(out, np.broadcast_to(row, (3, 5)) + 1.0, rtol=1e-6)


# ---- multidevice annotations (a world of one process) ------------------------------------------

def test_communicator_single_process():
    comm = Communicator.instance()
    assert comm is Communicator.instance()
    assert (comm.rank, comm.size) == (0, 1)
    assert 0 <= comm.local_rank < comm.local_size
    assert (comm.node_id, comm.node_count, comm.node_of(0)) == (0, 1, 0)
    assert comm.node_name(0) == socket.gethostname()
    with pytest.raises(IndexError):
        comm.node_of(1)
    comm.barrier()
    assert CommunicatorBackend.mpi in comm.available_backends()


def test_device_mesh():
    mesh = DeviceMesh(range(4))
    assert (mesh.size, mesh.devices, mesh.shape, len(mesh)) == (4, [0, 1, 2, 3], [4], 4)
    assert 3 in mesh and 4 not in mesh
    grid = DeviceMesh(np.arange(6), shape=(2, 3))
    assert grid.shape == [2, 3] and grid.size == 6
    assert grid.size_along(ParallelType.mesh_x) == 3 and grid.size_along(ParallelType.mesh_y) == 2
    assert grid.coordinate(4, ParallelType.mesh_x) == 1 and grid.coordinate(4, ParallelType.mesh_y) == 1
    assert grid.team(4, ParallelType.mesh_x) == [3, 4, 5]
    assert DeviceMesh([0, 1]) == DeviceMesh((0, 1)) and DeviceMesh([0, 1]) != DeviceMesh([1, 0])
    assert "DeviceMesh" in repr(grid)


def test_device_mesh_from_an_array_of_ids_takes_its_shape():
    """As nvFuser's DeviceMesh(torch.arange(8).view(2, 4)): nested lists or an N-D array give the mesh
    its shape (mesh_x along the last dim); meshes pickle, hash and compare by ids and shape."""
    grid = DeviceMesh(np.arange(6).reshape(2, 3))
    assert grid == DeviceMesh(range(6), shape=[2, 3]) and grid.shape == [2, 3]
    assert DeviceMesh([[0, 1], [2, 3]]) == DeviceMesh(np.arange(4), shape=(2, 2))
    assert DeviceMesh([[[5]]]).shape == [1, 1, 1]
    transposed = DeviceMesh(np.arange(4).reshape(2, 2).T)          # [[0, 2], [1, 3]]
    assert transposed.devices == [0, 2, 1, 3] and transposed.team(1, ParallelType.mesh_x) == [1, 3]
    assert DeviceMesh([[0, 1], [2, 3]], shape=[2, 2]).shape == [2, 2]
    for mesh in (grid, DeviceMesh(range(3)), DeviceMesh(np.arange(8).reshape(2, 2, 2))):
        again = pickle.loads(pickle.dumps(mesh))
        assert again == mesh and again.shape == mesh.shape and hash(again) == hash(mesh)
    assert len({DeviceMesh([0, 1]), DeviceMesh((0, 1)), DeviceMesh([1, 0])}) == 2


def test_split_parallelize_and_loop_axes():
    with FusionDefinition() as fd:
        w = fd.define_tensor([12, 6])
        fd.add_output(fd.ops.set(w))
    w.set_device_mesh(DeviceMesh(range(4)))
    w.outer_split(0, 4)
    assert w.num_loop_axes == 3
    assert [w.axis(i).extent for i in range(3)] == [4, 3, 6]
    w.axis(0).parallelize(ParallelType.mesh_x)
    assert w.axis(0).parallel_type == ParallelType.mesh_x
    assert w.sharded_axis(ParallelType.mesh_x) == 0 and w.is_sharded
    assert "mesh_x" in w.loop
    w.split(2, 2)  # inner split: the inner part has extent 2
    assert [w.axis(i).extent for i in range(4)] == [4, 3, 3, 2]
    assert w.axis(-1).extent == 2
    assert w.device_mesh == DeviceMesh(range(4))


def test_shard_tensor_1d_mesh(rng):
    full = random_array(rng, (8, 6), np.float32)
    with FusionDefinition() as fd:
        tv = fd.define_tensor([8, 6])
        fd.add_output(fd.ops.set(tv))
    tv.set_device_mesh(DeviceMesh([0, 1, 2]))
    np.testing.assert_array_equal(shard_tensor(full, tv, 1), full)  # a mesh without sharding: every rank holds all
    tv.outer_split(1, 3)
    tv.axis(1).parallelize(ParallelType.mesh_x)
    for rank in range(3):
        shard = shard_tensor(full, tv, rank)
        np.testing.assert_array_equal(shard, full[:, 2 * rank:2 * rank + 2])
        assert shard.flags.c_contiguous
    assert shard_tensor(full, tv, 3) is None


def test_shard_tensor_2d_mesh(rng):
    full = random_array(rng, (4, 6), np.float64)
    with FusionDefinition() as fd:
        tv = fd.define_tensor([4, 6], DataType.Double)
        fd.add_output(fd.ops.set(tv))
    mesh = DeviceMesh([10, 11, 12, 13, 14, 15], shape=[2, 3])
    tv.set_device_mesh(mesh)
    tv.outer_split(0, 2)
    tv.axis(0).parallelize(ParallelType.mesh_y)
    tv.outer_split(2, 3)  # logical axis 1 is loop axis 2 after the first split
    tv.axis(2).parallelize(ParallelType.mesh_x)
    for device in mesh.devices:
        y, x = mesh.coordinate(device, ParallelType.mesh_y), mesh.coordinate(device, ParallelType.mesh_x)
        np.testing.assert_array_equal(shard_tensor(full, tv, device), full[2 * y:2 * y + 2, 2 * x:2 * x + 2])


def test_sharded_execution_on_a_world_of_one(rng):
    mesh = DeviceMesh([0])
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, 8])
        w = fd.define_tensor([4, 8])
        y = fd.ops.relu(fd.ops.linear(x, w))
        fd.add_output(y)
        for tv in (x, w, y):
            tv.set_device_mesh(mesh)
        w.outer_split(0, mesh.size)
        w.axis(0).parallelize(ParallelType.mesh_x)
        y.outer_split(1, mesh.size)
        y.axis(1).parallelize(ParallelType.mesh_x)
    xn, wn = random_array(rng, (3, 8), np.float32), random_array(rng, (4, 8), np.float32)
    (out,) = fd.execute([xn, shard_tensor(wn, w, 0)])
    np.testing.assert_allclose(out, _relu_linear_reference(xn, wn), rtol=1e-5, atol=1e-5)


def test_a_mesh_beyond_the_world_is_an_error_before_running():
    with FusionDefinition() as fd:
        x = fd.define_tensor([4])
        fd.add_output(fd.ops.neg(x))
    x.set_device_mesh(DeviceMesh([1]))
    # Rank 0 is not in x's mesh, so None is a valid input for it; the mesh itself is the mistake.
    for value in (None, np.zeros(4, np.float32)):
        with pytest.raises(ValueError, match=r"T0: DeviceMesh\{1\} names device 1 but the world has 1"):
            fd.execute([value])


def test_executor_parameters_and_a_stream_parallel_axis(rng):
    import datetime

    with FusionDefinition(number_of_streams=2, timeout=2.5) as fd:
        x = fd.define_tensor([8, 4])
        w = fd.define_tensor([6, 4])
        y = fd.ops.linear(x, w)
        fd.add_output(y)
        y.outer_split(0, 4)
        y.axis(0).parallelize(ParallelType.stream)
    assert fd.number_of_streams == 2
    assert fd._params.executor.timeout == datetime.timedelta(seconds=2.5)
    xn, wn = random_array(rng, (8, 4), np.float32), random_array(rng, (6, 4), np.float32)
    (out,) = fd.execute([xn, wn])
    np.testing.assert_allclose(out, xn.astype(np.float64) @ wn.T, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="number_of_streams must be at least 1, got 0"):
        FusionDefinition(number_of_streams=0)
    for not_an_integer in (2.7, True, "3"):  # int() took them: 2, 1, 3
        with pytest.raises(TypeError, match="number_of_streams must be an integer"):
            FusionDefinition(number_of_streams=not_an_integer)
    assert FusionDefinition(number_of_streams=np.int64(3)).number_of_streams == 3


def _sharded_tv(shape, mesh):
    with FusionDefinition() as fd:
        tv = fd.define_tensor(shape)
        fd.add_output(fd.ops.set(tv))
    tv.set_device_mesh(mesh)
    return tv


def test_shard_tensor_with_a_stream_split_of_the_local_extent(rng):
    full = random_array(rng, (8, 2), np.float64)
    tv = _sharded_tv([8, 2], DeviceMesh([0, 1]))
    tv.outer_split(0, 2)  # [2 (mesh_x), 4, 2]
    tv.axis(0).parallelize(ParallelType.mesh_x)
    tv.outer_split(1, 2)  # the device-local 4 rows in 2 chunks: [2, 2 (stream), 2, 2]
    tv.axis(1).parallelize(ParallelType.stream)  # host-side chunks: not a sharding
    assert [tv.axis(i).extent for i in range(4)] == [2, 2, 2, 2]
    np.testing.assert_array_equal(shard_tensor(full, tv, 0), full[:4])
    np.testing.assert_array_equal(shard_tensor(full, tv, 1), full[4:])
    # A mesh dimension on the second-level split is rejected by the IR itself.
    with pytest.raises(ValueError, match="T0: a mesh dimension must parallelize a first-level split"):
        tv.axis(1).parallelize(ParallelType.mesh_y)


def test_shard_tensor_errors(rng):
    tv = _sharded_tv([6, 2], DeviceMesh(range(3)))
    tv.outer_split(0, 3)
    tv.axis(0).parallelize(ParallelType.mesh_x)
    with pytest.raises(ValueError, match=r"T0 axis 0 of extent 7 does not split into its loop parts"):
        shard_tensor(np.zeros((7, 2)), tv, 0)
    with pytest.raises(ValueError, match="T0 has 2 dimensions, the array has 1"):
        shard_tensor(np.zeros(6), tv, 0)
    with pytest.raises(TypeError, match="TensorView"):
        shard_tensor(np.zeros((6, 2)), "T0", 0)


def test_executes_tie_held_tensors_to_their_fusion_once():
    """Each execute listed the fusion's outputs (and inputs) through pybind11, which tied the tensor
    objects the script holds to their Fusion again: one more entry in pybind11's patient list per held
    tensor per execute, a leak of 8-16 bytes each that a training loop ran millions of times."""
    import sys
    with FusionDefinition() as fd:
        x = fd.define_tensor([4], DataType.Float)
        y = fd.ops.neg(x)
        fd.add_output(y)
    data = np.arange(4, dtype=np.float32)
    for _ in range(3):  # a tensor listed for the first time is tied then, once
        fd.execute([data])
    held = sys.getrefcount(fd._fusion)
    for _ in range(200):
        (out,) = fd.execute([data])
    after = sys.getrefcount(fd._fusion)  # outside the assert, whose rewriting holds a reference of its own
    assert after == held
    np.testing.assert_array_equal(out, -data)
    assert x.name and y.name  # still held here: the tensors the script keeps
