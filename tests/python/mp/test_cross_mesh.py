"""Moves between meshes that no single collective covers (run under mpirun -np 2 / 4), each against
numpy on every rank: a gather or reduce onto a device outside the source mesh or from a 2-D mesh, a
scatter from a device outside the target mesh, a move from one device onto a 2-D mesh (all refused
before); two set() outputs of one resharding (an add_output error before); and a set whose
communication is the identity, which returned the caller's own input array."""
import numpy as np
import pytest

import meshfuse
from meshfuse import CommunicatorBackend, DataType, FusionDefinition, ParallelType
from meshfuse.multidevice import Communicator, DeviceMesh, gather_tensor, shard_tensor

COMM = Communicator.instance()
RANK, WORLD = COMM.rank, COMM.size
BACKENDS = [b for b in (CommunicatorBackend.mpi, CommunicatorBackend.gloo, CommunicatorBackend.ucc)
            if b in meshfuse.available_backends()]
FULL = np.random.default_rng(41).standard_normal((4 * WORLD, 3)).astype(np.float32)


def shard(tv, mesh, axis=0, parallel=ParallelType.mesh_x):
    tv.set_device_mesh(mesh)
    tv.outer_split(axis, mesh.size_along(parallel))
    tv.axis(axis).parallelize(parallel)


def move(source, target, reduce_rows=False, target_sharded=False, backend=CommunicatorBackend.mpi):
    """x [4 WORLD, 3] row-sharded on `source` (or replicated where `source` is one device), y = x (or
    its sum over the rows) on `target` (row-sharded there if asked). Returns (this rank's y or None, y's
    sharding, the host program)."""
    with FusionDefinition(backend_type=backend) as fd:
        x = fd.define_tensor([4 * WORLD, 3], DataType.Float)
        y = fd.ops.sum(x, [0]) if reduce_rows else fd.ops.set(x)
        fd.add_output(y)
        if source.size > 1:
            shard(x, source)
        else:
            x.set_device_mesh(source)
        if target_sharded:
            shard(y, target)
        else:
            y.set_device_mesh(target)
    (out,) = fd.execute([shard_tensor(FULL, x, RANK)])
    return out, fd.output_shardings()[0], fd.host_ir() if RANK in source or RANK in target else ""


@pytest.mark.skipif(WORLD < 3, reason="a device outside a mesh of two needs three ranks")
@pytest.mark.parametrize("backend", BACKENDS, ids=lambda b: b.name)
@pytest.mark.parametrize("reduce_rows", [False, True], ids=["gather", "reduce"])
def test_onto_a_device_outside_the_source_mesh(reduce_rows, backend):
    out, _, program = move(DeviceMesh([0, 1]), DeviceMesh([WORLD - 1]), reduce_rows, backend=backend)
    want = FULL.astype(np.float64).sum(0) if reduce_rows else FULL
    if RANK == WORLD - 1:
        np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
        assert "SendRecv" in program, program
    else:
        assert out is None


@pytest.mark.parametrize("reduce_rows", [False, True], ids=["gather", "reduce"])
def test_onto_one_device_from_a_two_dimensional_mesh(reduce_rows):
    mesh = DeviceMesh(np.arange(WORLD).reshape(1, WORLD))
    out, _, _ = move(mesh, DeviceMesh([0]), reduce_rows)
    if RANK == 0:
        np.testing.assert_allclose(out, FULL.astype(np.float64).sum(0) if reduce_rows else FULL, rtol=1e-5, atol=1e-5)
    else:
        assert out is None


@pytest.mark.skipif(WORLD < 3, reason="a root outside a mesh of two needs three ranks")
def test_a_scatter_from_a_device_outside_the_target_mesh():
    target = DeviceMesh([0, 1])
    out, ys, program = move(DeviceMesh([WORLD - 1]), target, target_sharded=True)
    whole = gather_tensor(out, ys)   # every rank calls it; those outside the mesh pass and get None
    if RANK in target:
        np.testing.assert_array_equal(out, shard_tensor(FULL, ys, RANK))
        assert "Broadcast" in program, program
        np.testing.assert_array_equal(whole, FULL)
    else:
        assert out is None and whole is None


def test_from_one_device_onto_a_two_dimensional_mesh():
    target = DeviceMesh(np.arange(WORLD).reshape(1, WORLD))
    out, ys, _ = move(DeviceMesh([0]), target, target_sharded=True)
    np.testing.assert_array_equal(out, shard_tensor(FULL, ys, RANK))
    np.testing.assert_array_equal(gather_tensor(out, ys), FULL)


@pytest.mark.parametrize("backend", BACKENDS, ids=lambda b: b.name)
def test_two_set_outputs_of_one_resharding_are_two_arrays(backend):
    """y = set(x) and z = set(x), both replicated from a row-sharded x: they shared the resharding's one
    result and add_output refused it ('T1 is already output 0', a tensor the user never named)."""
    mesh = DeviceMesh(range(WORLD))
    with FusionDefinition(backend_type=backend) as fd:
        x = fd.define_tensor([4 * WORLD, 3], DataType.Float)
        y, z = fd.ops.set(x), fd.ops.set(x)
        fd.add_output(y)
        fd.add_output(z)
        shard(x, mesh)
        y.set_device_mesh(mesh)
        z.set_device_mesh(mesh)
    y_out, z_out = fd.execute([shard_tensor(FULL, x, RANK)])
    np.testing.assert_array_equal(y_out, FULL)
    np.testing.assert_array_equal(z_out, FULL)
    assert not np.shares_memory(y_out, z_out)


def test_a_set_whose_move_is_the_identity_is_a_copy_of_the_input():
    """x replicated on [0, 1] and y = set(x) on [0]: rank 0 holds x already, and y was x's own array
    (y *= 0 zeroed the caller's input)."""
    x_in = FULL.copy()
    with FusionDefinition() as fd:
        x = fd.define_tensor([4 * WORLD, 3], DataType.Float)
        y = fd.ops.set(x)
        fd.add_output(y)
        x.set_device_mesh(DeviceMesh(range(WORLD)))
        y.set_device_mesh(DeviceMesh([0]))
    (out,) = fd.execute([x_in])
    if RANK == 0:
        np.testing.assert_array_equal(out, FULL)
        assert not np.shares_memory(out, x_in)
        out *= 0
        np.testing.assert_array_equal(x_in, FULL)
    else:
        assert out is None


@pytest.mark.skipif(WORLD < 4, reason="two stages of two ranks")
@pytest.mark.parametrize("partial", [False, True], ids=["replicated", "partial"])
def test_a_stage_sends_only_the_blocks_the_next_one_shards(partial):
    """Replicated (or Partial) on stage [0, 1], row-sharded on stage [2, 3]: the source slices (or
    reduce-scatters) first and sends each device its block; it sent the whole tensor (after a full
    allreduce), and the destination sliced it."""
    source, target = DeviceMesh([0, 1]), DeviceMesh([2, 3])
    with FusionDefinition() as fd:
        x = fd.define_tensor([8, 6], DataType.Float)
        y = fd.ops.sum(x, [1], keepdim=True) if partial else fd.ops.set(x)
        fd.add_output(y)
        if partial:
            shard(x, source, axis=1)   # a sum over the sharded columns: Partial on the source
        else:
            x.set_device_mesh(source)
        shard(y, target, axis=0)
    full = FULL[:8].repeat(2, axis=1)
    (out,) = fd.execute([shard_tensor(full, x, RANK)])
    want = full.astype(np.float64).sum(1, keepdims=True) if partial else full
    (ys,) = fd.output_shardings()
    if RANK in target:
        np.testing.assert_allclose(out, shard_tensor(want, ys, RANK), rtol=1e-5, atol=1e-5)
    else:
        program = fd.host_ir()
        first = "ReduceScatter" if partial else "LocalSlice"
        assert first in program and program.index(first) < program.index("SendRecv"), program
        assert "Allreduce" not in program, program
