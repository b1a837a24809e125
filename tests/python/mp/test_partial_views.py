"""A matmul's Partial result (its contraction axis sharded) waits through views for the annotated
tensor (a set, or the view itself) that reshards it (run under mpirun -np 2 / 4): reshaped and
wanted sharded, it is reduce-scattered, not allreduced and sliced; consumed by a pointwise op, or returned, it is allreduced first. Every case
checks the numbers against numpy on every rank."""
import os
import sys

import numpy as np

from meshfuse import DataType, FusionDefinition, ParallelType
from meshfuse.multidevice import Communicator, DeviceMesh

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir))
from host_ir_lines import communications  # noqa: E402

COMM = Communicator.instance()
RANK, WORLD = COMM.rank, COMM.size
MESH = DeviceMesh(range(WORLD))
M, K, N = 4 * WORLD, 3 * WORLD, 5

RNG = np.random.default_rng(21)
A = RNG.standard_normal((M, K)).astype(np.float32)
B = RNG.standard_normal((K, N)).astype(np.float32)
PRODUCT = A.astype(np.float64) @ B.astype(np.float64)


def shard(tv, axis):
    tv.set_device_mesh(MESH)
    tv.outer_split(axis, WORLD)
    tv.axis(axis).parallelize(ParallelType.mesh_x)


def run(consumer):
    """A [M, K] @ [K, N] with K sharded, reshaped to [2, M/2, N], then `consumer(fd, y)`."""
    with FusionDefinition() as fd:
        a, b = fd.define_tensor([M, K], DataType.Float), fd.define_tensor([K, N], DataType.Float)
        y = fd.ops.reshape(fd.ops.matmul(a, b), [2, M // 2, N])
        out = consumer(fd, y)
        fd.add_output(out)
        shard(a, 1)
        shard(b, 0)
    k = K // WORLD
    (result,) = fd.execute([A[:, RANK * k:(RANK + 1) * k], B[RANK * k:(RANK + 1) * k]])
    return fd, result, out


def test_partial_reshaped_then_sharded_is_reduce_scattered():
    def sharded_copy(fd, y):
        z = fd.ops.set(y)
        shard(z, 1)
        return z

    fd, result, _ = run(sharded_copy)
    assert communications(fd) == ["ReduceScatter"], fd.host_ir()
    rows = M // 2 // WORLD
    expected = PRODUCT.reshape(2, M // 2, N)[:, RANK * rows:(RANK + 1) * rows]
    np.testing.assert_allclose(result, expected, rtol=1e-5, atol=1e-5)


def test_partial_whose_reshape_is_annotated_sharded_is_reduce_scattered():
    def annotated_view(fd, y):
        shard(y, 1)  # the reshape's result itself, no set
        return fd.ops.mul(y, 2.0)

    fd, result, _ = run(annotated_view)
    assert communications(fd) == ["ReduceScatter"], fd.host_ir()
    rows = M // 2 // WORLD
    expected = 2 * PRODUCT.reshape(2, M // 2, N)[:, RANK * rows:(RANK + 1) * rows]
    np.testing.assert_allclose(result, expected, rtol=1e-5, atol=1e-5)


def test_partial_consumed_by_pointwise_is_allreduced_first():
    fd, result, _ = run(lambda fd, y: fd.ops.mul(y, 2.0))
    assert communications(fd) == ["Allreduce"], fd.host_ir()
    np.testing.assert_allclose(result, 2 * PRODUCT.reshape(2, M // 2, N), rtol=1e-5, atol=1e-5)


def test_partial_view_returned_is_allreduced():
    fd, result, _ = run(lambda fd, y: fd.ops.permute(y, [0, 2, 1]))
    assert communications(fd) == ["Allreduce"], fd.host_ir()
    np.testing.assert_allclose(result, PRODUCT.reshape(2, M // 2, N).transpose(0, 2, 1), rtol=1e-5, atol=1e-5)


def test_partial_max_reshaped_then_annotated_is_reduced_with_max():
    """A max over the sharded axis is Partial too: its communication reads the max back through
    the view (it once added the shards' maxima when a view hid the max)."""
    with FusionDefinition() as fd:
        a = fd.define_tensor([M, K], DataType.Float)
        y = fd.ops.reshape(fd.ops.max(a, [1]), [2, M // 2])
        z = fd.ops.set(y)
        fd.add_output(z)
        shard(a, 1)
        z.set_device_mesh(MESH)
    k = K // WORLD
    (result,) = fd.execute([A[:, RANK * k:(RANK + 1) * k]])
    assert communications(fd) == ["Allreduce"], fd.host_ir()
    np.testing.assert_array_equal(result, A.max(axis=1).reshape(2, M // 2))


def _reduced_reshaped_then_sharded(reduce):
    """`reduce(fd, a)` over a's sharded axis 1, reshaped to [2, M/2] and wanted sharded on axis 1."""
    with FusionDefinition() as fd:
        a = fd.define_tensor([M, K], DataType.Float)
        z = fd.ops.set(fd.ops.reshape(reduce(fd, a), [2, M // 2]))
        fd.add_output(z)
        shard(a, 1)
        shard(z, 1)
    k = K // WORLD
    (result,) = fd.execute([A[:, RANK * k:(RANK + 1) * k]])
    rows = M // 2 // WORLD
    return fd, result, (slice(None), slice(RANK * rows, (RANK + 1) * rows))


def test_partial_max_reshaped_then_sharded_is_reduce_scattered_with_max():
    # It was allreduced whole and sliced: only sums waited through views for their resharding.
    fd, result, mine = _reduced_reshaped_then_sharded(lambda fd, a: fd.ops.max(a, [1]))
    assert communications(fd) == ["ReduceScatter"], fd.host_ir()
    np.testing.assert_array_equal(result, A.max(axis=1).reshape(2, M // 2)[mine])


def test_partial_mean_reshaped_then_sharded_is_scaled_then_reduce_scattered():
    # Each rank's mean over its K/d columns is divided by d before it waits, so the reduce-scatter's
    # sum is the global mean.
    fd, result, mine = _reduced_reshaped_then_sharded(lambda fd, a: fd.ops.mean(a, [1]))
    assert communications(fd) == ["ReduceScatter"], fd.host_ir()
    np.testing.assert_allclose(result, A.astype(np.float64).mean(axis=1).reshape(2, M // 2)[mine], rtol=1e-5,
                               atol=1e-6)


def test_half_sum_reshaped_then_sharded_is_widened_not_left_waiting():
    # A 16-bit sum's partials travel in float32 (overflow and rounding otherwise): it does not wait in
    # Half through the view, and the result equals the float64 sum rounded once.
    with FusionDefinition() as fd:
        a = fd.define_tensor([M, K], DataType.Half)
        z = fd.ops.set(fd.ops.reshape(fd.ops.sum(a, [1]), [2, M // 2]))
        fd.add_output(z)
        shard(a, 1)
        shard(z, 1)
    k = K // WORLD
    # The first half of the columns near +30000, the second near -30000: each rank's three columns sum
    # past Half's 65504, while the whole row's sum is small.
    sign = np.where(np.arange(K) < K // 2, 1.0, -1.0)
    big = (sign * 30000 + A * 100).astype(np.float16)
    (result,) = fd.execute([big[:, RANK * k:(RANK + 1) * k]])
    rows = M // 2 // WORLD
    want = big.astype(np.float64).sum(axis=1).reshape(2, M // 2)[:, RANK * rows:(RANK + 1) * rows]
    assert result.dtype == np.float16 and np.all(np.abs(want) < 60000)
    np.testing.assert_array_equal(result, want.astype(np.float16))
