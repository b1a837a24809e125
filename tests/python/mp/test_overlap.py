"""ParallelType.stream from Python (run under mpirun -np 2 and -np 4 by scripts/test): the pipelined
allgather -> linear and linear -> reduce-scatter loops give, on every rank, the result of the same
definition without the stream split and of numpy in float64, for s in {1, 2, 4, 8} chunks, every
available host backend and three dtypes; a chunk count that does not divide is a ValueError on
every rank. Every communication is bounded by MESHFUSE_TIMEOUT (60 s in scripts/test)."""
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir, os.pardir,
                                "benchmarks"))

import meshfuse  # noqa: E402
from meshfuse import CommunicatorBackend, DataType  # noqa: E402
from meshfuse.multidevice import Communicator  # noqa: E402
from overlap_patterns import ALLGATHER_LINEAR, PATTERNS, OverlapProgram  # noqa: E402

RANK, WORLD = Communicator.instance().rank, Communicator.instance().size
BACKENDS = [b for b in (CommunicatorBackend.mpi, CommunicatorBackend.gloo, CommunicatorBackend.ucc)
            if b in meshfuse.available_backends()]
CHUNKS = [1, 2, 4, 8]
# name -> (input/output dtype, dtype the linear and its communication run in, numpy dtype of the inputs)
DTYPES = {
    "float32": (DataType.Float, None, np.float32),
    "float64": (DataType.Double, None, np.float64),
    "bfloat16": (DataType.Float, DataType.BFloat16, np.float32),
}
# Global extents: 16 local rows per rank split into up to 8 chunks; K and N divisible by the world.
ROWS, K, COLS = 16 * WORLD, 6 * WORLD, 4 * WORLD


def round_to_bfloat16(a):
    """float32 values rounded to the nearest bfloat16 (ties to even), as float32."""
    bits = a.astype(np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16 << 16
    return (rounded & 0xFFFFFFFF).astype(np.uint32).view(np.float32)


def reference(x, w, dtype_name):
    """numpy float64 linear, and the bound its error may reach in the dtype the program computes in."""
    magnitude = np.abs(x.astype(np.float64)) @ np.abs(w.astype(np.float64)).T
    if dtype_name == "bfloat16":  # the inputs are rounded to bfloat16, then results and partial sums
        x, w = round_to_bfloat16(x), round_to_bfloat16(w)
        bound = 2.0**-6 * magnitude
    else:
        bound = (1e-12 if dtype_name == "float64" else 1e-5) * magnitude + 1e-30
    return x.astype(np.float64) @ w.astype(np.float64).T, bound


def assert_within(actual, expected, bound, what):
    error = np.abs(actual.astype(np.float64) - expected)
    worst = np.unravel_index(np.argmax(error - bound), error.shape)
    assert np.all(error <= bound), (f"rank {RANK}: {what}: |{actual[worst]} - {expected[worst]}| = {error[worst]:.3g} "
                                    f"> {bound[worst]:.3g} at {worst}")


def program(pattern, backend, dtype_name, chunks, number_of_streams=2, rows=ROWS):
    dtype, compute_dtype, _ = DTYPES[dtype_name]
    return OverlapProgram(pattern, rows, K, COLS, chunks=chunks, dtype=dtype, compute_dtype=compute_dtype,
                          backend=backend, number_of_streams=number_of_streams)


def random_inputs(rng, dtype_name, rows=ROWS):
    np_dtype = DTYPES[dtype_name][2]
    return rng.uniform(-1, 1, (rows, K)).astype(np_dtype), rng.uniform(-1, 1, (COLS, K)).astype(np_dtype)


@pytest.mark.parametrize("chunks", CHUNKS)
@pytest.mark.parametrize("dtype_name", list(DTYPES))
@pytest.mark.parametrize("backend", BACKENDS, ids=lambda b: b.name)
@pytest.mark.parametrize("pattern", PATTERNS)
def test_stream_split_equals_unsplit_and_numpy(rng, pattern, backend, dtype_name, chunks):
    x, w = random_inputs(rng, dtype_name)  # the same on every rank: the seed is the test's name
    overlapped = program(pattern, backend, dtype_name, chunks)
    unsplit = program(pattern, backend, dtype_name, None)
    y = overlapped.execute(overlapped.local_inputs(x, w, RANK))
    y_unsplit = unsplit.execute(unsplit.local_inputs(x, w, RANK))

    assert "ForLoop" in overlapped.fd.host_ir(), overlapped.fd.host_ir()
    assert f"0..{chunks}," in overlapped.fd.host_ir(), overlapped.fd.host_ir()
    assert "ForLoop" not in unsplit.fd.host_ir(), unsplit.fd.host_ir()
    assert y.shape == y_unsplit.shape == overlapped.local_output(np.empty((ROWS, COLS)), RANK).shape
    expected, bound = reference(x, w, dtype_name)
    local_expected, local_bound = overlapped.local_output(expected, RANK), overlapped.local_output(bound, RANK)
    assert_within(y, local_expected, local_bound, f"{pattern} s={chunks} vs numpy")
    # The chunks compute the same sums as the single matmul; only BLAS blocking may differ.
    assert_within(y, y_unsplit.astype(np.float64), local_bound, f"{pattern} s={chunks} vs unsplit")


@pytest.mark.parametrize("number_of_streams", [1, 3, 8])
@pytest.mark.parametrize("pattern", PATTERNS)
def test_any_number_of_streams_in_flight(rng, pattern, number_of_streams):
    """1 stream: no chunk in flight during a matmul; 3 (not dividing 8); 8: every chunk posted at once."""
    x, w = random_inputs(rng, "float64")
    p = program(pattern, BACKENDS[0], "float64", 8, number_of_streams=number_of_streams)
    y = p.execute(p.local_inputs(x, w, RANK))
    expected, bound = reference(x, w, "float64")
    assert_within(y, p.local_output(expected, RANK), p.local_output(bound, RANK),
                  f"{pattern} with {number_of_streams} streams")
    assert f"over {number_of_streams} streams" in p.fd.host_ir(), p.fd.host_ir()


@pytest.mark.parametrize("pattern", PATTERNS)
def test_chunks_that_do_not_divide_the_local_rows_are_a_value_error_on_every_rank(rng, pattern):
    rows = 6 * WORLD  # 4 chunks divide the 6 * WORLD global rows but not the 6 rows each rank holds
    x, w = random_inputs(rng, "float32", rows=rows)
    # allgather_linear: the lowering finds it (the split is of the 6 * WORLD global rows);
    # linear_reduce_scatter: the definition (the split is of the local rows, a loop axis of extent 6).
    with pytest.raises(ValueError, match=r"T\d+: .*(4 chunks does not divide the 6 rows|6 does not split evenly by 4)"):
        bad = program(pattern, BACKENDS[0], "float32", 4, rows=rows)
        bad.execute(bad.local_inputs(x, w, RANK))
    # No rank was left inside a collective: the next program runs on all of them.
    good = program(pattern, BACKENDS[0], "float32", 2, rows=rows)
    y = good.execute(good.local_inputs(x, w, RANK))
    expected, bound = reference(x, w, "float32")
    assert_within(y, good.local_output(expected, RANK), good.local_output(bound, RANK), "after the error")


@pytest.mark.parametrize("pattern", PATTERNS)
def test_chunks_that_do_not_divide_the_global_rows_fail_at_definition(pattern):
    with pytest.raises(ValueError, match=r"does not split evenly by 3"):
        program(pattern, BACKENDS[0], "float32", 3)  # 16 * WORLD rows


@pytest.mark.parametrize("where", ["the result's columns", "an input's rows", "a replicated linear"])
def test_a_stream_split_that_pipelines_nothing_raises_on_every_rank(where):
    """Stream splits outside the two pipelined forms used to be dropped silently (the program ran as one
    allgather and one matmul); they raise, naming the tensor and the forms, on every rank."""
    from meshfuse import FusionDefinition, ParallelType
    from meshfuse.multidevice import DeviceMesh, shard_tensor
    mesh = DeviceMesh(range(WORLD))

    def shard(tv, axis):
        tv.set_device_mesh(mesh)
        tv.outer_split(axis, WORLD)
        tv.axis(axis).parallelize(ParallelType.mesh_x)

    with FusionDefinition(backend_type=CommunicatorBackend.mpi, number_of_streams=2) as fd:
        x = fd.define_tensor([4 * WORLD, 8], DataType.Float)
        w = fd.define_tensor([2 * WORLD, 8], DataType.Float)
        y = fd.ops.linear(x, w)
        fd.add_output(y)
        if where == "a replicated linear":
            for t in (x, w, y):
                t.set_device_mesh(mesh)
            y.outer_split(0, 2)
            y.axis(0).parallelize(ParallelType.stream)
        else:
            shard(x, 0)
            shard(w, 0)
            y.set_device_mesh(mesh)
            y.outer_split(1, WORLD)
            y.axis(1).parallelize(ParallelType.mesh_x)
            tv, axis = (y, 2) if where == "the result's columns" else (x, 2)
            tv.outer_split(axis, 2)
            tv.axis(axis).parallelize(ParallelType.stream)
    x_np = np.ones((4 * WORLD, 8), np.float32)
    w_np = np.ones((2 * WORLD, 8), np.float32)
    with pytest.raises(ValueError, match=r"its stream split .* pipelines nothing"):
        fd.execute([shard_tensor(x_np, x, RANK), shard_tensor(w_np, w, RANK)])


@pytest.mark.parametrize("backend", BACKENDS, ids=lambda b: b.name)
def test_a_row_parallel_linear_with_a_bias_is_pipelined(backend):
    """linear(h, w, b) row-parallel into rows sharded and stream-split: the bias is added after the
    reduction, so the split sat on that add and was refused as "pipelining nothing". The reduce-scatter
    is pipelined now, the bias added to the whole result after the loop."""
    from meshfuse import FusionDefinition, ParallelType
    from meshfuse.multidevice import DeviceMesh, shard_tensor
    mesh = DeviceMesh(range(WORLD))
    with FusionDefinition(backend_type=backend, number_of_streams=2) as fd:
        h = fd.define_tensor([8 * WORLD, 2 * WORLD], DataType.Double)
        w = fd.define_tensor([6, 2 * WORLD], DataType.Double)
        b = fd.define_tensor([6], DataType.Double)
        y = fd.ops.linear(h, w, b)
        fd.add_output(y)
        for t in (h, w):
            t.set_device_mesh(mesh)
            t.outer_split(1, WORLD)
            t.axis(1).parallelize(ParallelType.mesh_x)
        b.set_device_mesh(mesh)
        y.set_device_mesh(mesh)
        y.outer_split(0, WORLD)
        y.axis(0).parallelize(ParallelType.mesh_x)
        y.outer_split(1, 4)  # the 8 local rows in 4 chunks
        y.axis(1).parallelize(ParallelType.stream)
    g = np.random.default_rng(5)
    hn, wn, bn = g.standard_normal((8 * WORLD, 2 * WORLD)), g.standard_normal((6, 2 * WORLD)), g.standard_normal(6)
    (local,) = fd.execute([shard_tensor(hn, h, RANK), shard_tensor(wn, w, RANK), bn])
    np.testing.assert_allclose(local, shard_tensor(hn @ wn.T + bn, y, RANK), rtol=1e-12, atol=1e-12)
    program = fd.host_ir()
    assert "ForLoop" in program and "ReduceScatter" in program and "add" in program, program
