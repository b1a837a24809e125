"""Issue 12's ops on sharded tensors (run under mpirun -np 2 / 4): comparisons and where stay sharded
(no communication), a slice or cat of an unsharded axis is local, a slice or cat along the sharded
axis reshards (an allgather) and gives the right numbers, a row-sharded LayerNorm is one local
normalization segment, and a sharded uniform()/normal() holds its block of the one global tensor."""
import os
import sys

import numpy as np
import pytest

import meshfuse
from meshfuse import DataType, FusionDefinition, ParallelType
from meshfuse.multidevice import Communicator, DeviceMesh, shard_tensor

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir))
from host_ir_lines import communications, launches as segments  # noqa: E402
import philox_reference  # noqa: E402

COMM = Communicator.instance()
RANK, WORLD = COMM.rank, COMM.size
MESH = DeviceMesh(range(WORLD))
DEFAULT_SEED = int(os.environ.get("MESHFUSE_SEED", 0x6D657368))


def shard(tv, axis=0):
    tv.set_device_mesh(MESH)
    tv.outer_split(axis, WORLD)
    tv.axis(axis).parallelize(ParallelType.mesh_x)


def block(full, axis=0):
    n = full.shape[axis] // WORLD
    return np.take(full, range(RANK * n, (RANK + 1) * n), axis=axis)


FULL = np.random.default_rng(12).uniform(-2, 2, (4 * WORLD, 6)).astype(np.float32)


def test_comparison_and_where_stay_sharded():
    with FusionDefinition() as fd:
        x = fd.define_tensor([4 * WORLD, 6])
        fd.add_output(fd.ops.where(fd.ops.logical_and(fd.ops.gt(x, -1.0), fd.ops.le(x, 1.5)), x, fd.ops.neg(x)))
        fd.add_output(fd.ops.ne(x, 0.5))
        shard(x)
    y, c = fd.execute([shard_tensor(FULL, x, RANK)])
    assert communications(fd) == [], fd.host_ir()
    expected = np.where((FULL > -1) & (FULL <= 1.5), FULL, -FULL)
    np.testing.assert_array_equal(y, block(expected))
    np.testing.assert_array_equal(c, block(FULL != 0.5))


@pytest.mark.parametrize("op", ["slice", "cat"])
def test_slice_and_cat_of_an_unsharded_axis_are_local(op):
    with FusionDefinition() as fd:
        x = fd.define_tensor([4 * WORLD, 6])
        y = fd.ops.slice(x, [0, 1], [4 * WORLD, 5]) if op == "slice" else fd.ops.cat([x, fd.ops.neg(x)], 1)
        fd.add_output(y)
        shard(x)
    (out,) = fd.execute([shard_tensor(FULL, x, RANK)])
    assert communications(fd) == [], fd.host_ir()
    expected = FULL[:, 1:5] if op == "slice" else np.concatenate([FULL, -FULL], 1)
    np.testing.assert_array_equal(out, block(expected))


@pytest.mark.parametrize("op", ["slice", "cat"])
def test_slice_and_cat_along_the_sharded_axis_reshard(op):
    with FusionDefinition() as fd:
        x = fd.define_tensor([4 * WORLD, 6])
        y = fd.ops.slice(x, [1, 0], [4 * WORLD - 1, 6], [2, 1]) if op == "slice" else fd.ops.cat([x, x], 0)
        fd.add_output(y)
        shard(x)
    (out,) = fd.execute([shard_tensor(FULL, x, RANK)])
    assert "Allgather" in communications(fd), fd.host_ir()
    np.testing.assert_array_equal(out, FULL[1:4 * WORLD - 1:2] if op == "slice" else np.concatenate([FULL, FULL]))


def test_row_sharded_layernorm_is_one_local_normalization_segment():
    w = np.linspace(0.5, 1.5, 6).astype(np.float32)
    with FusionDefinition() as fd:
        x, tw = fd.define_tensor([4 * WORLD, 6]), fd.define_tensor([6])
        var, mean = fd.ops.var_mean(x, [1], 0, True)
        fd.add_output(fd.ops.mul(fd.ops.mul(fd.ops.sub(x, mean), fd.ops.rsqrt(fd.ops.add(var, 1e-5))), tw))
        shard(x)
        tw.set_device_mesh(MESH)
    (out,) = fd.execute([shard_tensor(FULL, x, RANK), w])
    assert communications(fd) == [] and segments(fd) == ["normalization"], fd.host_ir()
    x64 = FULL.astype(np.float64)
    expected = (x64 - x64.mean(1, keepdims=True)) / np.sqrt(x64.var(1, keepdims=True) + 1e-5) * w
    np.testing.assert_allclose(out, block(expected), rtol=1e-5, atol=1e-5)


def draw(name, shape, dtype=DataType.Float, seed=None, offset=None, axis=None):
    with FusionDefinition() as fd:
        kw = {} if seed is None else dict(rng_seed=seed, rng_offset=offset)
        u = getattr(fd.ops, name)(0.0, 1.0, shape, dtype, **kw)
        fd.add_output(u)
        if axis is not None:
            shard(u, axis)
    return fd


@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("name", ["uniform", "normal"])
def test_sharded_random_is_a_block_of_the_unsharded_tensor(name, axis):
    shape = [3 * WORLD, 2 * WORLD + 0] if axis == 1 else [2 * WORLD, 5]
    (local,) = draw(name, shape, seed=21, offset=4, axis=axis).execute([])
    (whole,) = draw(name, shape, seed=21, offset=4).execute([])
    assert local.shape[axis] == shape[axis] // WORLD
    np.testing.assert_array_equal(local, block(whole, axis))


@pytest.mark.parametrize("dtype", [DataType.Float, DataType.Double], ids=["float", "double"])
@pytest.mark.parametrize("axis", [0, 1])
def test_sharded_uniform_is_its_block_of_the_numpy_philox(axis, dtype):
    # Rows of 5 (axis 0) or 17 (axis 1): every rank but the first starts its block mid-counter (a
    # Float uniform is word g % 4 of counter g / 4, a Double one two words of counter g / 2).
    shape = [3 * WORLD, 17] if axis == 0 else [5, 17 * WORLD]
    (local,) = draw("uniform", shape, dtype, seed=(1 << 35) + 1, offset=77, axis=axis).execute([])
    want = philox_reference.uniform(shape, 0.0, 1.0, dtype == DataType.Double, (1 << 35) + 1, 77)
    np.testing.assert_array_equal(local, block(want, axis))


def test_unseeded_sharded_draw_is_one_global_tensor():
    # Without a seed every rank draws with the same fresh (seed, offset): the gathered tensor equals
    # ONE single-draw tensor at some offset, and the next execution draws other numbers.
    with FusionDefinition() as fd:
        u = fd.ops.uniform(0.0, 1.0, [2 * WORLD, 3], DataType.Float)
        whole = fd.ops.set(u)
        fd.add_output(u)
        fd.add_output(whole)
        shard(u)
        whole.set_device_mesh(MESH)  # replicated: an allgather
    local, gathered = fd.execute([])
    assert "Allgather" in communications(fd), fd.host_ir()
    np.testing.assert_array_equal(local, block(gathered))
    blocks = np.split(gathered, WORLD)
    assert all(not np.array_equal(blocks[0], b) for b in blocks[1:])  # blocks of a global tensor, not copies
    with FusionDefinition() as probe:
        s, o = probe.define_scalar(dtype=DataType.Int), probe.define_scalar(dtype=DataType.Int)
        probe.add_output(probe.ops.uniform(0.0, 1.0, [2 * WORLD, 3], DataType.Float, rng_seed=s, rng_offset=o))
    matches = [o for o in range(4000) if np.array_equal(probe.execute([DEFAULT_SEED, o])[0], gathered)]
    assert len(matches) == 1, matches
    again = fd.execute([])[1]
    assert np.mean(again == gathered) < 0.05


def _rows_from_every_rank(row):
    """Every rank's `row` (a float32 vector), stacked in rank order, by a meshfuse allgather."""
    with FusionDefinition() as fd:
        x = fd.define_tensor([WORLD, row.size])
        y = fd.ops.set(x)
        fd.add_output(y)
        shard(x, 0)
        y.set_device_mesh(MESH)
    return fd.execute([row.reshape(1, -1)])[0]


def replicated_uniform():
    """A [16] uniform on the world's mesh, replicated: every rank draws all of it."""
    with FusionDefinition() as fd:
        x = fd.define_tensor([16])
        y = fd.ops.add(x, fd.ops.uniform(0.0, 1.0, [16]))
        fd.add_output(y)
        x.set_device_mesh(MESH)
        y.set_device_mesh(MESH)
    return fd.execute([np.zeros(16, np.float32)])[0]


def test_a_rank_drawing_alone_does_not_set_the_ranks_apart():
    """Rank 0 runs a fusion of its own that draws (its Philox offset moves, the others' do not); the
    next multi-rank execution agrees on the offset, so a replicated random tensor is equal on every
    rank (it differed, silently: the layer's dropout masks too)."""
    if RANK == 0:
        with FusionDefinition() as fd:
            x = fd.define_tensor([4])
            fd.add_output(fd.ops.add(x, fd.ops.uniform(0.0, 1.0, [4])))
        fd.execute([np.zeros(4, np.float32)])
    rows = _rows_from_every_rank(replicated_uniform())
    assert np.all(rows == rows[0]), rows
    assert 0.0 < rows[0].min() and rows[0].max() < 1.0 and len(set(rows[0].tolist())) == 16


def test_ranks_with_different_seeds_raise_on_every_rank(monkeypatch):
    monkeypatch.setenv("MESHFUSE_SEED", str(1000 + RANK))
    with pytest.raises(ValueError, match="ranks disagree on MESHFUSE_SEED"):
        replicated_uniform()
    monkeypatch.setenv("MESHFUSE_SEED", "1000")
    rows = _rows_from_every_rank(replicated_uniform())
    assert np.all(rows == rows[0]), rows


def test_ranks_giving_different_rng_offsets_agree_on_the_largest():
    """execute(rng_offset=...) from generators seeded per rank (torch.manual_seed(rank)): the ranks draw
    one replicated tensor, the one of the largest offset; a rank giving none among ranks giving one
    raises on every rank."""
    def draw(offset):
        with FusionDefinition() as fd:
            x = fd.define_tensor([16])
            fd.add_output(fd.ops.add(x, fd.ops.uniform(0.0, 1.0, [16])))
            x.set_device_mesh(MESH)
        return fd.execute([np.zeros(16, np.float32)], rng_offset=offset)[0]
    rows = _rows_from_every_rank(draw(1000 + RANK))
    assert np.all(rows == rows[0]), rows
    with FusionDefinition() as alone:
        alone.add_output(alone.ops.uniform(0.0, 1.0, [16]))
    np.testing.assert_array_equal(rows[0], alone.execute([], rng_offset=1000 + WORLD - 1)[0])
    with pytest.raises(ValueError, match="passes an rng_offset .* does not"):
        draw(7 if RANK == 0 else None)


def test_a_scalar_input_that_differs_between_ranks_raises_on_every_rank():
    """A scalar input is one value for the whole program: ranks passing different ones each computed a
    different replicated result, silently."""
    with FusionDefinition() as fd:
        x = fd.define_tensor([4 * WORLD, 6])
        s = fd.define_scalar(dtype=DataType.Double)
        fd.add_output(fd.ops.mul(x, s))
        shard(x)
    with pytest.raises(ValueError, match=r"S\d+ \(input 1\): ranks pass different values for this scalar \(1 on rank 0"):
        fd.execute([block(FULL), 1.0 + RANK])
    np.testing.assert_allclose(fd.execute([block(FULL), 2.5])[0], block(FULL) * 2.5, rtol=1e-6)


CPU_BACKENDS = [b for b in (meshfuse.CommunicatorBackend.mpi, meshfuse.CommunicatorBackend.gloo,
                            meshfuse.CommunicatorBackend.ucc) if b in meshfuse.available_backends()]


@pytest.mark.parametrize("backend", CPU_BACKENDS, ids=lambda b: b.name)
@pytest.mark.parametrize("dtype", [DataType.Float, DataType.Double, DataType.Half, DataType.BFloat16],
                         ids=["float32", "float64", "float16", "bfloat16"])
def test_max_over_a_sharded_axis_keeps_nan_from_any_rank(backend, dtype):
    """A max over a sharded axis ends in an allreduce(max), whose backends compared values: a NaN was
    kept or dropped by the rank that held it (NaN wins in numpy's max; UCC kept NaN for Float and Double
    but not for Half, which it widened, nor BFloat16). Exact against numpy, with negative values, -0,
    infinities, and a NaN on each rank in turn. BFloat16 comes in as Float (numpy has no bfloat16) and
    is cast before the max; every value is a multiple of 1/4, exact in each dtype."""
    np_dtype = {DataType.Float: np.float32, DataType.Double: np.float64, DataType.Half: np.float16,
                DataType.BFloat16: np.float32}[dtype]
    with FusionDefinition(backend_type=backend) as fd:
        x = fd.define_tensor([2 * WORLD, 5], DataType.Float if dtype == DataType.BFloat16 else dtype)
        v = fd.ops.cast(x, DataType.BFloat16) if dtype == DataType.BFloat16 else x
        outputs = (fd.ops.max(v, [0]), fd.ops.neg(fd.ops.max(fd.ops.neg(v), [0])))  # a max and a min
        for out in outputs:
            fd.add_output(fd.ops.cast(out, DataType.Float) if dtype == DataType.BFloat16 else out)
        shard(x)
    rng = np.random.default_rng(40)
    for holder in range(WORLD):
        full = (rng.integers(-16, 16, (2 * WORLD, 5)) / 4 - 3.0).astype(np_dtype)
        full[:, 1] = -0.0
        full[2 * holder, 2] = np.nan
        full[2 * holder + 1, 3] = np.inf
        full[:, 4] = -np.inf
        full[2 * holder, 4] = np.nan
        biggest, smallest = fd.execute([block(full)])
        np.testing.assert_array_equal(biggest, np.max(full, axis=0))
        np.testing.assert_array_equal(smallest, np.min(full, axis=0))


@pytest.mark.parametrize("how", ["env 1e10", "env inf", "timeout=inf"])
def test_a_huge_or_infinite_timeout_waits_instead_of_expiring_at_once(monkeypatch, how):
    """MESHFUSE_TIMEOUT=1e10 overflowed the deadline's nanoseconds: every wait expired at once and the job
    aborted. Huge and infinite timeouts are the longest one now (100000 days), in the environment and in
    FusionDefinition(timeout=)."""
    if how.startswith("env"):
        monkeypatch.setenv("MESHFUSE_TIMEOUT", how.split()[1])
    with FusionDefinition(**({"timeout": float("inf")} if how == "timeout=inf" else {})) as fd:
        x = fd.define_tensor([4 * WORLD, 6])
        y = fd.ops.set(x)
        fd.add_output(y)
        shard(x)
        y.set_device_mesh(MESH)
    np.testing.assert_array_equal(fd.execute([block(FULL)])[0], FULL)


@pytest.mark.parametrize("batch", [6, -1], ids=["static batch", "symbolic batch"])
def test_heads_stay_sharded_through_reshapes_with_a_symbolic_batch(batch):
    """Column-parallel linear, split into heads, permute, merge the heads back, row-parallel linear: the
    heads stay sharded through the views and the one communication is the final allreduce. With the
    batch extent symbolic (-1, as the README writes inputs) a reshape only mapped its leading axis,
    so the heads were allgathered (three more collectives of the activation) and computed in full."""
    heads, head_dim, hidden = 2 * WORLD, 4, 8
    with FusionDefinition() as fd:
        x = fd.define_tensor([batch, hidden])
        w1 = fd.define_tensor([heads * head_dim, hidden])
        w2 = fd.define_tensor([hidden, heads * head_dim])
        h = fd.ops.reshape(fd.ops.linear(x, w1), [batch, heads, head_dim])
        h = fd.ops.permute(fd.ops.relu(fd.ops.permute(h, [1, 0, 2])), [1, 0, 2])
        y = fd.ops.linear(fd.ops.reshape(h, [batch, heads * head_dim]), w2)
        fd.add_output(y)
        for tv in (x, w1, w2, y):
            tv.set_device_mesh(MESH)
        shard(w1, 0)
        shard(w2, 1)
    rng = np.random.default_rng(13)
    xs = rng.standard_normal((6, hidden))
    w1s, w2s = rng.standard_normal((heads * head_dim, hidden)), rng.standard_normal((hidden, heads * head_dim))
    (out,) = fd.execute([xs.astype(np.float32), block(w1s.astype(np.float32), 0), block(w2s.astype(np.float32), 1)])
    assert communications(fd) == ["Allreduce"], fd.host_ir()
    np.testing.assert_allclose(out, np.maximum(xs @ w1s.T, 0) @ w2s.T, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("rows", [8, -1], ids=["static rows", "symbolic rows"])
def test_a_merge_whose_outer_axis_is_symbolic_keeps_the_sharding(rows):
    """[rows, 8] sharded on axis 0, merged to [8 * rows] and annotated sharded on axis 0: local. With
    rows symbolic, the static 8 was grouped from the back with the static 64 and stopped at the
    symbolic axis, mapping nothing: the annotation was refused ("blocks do not line up")."""
    full = np.arange(8 * 8 * WORLD, dtype=np.float32).reshape(8 * WORLD, 8)
    with FusionDefinition() as fd:
        x = fd.define_tensor([rows if rows < 0 else 8 * WORLD, 8])
        y = fd.ops.reshape(x, [64 * WORLD])
        fd.add_output(y)
        for tv in (x, y):
            shard(tv)
    (out,) = fd.execute([block(full)])
    assert communications(fd) == [], fd.host_ir()
    np.testing.assert_array_equal(out, block(full.reshape(-1)))


@pytest.mark.parametrize("scattered", [False, True], ids=["allreduce", "reduce-scatter"])
@pytest.mark.parametrize("bias", [False, True], ids=["no bias", "bias"])
def test_a_half_linear_with_a_sharded_contraction_sums_float32_partials(scattered, bias):
    """Each rank's Half partial product was rounded to Half before the allreduce or reduce-scatter: rank
    0's 65536 became inf, and so did the output, whose true value (65536 - 256 (W - 1), plus the bias)
    is a finite Half. On the CPU the partials are float32 now, rounded once after the reduction."""
    x_full = np.full((2 * WORLD, WORLD), 256, np.float16)
    w_full = np.full((3, WORLD), -1, np.float16)
    w_full[:, 0] = 256  # rank 0's partial: 256 * 256 = 65536, past Half's 65504
    b_full = np.array([0.5, -0.5, 1.0], np.float16)
    with FusionDefinition() as fd:
        x, w = fd.define_tensor([2 * WORLD, WORLD], DataType.Half), fd.define_tensor([3, WORLD], DataType.Half)
        b = fd.define_tensor([3], DataType.Half) if bias else None
        y = fd.ops.linear(x, w, b)
        fd.add_output(y)
        shard(x, 1)
        shard(w, 1)
        if b is not None:
            b.set_device_mesh(MESH)
        if scattered:
            shard(y, 0)
        else:
            y.set_device_mesh(MESH)
    want = x_full.astype(np.float64) @ w_full.astype(np.float64).T + (b_full if bias else 0)
    (out,) = fd.execute([block(x_full, 1), block(w_full, 1)] + ([b_full] if bias else []))
    assert out.dtype == np.float16
    np.testing.assert_array_equal(out, (block(want) if scattered else want).astype(np.float16))


@pytest.mark.parametrize("op", ["var_mean", "sum", "mean"])
def test_a_half_reduction_over_the_sharded_axis_is_reduced_in_float32(op):
    """Each rank's Half partial of a sum over the sharded axis was rounded to Half before the allreduce:
    a LayerNorm's sum of squares over 65504 became inf (variance inf, output 0). The partials travel in
    float32 now and the result is rounded once: within Half's rounding of the float64 answer."""
    cols = 1024 * WORLD
    full = (np.random.default_rng(5).standard_normal((2, cols)) * 8).astype(np.float16)
    with FusionDefinition() as fd:
        x = fd.define_tensor([2, cols], DataType.Half)
        if op == "var_mean":
            var, mean = fd.ops.var_mean(x, [1])
            fd.add_output(var)
            fd.add_output(mean)
        else:
            fd.add_output(getattr(fd.ops, op)(x, [1]))
        shard(x, 1)
    wide = full.astype(np.float64)
    expected = {"var_mean": [wide.var(1), wide.mean(1)], "sum": [wide.sum(1)], "mean": [wide.mean(1)]}[op]
    for got, want in zip(fd.execute([block(full, 1)]), expected):
        assert got.dtype == np.float16 and np.isfinite(got).all(), got
        np.testing.assert_allclose(got.astype(np.float64), want, rtol=2e-3, atol=2e-3)
    assert communications(fd).count("Allreduce") >= 1


def test_replicas_passing_different_data_raise_when_checked(monkeypatch):
    """MESHFUSE_CHECK_REPLICAS=1: tensor-parallel ranks each loading their own batch pass different
    'replicated' inputs, which computed garbage silently. With the check every rank raises naming the
    ranks; blocks sharded along a dim may differ, replicas along another must not."""
    monkeypatch.setenv("MESHFUSE_CHECK_REPLICAS", "1")

    def run(mine, shard_rows):
        with FusionDefinition() as fd:
            x = fd.define_tensor([2 * WORLD, 3])
            fd.add_output(fd.ops.sum(fd.ops.mul(x, x), [0]))
            if shard_rows:
                shard(x, 0)
            else:
                x.set_device_mesh(MESH)
        return fd.execute([mine])[0]

    same = np.arange(6 * WORLD, dtype=np.float32).reshape(2 * WORLD, 3)
    np.testing.assert_allclose(run(same, False), (same.astype(np.float64) ** 2).sum(0), rtol=1e-6)
    np.testing.assert_allclose(run(block(same), True), (same.astype(np.float64) ** 2).sum(0), rtol=1e-6)
    with pytest.raises(ValueError, match=r"ranks 0 and 1 hold replicas of one block \(the tensor is not sharded "
                                         r"along mesh_x\) but pass different data"):
        run(same + RANK, False)
    if WORLD % 2 == 0:  # a [2, WORLD/2] mesh, rows along mesh_y: replicas along mesh_x
        mesh = DeviceMesh(np.arange(WORLD).reshape(2, WORLD // 2))
        with FusionDefinition() as fd:
            x = fd.define_tensor([4, 3])
            fd.add_output(fd.ops.mul(x, 2.0))
            x.set_device_mesh(mesh)
            x.outer_split(0, 2)
            x.axis(0).parallelize(ParallelType.mesh_y)
        row = mesh.coordinate(RANK, ParallelType.mesh_y)
        mine = np.full((2, 3), float(row), np.float32)            # blocks differ, replicas agree
        np.testing.assert_array_equal(fd.execute([mine])[0], 2 * mine)
        if WORLD > 2:
            with pytest.raises(ValueError, match="not sharded along mesh_x"):
                fd.execute([mine + RANK])
