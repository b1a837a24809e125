"""fd.output_shardings() and gather_tensor (run under mpirun -np 2 / 4): where execute left each output
(its mesh, the axes sharding propagation split, its bound global extents) and the global array
assembled from every rank's part, checked against numpy on every rank, for outputs sharded by
propagation, by annotation (on a 2-D mesh, and a stream-pipelined one, among them), replicated, and on a mesh that
leaves ranks out."""
import numpy as np
import pytest

import meshfuse
from meshfuse import CommunicatorBackend, DataType, FusionDefinition, ParallelType
from meshfuse.multidevice import Communicator, DeviceMesh, gather_tensor, shard_tensor

COMM = Communicator.instance()
RANK, WORLD = COMM.rank, COMM.size
MESH = DeviceMesh(range(WORLD))
BACKENDS = [b for b in (CommunicatorBackend.mpi, CommunicatorBackend.gloo, CommunicatorBackend.ucc)
            if b in meshfuse.available_backends()]
RNG = np.random.default_rng(31)


def shard(tv, axis, parallel=ParallelType.mesh_x, mesh=MESH):
    tv.set_device_mesh(mesh)
    tv.outer_split(axis, mesh.size_along(parallel))
    tv.axis(axis).parallelize(parallel)


@pytest.mark.parametrize("backend", BACKENDS, ids=lambda b: b.name)
def test_column_parallel_output_is_found_sharded_and_gathers_to_the_product(backend):
    """Only the weight is annotated: propagation shards y's columns, and gathering gives x w^T."""
    x_np = RNG.standard_normal((-1 + 6, 8)).astype(np.float32)
    w_np = RNG.standard_normal((4 * WORLD, 8)).astype(np.float32)
    with FusionDefinition(backend_type=backend) as fd:
        x = fd.define_tensor([-1, 8], DataType.Float)   # symbolic rows: the sharding has them bound
        w = fd.define_tensor([4 * WORLD, 8], DataType.Float)
        y = fd.ops.linear(x, w)
        s = fd.ops.sum(y, [1])
        fd.add_output(y)
        fd.add_output(s)
        x.set_device_mesh(MESH)
        shard(w, 0)
    (y_local, s_local) = fd.execute([x_np, shard_tensor(w_np, w, RANK)])
    ys, ss = fd.output_shardings()
    assert ys.shape == [5, 4 * WORLD] and ys.device_mesh == MESH
    assert ys.sharded_axis(ParallelType.mesh_x) == 1, ys
    assert ss.shape == [5] and not ss.is_sharded, ss   # a sum over the sharded axis is allreduced
    assert y_local.shape == (5, 4)
    y = gather_tensor(y_local, ys, backend=backend)
    np.testing.assert_allclose(y, x_np.astype(np.float64) @ w_np.T.astype(np.float64), rtol=1e-5, atol=1e-4)
    np.testing.assert_array_equal(shard_tensor(y, ys, RANK), y_local)
    assert gather_tensor(s_local, ss) is s_local   # replicated: already whole
    np.testing.assert_allclose(s_local, (x_np.astype(np.float64) @ w_np.T.astype(np.float64)).sum(1), rtol=1e-4,
                               atol=1e-3)


def test_annotated_output_on_a_two_dimensional_mesh_gathers_in_place():
    """An output annotated with rows on mesh_y and columns on mesh_x of a [2, d/2] mesh: each element
    lands where the global array has it."""
    if WORLD % 2:
        pytest.skip("a [2, WORLD/2] mesh needs an even world")
    mesh = DeviceMesh(range(WORLD), [2, WORLD // 2])
    full = RNG.standard_normal((4, 3 * WORLD)).astype(np.float32)
    with FusionDefinition() as fd:
        a = fd.define_tensor([4, 3 * WORLD], DataType.Float)
        b = fd.ops.mul(a, a)
        fd.add_output(b)
        a.set_device_mesh(mesh)
        shard(b, 0, ParallelType.mesh_y, mesh)
        shard(b, 2, ParallelType.mesh_x, mesh)   # loop axis 2: logical axis 1 after the row split
    (b_local,) = fd.execute([full])
    (bs,) = fd.output_shardings()
    assert bs.sharded_axis(ParallelType.mesh_y) == 0 and bs.sharded_axis(ParallelType.mesh_x) == 1, bs
    assert b_local.shape == (2, 6)
    np.testing.assert_array_equal(b_local, shard_tensor(full * full, bs, RANK))
    np.testing.assert_array_equal(gather_tensor(b_local, bs), full * full)


def test_output_on_part_of_the_world():
    """An output on a mesh of rank 0 alone: rank 0 gets its whole array, the others None (and pass None)."""
    full = RNG.standard_normal((3, 4)).astype(np.float32)
    only0 = DeviceMesh([0])
    with FusionDefinition() as fd:
        a = fd.define_tensor([3, 4], DataType.Float)
        b = fd.ops.neg(a)
        fd.add_output(b)
        a.set_device_mesh(only0)
        b.set_device_mesh(only0)
    (b_local,) = fd.execute([full if RANK == 0 else None])
    (bs,) = fd.output_shardings()
    assert bs.device_mesh == only0 and not bs.is_sharded
    if RANK == 0:
        np.testing.assert_array_equal(gather_tensor(b_local, bs), -full)
    else:
        assert b_local is None and gather_tensor(None, bs) is None


def test_sequence_sharded_output_of_a_view_chain_gathers_on_every_backend():
    """A [b, s, e] sequence shard through reshape and permute (the layer's head split): gathered on each
    backend, the global permuted array."""
    b_, s_, h, dh = 2, 2 * WORLD, 3, 4
    full = RNG.standard_normal((b_, s_, h * dh)).astype(np.float32)
    for backend in BACKENDS:
        with FusionDefinition(backend_type=backend) as fd:
            x = fd.define_tensor([b_, s_, h * dh], DataType.Float)
            y = fd.ops.permute(fd.ops.reshape(x, [b_, s_, h, dh]), [0, 2, 1, 3])
            fd.add_output(y)
            shard(x, 1)
        (y_local,) = fd.execute([shard_tensor(full, x, RANK)])
        (ys,) = fd.output_shardings()
        assert ys.shape == [b_, h, s_, dh] and ys.sharded_axis(ParallelType.mesh_x) == 2, ys
        np.testing.assert_array_equal(gather_tensor(y_local, ys, backend=backend),
                                      full.reshape(b_, s_, h, dh).transpose(0, 2, 1, 3))


def test_a_stream_pipelined_output_gathers_like_any_other():
    """The allgather + linear loop of docs/overlap.md: y's rows are split into stream chunks, a schedule
    and not a placement, so gathering y gives x w^T whole."""
    rows, k, n = 4 * WORLD, 3, 2 * WORLD
    x_np = RNG.standard_normal((rows, k)).astype(np.float32)
    w_np = RNG.standard_normal((n, k)).astype(np.float32)
    with FusionDefinition(number_of_streams=2) as fd:
        x = fd.define_tensor([rows, k], DataType.Float)
        w = fd.define_tensor([n, k], DataType.Float)
        y = fd.ops.linear(x, w)
        fd.add_output(y)
        shard(x, 0)
        shard(w, 0)
        y.set_device_mesh(MESH)
        y.outer_split(1, WORLD)
        y.axis(1).parallelize(ParallelType.mesh_x)
        y.outer_split(0, 2)
        y.axis(0).parallelize(ParallelType.stream)
    (y_local,) = fd.execute([shard_tensor(x_np, x, RANK), shard_tensor(w_np, w, RANK)])
    assert "ForLoop" in fd.host_ir()
    (ys,) = fd.output_shardings()
    assert ys.sharded_axis(ParallelType.mesh_x) == 1 and ys.sharded_axis(ParallelType.stream) == 0, ys
    np.testing.assert_allclose(gather_tensor(y_local, ys), x_np.astype(np.float64) @ w_np.T, rtol=1e-5, atol=1e-5)
