"""A symbolic extent bound to 0 on every rank (an empty batch) through resharding on every CPU backend
(run under mpirun -np 2 / 4): an allgather of zero rows used to fail ("output ... is not contiguous");
now the result is empty, and the same definition then runs with rows, against numpy."""
import numpy as np
import pytest

import meshfuse
from meshfuse import CommunicatorBackend, DataType, FusionDefinition, ParallelType
from meshfuse.multidevice import Communicator, DeviceMesh, shard_tensor

COMM = Communicator.instance()
RANK, WORLD = COMM.rank, COMM.size
MESH = DeviceMesh(range(WORLD))
BACKENDS = [b for b in (CommunicatorBackend.mpi, CommunicatorBackend.gloo, CommunicatorBackend.ucc)
            if b in meshfuse.available_backends()]


@pytest.mark.parametrize("backend", BACKENDS, ids=lambda b: b.name)
def test_zero_rows_through_an_allgather_then_rows(backend):
    with FusionDefinition(backend_type=backend) as fd:
        x = fd.define_tensor([2, -1, 8], DataType.Float)
        w = fd.define_tensor([4 * WORLD, 8], DataType.Float)
        h = fd.ops.linear(x, w)          # columns sharded like w
        y = fd.ops.set(h)                # wanted whole: an allgather of the columns
        fd.add_output(y)
        x.set_device_mesh(MESH)
        w.set_device_mesh(MESH)
        w.outer_split(0, WORLD)
        w.axis(0).parallelize(ParallelType.mesh_x)
        y.set_device_mesh(MESH)
    w_np = np.random.default_rng(2).standard_normal((4 * WORLD, 8)).astype(np.float32)
    for rows in (0, 3):
        x_np = np.random.default_rng(rows).standard_normal((2, rows, 8)).astype(np.float32)
        (y_np,) = fd.execute([x_np, shard_tensor(w_np, w, RANK)])
        assert y_np.shape == (2, rows, 4 * WORLD)
        np.testing.assert_allclose(y_np, x_np @ w_np.T, rtol=1e-5, atol=1e-5)
    assert "Allgather" in fd.host_ir()
