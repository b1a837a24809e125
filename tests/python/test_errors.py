"""Every user mistake is a Python exception of the right type whose message names the tensor and
says what was expected and what was given; none of them can crash the interpreter."""
import datetime
import re

import numpy as np
import pytest

import meshfuse
from meshfuse import CommunicationTimeout, CommunicatorBackend, DataType, FusionDefinition, ParallelType, _C
from meshfuse.multidevice import DeviceMesh


@pytest.fixture
def linear_fd():
    """T0 [-1, 8] Float (contiguous), T1 [4, 8] Float; output relu(linear(T0, T1))."""
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, 8], DataType.Float, contiguity=True)
        w = fd.define_tensor([4, 8], DataType.Float, contiguity=True)
        fd.add_output(fd.ops.relu(fd.ops.linear(x, w)))
    return fd


def _x():
    return np.ones((3, 8), np.float32)


def _w():
    return np.ones((4, 8), np.float32)


def _raises(exc_type, *fragments):
    """pytest.raises checking that every fragment appears in the message."""
    return pytest.raises(exc_type, match="(?s)" + "".join(f"(?=.*{re.escape(f)})" for f in fragments))


# ---- execute() inputs, checked in Python before any C++ runs ------------------------------------

def test_wrong_number_of_inputs(linear_fd):
    with _raises(ValueError, "expected 2 inputs (T0, T1)", "got 1"):
        linear_fd.execute([_x()])
    with _raises(ValueError, "expected 2 inputs", "got 3"):
        linear_fd.execute([_x(), _w(), _w()])


def test_inputs_not_a_list(linear_fd):
    with _raises(TypeError, "list or tuple", "ndarray"):
        linear_fd.execute(_x())


@pytest.mark.parametrize("bad,type_name", [([[1.0] * 8] * 3, "list"), (3.0, "float"), ("x", "str")])
def test_not_a_tensor(linear_fd, bad, type_name):
    with _raises(TypeError, "T0", "expected a tensor", "got " + type_name):
        linear_fd.execute([bad, _w()])


def test_wrong_dtype(linear_fd):
    with _raises(TypeError, "T1", "expected dtype Float", "Double (float64)"):
        linear_fd.execute([_x(), _w().astype(np.float64)])


def test_the_message_says_where_the_input_sits_in_the_list(linear_fd):
    # A backward with 28 inputs: "T1" alone would leave the user counting definitions.
    with _raises(TypeError, "T1 (input 1): expected dtype Float"):
        linear_fd.execute([_x(), _w().astype(np.float64)])
    with _raises(TypeError, "T0 (input 0): expected a tensor"):
        linear_fd.execute(["x", _w()])


class _NamedInputs(FusionDefinition):
    """A definition whose inputs have names (input_names(), as the transformer layer's passes have)."""

    def definition(self):
        self.x = self.define_tensor([-1, 8], DataType.Float, contiguity=True)
        self.w = self.define_tensor([4, 8], DataType.Float, contiguity=True)
        self.add_output(self.ops.linear(self.x, self.w))

    def input_names(self):
        return ["activations", "weight"]


def test_a_definition_that_names_its_inputs_has_them_named():
    fd = _NamedInputs()
    with _raises(TypeError, "T1 (input 1, weight): expected dtype Float", "Double"):
        fd.execute([_x(), _w().astype(np.float64)])
    with _raises(ValueError, "T0 (input 0, activations): expected 2 dimensions"):
        fd.execute([np.ones(8, np.float32), _w()])
    assert np.allclose(fd.execute([_x(), _w()])[0], 8.0)


def test_unsupported_dtype(linear_fd):
    with _raises(TypeError, "T0", "dtype uint8 is not supported", "expected Float"):
        linear_fd.execute([_x().astype(np.uint8), _w()])


def test_bfloat16_input_from_numpy_explains_why():
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1], DataType.BFloat16)
        fd.add_output(fd.ops.cast(x, DataType.Float))
    with _raises(TypeError, "T0", "expected dtype BFloat16", "numpy has no bfloat16"):
        fd.execute([np.ones(4, np.float32)])


def test_bfloat16_output_to_numpy_is_refused_before_running():
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1])
        fd.add_output(fd.ops.cast(x, DataType.BFloat16))
    with _raises(TypeError, "T1", "BFloat16 output", "numpy"):
        fd.execute([np.ones(4, np.float32)])
    assert fd.num_cached_programs() == 0


def test_wrong_rank(linear_fd):
    with _raises(ValueError, "T0", "expected 2 dimensions", "got 3", "[2, 3, 8]"):
        linear_fd.execute([np.ones((2, 3, 8), np.float32), _w()])


def test_non_contiguous_where_the_definition_says_contiguous(linear_fd):
    x = np.ones((8, 3), np.float32).T  # shape (3, 8), strides (1, 3)
    with _raises(ValueError, "T0", "contiguous", "strides [1, 3]", "shape [3, 8]"):
        linear_fd.execute([x, _w()])


def test_per_axis_contiguity():
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], contiguity=[False, True])  # rows may be padded, not elements
        fd.add_output(fd.ops.neg(x))
    padded = np.arange(24, dtype=np.float32).reshape(4, 6)[:, :4]  # strides (6, 1)
    (out,) = fd.execute([padded])
    np.testing.assert_array_equal(out, -padded)
    with _raises(ValueError, "T0", "axis 1 is contiguous", "strides [1, 3]"):
        fd.execute([np.ones((3, 4), np.float32, order="F")])


def test_none_for_an_input_this_rank_holds(linear_fd):
    with _raises(ValueError, "T0", "expected a tensor, got None", "no mesh"):
        linear_fd.execute([None, _w()])


def test_scalar_input_given_an_array():
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1])
        s = fd.define_scalar(dtype=DataType.Double)
        fd.add_output(fd.ops.mul(x, s))
    with _raises(TypeError, "S1", "expected a number", "numpy.ndarray"):
        fd.execute([np.ones(3, np.float32), np.ones(3)])


# ---- extents: checked by the C++ executor, which knows the shardings ----------------------------

def test_extent_differs_from_the_definition(linear_fd):
    with _raises(ValueError, "T1 (input 1) axis 1: expected extent 8", "got 9"):
        linear_fd.execute([_x(), np.ones((4, 9), np.float32)])
    with _raises(ValueError, "T0", "8", "7"):
        linear_fd.execute([np.ones((3, 7), np.float32), _w()])


def test_inputs_sharing_a_symbolic_extent_disagree():
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, 4])
        y = fd.define_tensor([-1, 4])
        fd.add_output(fd.ops.add(x, y))
    with _raises(ValueError, "T0", "T1", "3", "5"):
        fd.execute([np.ones((3, 4), np.float32), np.ones((5, 4), np.float32)])


# ---- building a definition --------------------------------------------------------------------

def test_tensor_view_from_another_definition():
    with FusionDefinition() as other:
        foreign = other.define_tensor([4])
    with FusionDefinition() as fd:
        x = fd.define_tensor([4])
        with _raises(ValueError, "add", foreign.name, "another FusionDefinition"):
            fd.ops.add(x, foreign)
        with _raises(ValueError, "relu", foreign.name, "another FusionDefinition"):
            fd.ops.relu(foreign)
        with _raises(ValueError, "add_output", foreign.name, "not a tensor of this FusionDefinition"):
            fd.add_output(foreign)
        # The TensorView operators are checked in C++ and say the same.
        with _raises(ValueError, foreign.name, "another"):
            x + foreign


def test_add_output_of_a_scalar_or_a_non_tensor():
    with FusionDefinition() as fd:
        s = fd.define_scalar(2.0)
        with _raises(ValueError, "add_output", s.name, "is a scalar"):
            fd.add_output(s)
        with _raises(TypeError, "add_output", "ndarray"):
            fd.add_output(np.ones(3))


def test_execute_without_outputs():
    with FusionDefinition() as fd:
        fd.define_tensor([4])
    with _raises(ValueError, "no outputs"):
        fd.execute([np.ones(4, np.float32)])


def test_definition_is_frozen_after_execute(linear_fd):
    linear_fd.execute([_x(), _w()])
    with _raises(RuntimeError, "define_tensor", "already executed"):
        linear_fd.define_tensor([3])


@pytest.mark.parametrize("shape,exc,fragments", [
    ([-2, 3], ValueError, ["shape[0] = -2"]),
    ([2.5], TypeError, ["shape[0]", "float"]),
    (5, TypeError, ["sequence of integers", "int"]),
])
def test_define_tensor_bad_shape(shape, exc, fragments):
    with _raises(exc, *fragments):
        FusionDefinition().define_tensor(shape)


def test_define_tensor_bad_dtype_and_contiguity():
    fd = FusionDefinition()
    with _raises(TypeError, "dtype must be a DataType", "str"):
        fd.define_tensor([2], dtype="float32")
    with _raises(ValueError, "contiguity has 1 entries", "2 dimensions"):
        fd.define_tensor([2, 3], contiguity=[True])


def test_op_errors_name_the_tensors():
    with FusionDefinition() as fd:
        a = fd.define_tensor([4, 5])
        b = fd.define_tensor([6, 3])
        with _raises(ValueError, "matmul", "T0 axis 1 (extent 5)", "T1 axis 0 (extent 6)"):
            fd.ops.matmul(a, b)
        with _raises(ValueError, "sum(T0)", "axis 2", "rank 2"):
            fd.ops.sum(a, [2])
        with _raises(ValueError, "add", "does not broadcast"):
            fd.ops.add(a, b)
        with _raises(ValueError, "reshape(T0)", "[4, 5]", "[3, 3]"):
            fd.ops.reshape(a, [3, 3])
        with _raises(ValueError, "at least one operand must be a TensorView"):
            fd.ops.add(1, 2)
        with _raises(TypeError, "cast", "DataType"):
            fd.ops.cast(a, np.float32)
        with _raises(TypeError, "relu", "TensorView", "float"):
            fd.ops.relu(1.0)


def test_sharding_errors_name_the_tensor():
    with FusionDefinition() as fd:
        w = fd.define_tensor([10, 4])
    with _raises(ValueError, "T0", "extent 10", "does not split evenly by 4"):
        w.outer_split(0, 4)
    w.split(0, 5)
    with _raises(ValueError, "T0", "only the outer part"):
        w.axis(1).parallelize(ParallelType.mesh_x)
    with _raises(ValueError, "T0", "axis(7)", "3 axes"):
        w.axis(7)
    w.axis(0).parallelize(ParallelType.mesh_x)
    with _raises(ValueError, "T0", "two axes parallelized on mesh_x"):
        w.axis(2).parallelize(ParallelType.mesh_x)


def test_device_mesh_errors():
    with _raises(ValueError, "no devices"):
        DeviceMesh([])
    with _raises(ValueError, "appears twice"):
        DeviceMesh([0, 1, 1])
    with _raises(ValueError, "does not hold 3 devices"):
        DeviceMesh(range(3), shape=[2, 2])
    with _raises(TypeError, "devices must be integers", "str"):
        DeviceMesh(["a"])
    with _raises(ValueError, "nested evenly", "rows of 2 and of 1"):
        DeviceMesh([[0, 1], [2]])
    with _raises(ValueError, "nested evenly"):
        DeviceMesh([[0, 1], 2])
    with _raises(TypeError, "devices must be integers", "list"):
        DeviceMesh([0, [1, 2]])
    with _raises(TypeError, "sequence of device ids", "one id"):
        DeviceMesh(np.int64(3))
    with _raises(ValueError, "shape [4] differs", "[2, 2]"):
        DeviceMesh([[0, 1], [2, 3]], shape=[4])


# ---- backends ----------------------------------------------------------------------------------

def test_unavailable_backend_names_the_available_ones():
    available = meshfuse.available_backends()
    missing = [b for b in (CommunicatorBackend.ucc, CommunicatorBackend.gloo, CommunicatorBackend.nccl,
                           CommunicatorBackend.cuda) if b not in available]
    if not missing:
        pytest.skip("every backend is built here")
    with _raises(ValueError, f"{missing[0].name} is not available", "mpi"):
        FusionDefinition(backend_type=missing[0])
    fd = FusionDefinition()
    with _raises(ValueError, f"{missing[0].name} is not available", "available: "):
        fd.set_backend(missing[0])
    assert fd.backend_type == CommunicatorBackend.auto
    with _raises(TypeError, "CommunicatorBackend", "str"):
        fd.set_backend("mpi")


def test_communication_timeout_is_a_timeout_error():
    assert issubclass(CommunicationTimeout, TimeoutError)


@pytest.mark.parametrize("timeout", [0, -5, 0.0, -0.5, float("nan"), datetime.timedelta(0),
                                     datetime.timedelta(seconds=-1)], ids=repr)
def test_timeout_must_be_positive(timeout):
    # Accepted, these made every multi-rank execute raise CommunicationTimeout ("waited 0.000 s") at once.
    with _raises(ValueError, "timeout must be a positive number of seconds", f"got {timeout!r}"):
        FusionDefinition(timeout=timeout)


def test_timeout_outside_what_the_executor_can_wait_and_non_numbers():
    with _raises(ValueError, "timeout must be at least 0.001 s", "got 0.0001"):  # it would truncate to 0 ms
        FusionDefinition(timeout=1e-4)
    for timeout in (float("inf"), 1e30):  # the longest, as MESHFUSE_TIMEOUT=inf (beyond, the clocks overflow)
        assert FusionDefinition(timeout=timeout)._params.executor.timeout == datetime.timedelta(days=100000)
    for timeout, type_name in (("5", "str"), (True, "bool"), ([1], "list")):
        with _raises(TypeError, "timeout must be a number of seconds or a datetime.timedelta", "got " + type_name):
            FusionDefinition(timeout=timeout)
    assert FusionDefinition(timeout=2.5)._params.executor.timeout == datetime.timedelta(seconds=2.5)
    assert FusionDefinition(timeout=np.int64(7))._params.executor.timeout == datetime.timedelta(seconds=7)
    minute = datetime.timedelta(minutes=1)
    assert FusionDefinition(timeout=minute)._params.executor.timeout == minute
    assert FusionDefinition()._params.executor.timeout == datetime.timedelta(minutes=10)


# ---- the raw bindings never crash on bad arguments ----------------------------------------------

def test_raw_bindings_reject_none_and_wrong_types():
    with _raises(ValueError, "operand is None"):
        _C.ops.relu(None)
    with pytest.raises(TypeError):
        _C.ops.relu("x")
    with _raises(ValueError, "expected a Fusion, got None"):
        _C.FusionExecutorCache(None)
    with _raises(ValueError, "add_input", "got None"):
        _C.Fusion().add_input(None)
    fusion = _C.Fusion()
    t = fusion.new_tensor(DataType.Float, [2])
    with _raises(ValueError, "add_output", "got None"):
        fusion.add_output(None)
    fusion.add_input(t)
    fusion.add_output(_C.ops.neg(t))
    with _raises(TypeError, "input 0", "object"):
        _C.FusionExecutorCache(fusion).execute([object()])
    with _raises(TypeError, "No constructor"):
        _C.Tensor()  # Tensors come from from_dlpack or execute only
    assert t.name == "T0"


def test_vals_keep_their_fusion_alive():
    import gc

    def build():
        fusion = _C.Fusion()
        x = fusion.new_tensor(DataType.Float, [3, 4])
        return _C.ops.relu(_C.ops.mul(x, _C.ops.constant(x, 2.0, DataType.Float))), x.axis(0)

    y, axis = build()
    gc.collect()
    # The Fusion has no other reference: these must still read valid memory.
    assert y.name == "T3" and y.shape == [3, 4] and y.dtype == DataType.Float
    assert axis.extent == 3
    assert _C.ops.sum(y, [0]).shape == [4]


def test_an_output_added_twice_is_refused():
    """execute returns one tensor per output; a repeated add_output was dropped silently, so unpacking by
    position went wrong."""
    with FusionDefinition() as fd:
        t = fd.define_tensor([2])
        u = fd.ops.exp(t)
        fd.add_output(u)
        fd.add_output(fd.ops.neg(t))
        with pytest.raises(ValueError, match=r"add_output: T\d+ is already output 0; add each tensor once"):
            fd.add_output(u)
    assert len(fd.execute([np.zeros(2, np.float32)])) == 2


def test_an_extent_error_names_the_input_where_the_definition_names_them():
    from meshfuse.models import TransformerConfig, TransformerForward, shard_inputs
    cfg = TransformerConfig(batch=2, sequence=4, heads=2, hidden=8, dropout_p=0.0)
    fwd = TransformerForward(cfg)
    rng = np.random.default_rng(0)
    arrays = {n: rng.standard_normal(s).astype(np.float32) for n, s in cfg.parameter_shapes().items()}
    arrays["x"] = rng.standard_normal((2, 4, 8)).astype(np.float32)
    args = shard_inputs(fwd, arrays, 0)
    args[3] = np.ones((25, 8), np.float32)
    with pytest.raises(ValueError, match=r"^T3 \(input 3, qkv_weight\) axis 0: expected extent 24, got 25"):
        fwd.execute(args)


@pytest.mark.parametrize("value", ["abc", "-1", "0", "5x"])
def test_a_meshfuse_timeout_that_is_not_a_positive_number_raises(monkeypatch, value):
    with FusionDefinition() as fd:
        x = fd.define_tensor([2])
        fd.add_output(fd.ops.neg(x))
    monkeypatch.setenv("MESHFUSE_TIMEOUT", value)
    with pytest.raises(ValueError, match=f"MESHFUSE_TIMEOUT={value}: expected a positive number of seconds"):
        fd.execute([np.ones(2, np.float32)])
    monkeypatch.setenv("MESHFUSE_TIMEOUT", "30s")
    np.testing.assert_array_equal(fd.execute([np.ones(2, np.float32)])[0], -np.ones(2))


def _int_scalar_plus_tensor():
    with FusionDefinition() as fd:
        x = fd.define_tensor([2], DataType.Int)
        s = fd.define_scalar(dtype=DataType.Int)
        fd.add_output(fd.ops.add(x, s))
    return fd


def test_an_int_scalar_input_takes_integers_only_and_exactly():
    """Scalars travel as doubles: a fraction was truncated and an integer beyond 2**53 rounded, silently."""
    fd = _int_scalar_plus_tensor()
    x = np.array([0, 3], np.int64)
    np.testing.assert_array_equal(fd.execute([x, 2 ** 53])[0], x + 2 ** 53)
    np.testing.assert_array_equal(fd.execute([x, np.int64(-7)])[0], x - 7)
    np.testing.assert_array_equal(fd.execute([x, 4.0])[0], x + 4)  # an integral float is an integer
    with pytest.raises(TypeError, match=r"S\d+ \(input 1\): expected an integer for scalar input of dtype Int, got 2.7"):
        fd.execute([x, 2.7])
    with pytest.raises(ValueError, match=r"the integer 9007199254740993 is beyond 2\*\*53"):
        fd.execute([x, 2 ** 53 + 1])


def test_an_integer_constant_beyond_two_to_the_53_is_refused_at_definition():
    with FusionDefinition() as fd:
        x = fd.define_tensor([2], DataType.Int)
        with pytest.raises(ValueError, match=r"add: constant: the integer 9007199254740993 is beyond 2\*\*53"):
            fd.ops.add(x, 2 ** 53 + 1)
        fd.add_output(fd.ops.add(x, -(2 ** 53)))
    np.testing.assert_array_equal(fd.execute([np.array([1, 2], np.int64)])[0], np.array([1, 2]) - 2 ** 53)


def test_random_and_variance_arguments_are_checked():
    with FusionDefinition() as fd:
        x = fd.define_tensor([4], DataType.Float)
        with pytest.raises(ValueError, match="normal: std must be non-negative, got -1"):
            fd.ops.normal(0.0, -1, [4])
        with pytest.raises(ValueError, match="uniform: minval 2.0 is greater than maxval 1.0"):
            fd.ops.uniform(2.0, 1.0, [4])
        with pytest.raises(TypeError, match="var_mean: correction must be an integer"):
            fd.ops.var_mean(x, [0], correction=0.5)
        with pytest.raises(ValueError, match="var_mean: correction must be non-negative"):
            fd.ops.var_mean(x, [0], correction=-1)
        var, _ = fd.ops.var_mean(x, [0], correction=1.0)
        fd.add_output(var)
    data = np.array([1.0, 2.0, 4.0, 7.0], np.float32)
    np.testing.assert_allclose(fd.execute([data])[0], np.var(data.astype(np.float64), ddof=1), rtol=1e-6)


def test_a_mesh_split_into_other_than_the_mesh_size_says_so():
    """Split into 2 parts on a mesh of one device: the error named an expected extent computed for the
    mesh's count, pointing the user at the shape instead of the split."""
    with FusionDefinition() as fd:
        x = fd.define_tensor([4, 3], DataType.Float)
        fd.add_output(fd.ops.relu(x))
        x.set_device_mesh(DeviceMesh([0]))
        x.outer_split(0, 2)
        x.axis(0).parallelize(ParallelType.mesh_x)
    with pytest.raises(ValueError, match=r"T0 \(input 0\) axis 0 is split into 2 parts along mesh_x but "
                                         r"DeviceMesh\{0\} has 1 devices there"):
        fd.execute([np.ones((2, 3), np.float32)])


@pytest.mark.parametrize("value", ["abc", "1.5", "42abc", "-1", "99999999999999999999"])
def test_a_meshfuse_seed_that_is_not_a_non_negative_integer_raises(monkeypatch, value):
    """It was read as whatever strtoull made of it: "abc" as 0, "1.5" as 1, silently."""
    with FusionDefinition() as fd:
        fd.add_output(fd.ops.uniform(0.0, 1.0, [4]))
    monkeypatch.setenv("MESHFUSE_SEED", value)
    with pytest.raises(ValueError, match=f"MESHFUSE_SEED={re.escape(value)}: expected a non-negative integer"):
        fd.execute([])
    monkeypatch.setenv("MESHFUSE_SEED", "42")
    first = fd.execute([])[0]
    assert first.shape == (4,) and 0.0 <= first.min() and first.max() < 1.0


def test_a_whole_axis_on_the_mesh_is_one_clear_error_everywhere():
    """x.axis(0).parallelize(mesh_x) without outer_split puts one element on each device. With 8 rows
    on a mesh of one device, execute first asked for a block of the rows (extent 8/1), then refused
    it ("split into 8 parts"), and shard_tensor said a third thing. Now all three say the rule."""
    from meshfuse.multidevice import shard_tensor
    with FusionDefinition() as fd:
        x = fd.define_tensor([8, 8])
        fd.add_output(fd.ops.neg(x))
        x.set_device_mesh(DeviceMesh([0]))
        x.axis(0).parallelize(ParallelType.mesh_x)
    rule = r"T0 axis 0 \(extent 8\) is parallelized whole on mesh_x, which puts one element on each device: its " \
           r"extent must be the 1 devices of .* to shard it in blocks, outer_split\(0, 1\) it first"
    for rows in (8, 1):
        with pytest.raises(ValueError, match=rule):
            fd.execute([np.zeros((rows, 8), np.float32)])
    with pytest.raises(ValueError, match=r"shard_tensor: T0 axis 0 \(extent 8\) is parallelized whole on mesh_x"):
        shard_tensor(np.zeros((8, 8), np.float32), x, 0)


def test_an_nvfuser_index_past_a_reductions_loop_domain_says_why():
    """nvFuser's loop domain of sum(x, [0]) keeps r{a} ([r{a}, b, c]); meshfuse's is [b, c]. A ported
    out.outer_split(1, d) is out of range here, and a ported matmul schedule that lands a second axis
    on mesh_x: both errors say it is the reduced axes (docs/nvfuser.md)."""
    hint = r"is a (sum|matmul)'s result: its loop domain has no reduced axes, unlike nvFuser's; see docs/nvfuser.md"
    with FusionDefinition() as fd:
        x = fd.define_tensor([2, 4, 6])
        total = fd.ops.sum(x, [0, 1])
        with pytest.raises(ValueError, match=r"split of axis 1 but the loop domain has 1 axes \(T\d+ " + hint):
            total.outer_split(1, 2)
        with pytest.raises(ValueError, match=r"axis\(2\) but the loop domain \[\w+\] has 1 axes \(T\d+ " + hint):
            total.axis(2)
        a, b = fd.define_tensor([4, 6]), fd.define_tensor([6, 8])
        out = fd.ops.matmul(a, b)
        out.outer_split(0, 2)
        out.axis(0).parallelize(ParallelType.mesh_x)
        out.outer_split(2, 2)
        with pytest.raises(ValueError, match=r"two axes parallelized on mesh_x \(T\d+ " + hint):
            out.axis(2).parallelize(ParallelType.mesh_x)
        plain = fd.ops.neg(x)
        with pytest.raises(ValueError, match=r"loop domain has 3 axes$"):
            plain.outer_split(3, 2)
        fd.add_output(total)
