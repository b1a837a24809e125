"""A reduction over axes sharded along several dims of a 2-D mesh (run under mpirun -np 2 / 4): the
Partial result is resolved by one allreduce over the team those dims span (here the whole mesh), not
one allreduce per mesh dim, and every rank holds numpy's answer, for sum, max and mean on each
backend; a reduction over one of the two sharded axes keeps its allreduce along that dim alone."""
import numpy as np
import pytest

import meshfuse
from meshfuse import CommunicatorBackend, DataType, FusionDefinition, ParallelType
from meshfuse.multidevice import Communicator, DeviceMesh, shard_tensor

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from host_ir_lines import communications  # noqa: E402

COMM = Communicator.instance()
RANK, WORLD = COMM.rank, COMM.size
BACKENDS = [b for b in (CommunicatorBackend.mpi, CommunicatorBackend.gloo, CommunicatorBackend.ucc)
            if b in meshfuse.available_backends()]
RNG = np.random.default_rng(77)
OPS = {"sum": np.sum, "max": np.max, "mean": np.mean}


def _mesh():
    if WORLD % 2:
        pytest.skip("a [2, WORLD/2] mesh needs an even world")
    return DeviceMesh(np.arange(WORLD).reshape(2, WORLD // 2))   # an N-D array of ids: its shape is the mesh's


def _define(backend, mesh, op, axes, rows=-1):
    with FusionDefinition(backend_type=backend) as fd:
        x = fd.define_tensor([rows, 3 * WORLD, 5], DataType.Float)
        y = getattr(fd.ops, op)(x, axes)
        fd.add_output(y)
        x.set_device_mesh(mesh)
        x.outer_split(0, 2)                       # rows along mesh_y: loop [2, rows/2, 3*WORLD, 5]
        x.axis(0).parallelize(ParallelType.mesh_y)
        x.outer_split(2, WORLD // 2)              # columns along mesh_x
        x.axis(2).parallelize(ParallelType.mesh_x)
    return fd, x


@pytest.mark.parametrize("backend", BACKENDS, ids=lambda b: b.name)
@pytest.mark.parametrize("op", sorted(OPS))
def test_reduction_over_both_sharded_axes_is_one_allreduce_over_the_mesh(backend, op):
    mesh = _mesh()
    full = RNG.standard_normal((4, 3 * WORLD, 5)).astype(np.float32)
    fd, x = _define(backend, mesh, op, [0, 1])
    (y,) = fd.execute([shard_tensor(full, x, RANK)])
    np.testing.assert_allclose(y, OPS[op](full.astype(np.float64), axis=(0, 1)), rtol=1e-5, atol=1e-5)
    assert communications(fd) == ["Allreduce"], fd.host_ir()
    assert f"team=[{', '.join(map(str, range(WORLD)))}]" in fd.host_ir(), fd.host_ir()
    (ys,) = fd.output_shardings()
    assert not ys.is_sharded and ys.shape == [5]


@pytest.mark.parametrize("backend", BACKENDS, ids=lambda b: b.name)
def test_reduction_over_one_sharded_axis_reduces_along_that_dim_alone(backend):
    mesh = _mesh()
    full = RNG.standard_normal((4, 3 * WORLD, 5)).astype(np.float32)
    fd, x = _define(backend, mesh, "sum", [0], rows=4)
    (y,) = fd.execute([shard_tensor(full, x, RANK)])
    (ys,) = fd.output_shardings()
    assert ys.sharded_axis(ParallelType.mesh_x) == 0, ys     # the columns stay split along mesh_x
    np.testing.assert_allclose(y, shard_tensor(full.astype(np.float64).sum(0), ys, RANK), rtol=1e-5, atol=1e-5)
    assert communications(fd) == ["Allreduce"], fd.host_ir()
    assert f"team={mesh.team(RANK, ParallelType.mesh_y)}".replace(" ", "") in fd.host_ir().replace(" ", "")


def test_a_matmuls_contraction_sharded_along_different_dims_in_its_operands():
    """a's K sharded along mesh_x, b's along mesh_y: propagation made the product Partial along both
    dims, which would need each operand sharded along both, and resharding raised "made no progress"
    (an internal error). The product is Partial along one dim (b's, the weight's, as propagation
    prefers it); a is gathered along mesh_x and sliced along mesh_y, and the product is allreduced."""
    mesh = _mesh()
    rows, cols = mesh.size_along(ParallelType.mesh_y), mesh.size_along(ParallelType.mesh_x)
    a_full = RNG.standard_normal((3, 4 * WORLD)).astype(np.float32)
    b_full = RNG.standard_normal((4 * WORLD, 5)).astype(np.float32)
    with FusionDefinition() as fd:
        a, b = fd.define_tensor([3, 4 * WORLD]), fd.define_tensor([4 * WORLD, 5])
        fd.add_output(fd.ops.matmul(a, b))
        a.set_device_mesh(mesh)
        a.outer_split(1, cols)
        a.axis(1).parallelize(ParallelType.mesh_x)
        b.set_device_mesh(mesh)
        b.outer_split(0, rows)
        b.axis(0).parallelize(ParallelType.mesh_y)
    (out,) = fd.execute([shard_tensor(a_full, a, RANK), shard_tensor(b_full, b, RANK)])
    np.testing.assert_allclose(out, a_full.astype(np.float64) @ b_full, rtol=1e-5, atol=1e-5)
    # Along a mesh_x of one device (2 ranks: a [2, 1] mesh) the gather is a local copy.
    assert communications(fd) == ["Allgather"] * (cols > 1) + ["Allreduce"], fd.host_ir()
