"""fd.output_shardings(), TensorView.shard_like and gather_tensor in one process: what they return
without a mesh or on a world of one, and their errors (mp/test_output_shardings.py runs them sharded)."""
import numpy as np
import pytest

from meshfuse import DataType, FusionDefinition, ParallelType
from meshfuse.multidevice import DeviceMesh, gather_tensor, shard_tensor


def relu_of_symbolic_rows():
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, 3], DataType.Float)
        fd.add_output(fd.ops.relu(x))
    return fd


def test_output_shardings_need_an_execution():
    with pytest.raises(RuntimeError, match="output_shardings: nothing has been lowered yet"):
        relu_of_symbolic_rows().output_shardings()


def test_unsharded_outputs_have_no_mesh_and_their_bound_extents():
    fd = relu_of_symbolic_rows()
    x = np.arange(-6, 9, dtype=np.float32).reshape(5, 3)
    (y,) = fd.execute([x])
    (ys,) = fd.output_shardings()
    assert ys.shape == [5, 3] and ys.device_mesh is None and ys.dtype == DataType.Float
    assert gather_tensor(y, ys) is y and shard_tensor(y, ys, 0) is y
    fd.execute([x[:2]])
    assert fd.output_shardings()[0].shape == [2, 3], "the last execution's bound extents"


def test_one_rank_mesh_gathers_to_the_whole_output():
    mesh = DeviceMesh([0])
    with FusionDefinition() as fd:
        x = fd.define_tensor([4, 2], DataType.Float)
        y = fd.ops.mul(x, x)
        fd.add_output(y)
        x.set_device_mesh(mesh)
        x.outer_split(0, 1)
        x.axis(0).parallelize(ParallelType.mesh_x)
    full = np.random.default_rng(3).standard_normal((4, 2)).astype(np.float32)
    (out,) = fd.execute([full])
    (ys,) = fd.output_shardings()
    assert ys.device_mesh == mesh and ys.sharded_axis(ParallelType.mesh_x) == 0, ys
    np.testing.assert_array_equal(gather_tensor(out, ys), full * full)


def test_shard_like_copies_mesh_and_loop_and_checks_its_argument():
    mesh = DeviceMesh([0])
    with FusionDefinition() as fd:
        a = fd.define_tensor([4, 2], DataType.Float)
        b = fd.define_tensor([4, 2], DataType.Float)
        c = fd.define_tensor([4], DataType.Float)
        d = fd.define_tensor([4, 2], DataType.Float)
        fd.add_output(fd.ops.add(a, b))
        a.set_device_mesh(mesh)
        a.outer_split(1, 1)
        a.axis(1).parallelize(ParallelType.mesh_x)
        b.shard_like(a)
        assert b.device_mesh == mesh and b.loop == a.loop and b.sharded_axis(ParallelType.mesh_x) == 1
        with pytest.raises(ValueError, match="shard_like: .* has 1 dimensions, .* has 2"):
            c.shard_like(a)
        with pytest.raises(ValueError, match="has no device mesh"):
            a.shard_like(d)


def test_gather_tensor_wants_a_tensor_view():
    with pytest.raises(TypeError, match="gather_tensor: tv must be a TensorView, got str"):
        gather_tensor(np.zeros(2), "T0")


def test_shard_tensor_of_a_zero_dimensional_array_is_an_array():
    """Indexing with () gave a numpy scalar, which execute refuses (the layer's sdpa_seed on a mesh)."""
    with FusionDefinition() as fd:
        s = fd.define_tensor([], DataType.Int)
        fd.add_output(fd.ops.add(s, 1))
        s.set_device_mesh(DeviceMesh([0]))
    shard = shard_tensor(np.array(41), s, 0)
    assert isinstance(shard, np.ndarray) and shard.shape == ()
    assert int(fd.execute([shard])[0]) == 42
