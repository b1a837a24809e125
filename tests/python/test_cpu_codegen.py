"""CPU codegen (MESHFUSE_CPU_CODEGEN): a pointwise segment compiled by the host's C++ compiler computes
what the interpreter computes, draws the same dropout mask, and a bad setting is a clear error."""
import math
import os

import numpy as np
import pytest

from meshfuse import DataType, FusionDefinition

C, A = math.sqrt(2.0 / math.pi), 0.044715


def _dropout_gelu_backward(shape, p):
    """(dx, keep) with dx = dropout(dy) * gelu'(u): a uniform draw, a comparison, a cast and 17 ops."""
    with FusionDefinition() as fd:
        u, dy = fd.define_tensor(list(shape)), fd.define_tensor(list(shape))
        seed, offset = fd.define_scalar(dtype=DataType.Int), fd.define_scalar(dtype=DataType.Int)
        ops = fd.ops
        keep = ops.ge(ops.uniform(0.0, 1.0, list(shape), DataType.Float, rng_seed=seed, rng_offset=offset), p)
        dropped = ops.mul(ops.mul(dy, ops.cast(keep, DataType.Float)), 1.0 / (1.0 - p))
        t = ops.tanh(ops.mul(ops.add(u, ops.mul(ops.mul(ops.mul(u, u), u), A)), C))
        left = ops.mul(ops.add(t, 1.0), 0.5)
        right = ops.mul(ops.mul(ops.mul(u, 0.5), ops.sub(1.0, ops.mul(t, t))),
                        ops.mul(ops.add(ops.mul(ops.mul(u, u), 3 * A), 1.0), C))
        fd.add_output(ops.mul(dropped, ops.add(left, right)))
        fd.add_output(keep)
    return fd


@pytest.fixture
def codegen_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MESHFUSE_CACHE_DIR", str(tmp_path))
    return tmp_path / "cpu-kernels"


def test_compiled_segment_matches_the_interpreter_and_float64(codegen_cache, monkeypatch):
    shape, p = (67, 301), 0.25  # odd sizes: partial tiles and a tail the vector loop leaves
    rng = np.random.default_rng(3)
    u = rng.uniform(-5, 5, shape).astype(np.float32)
    dy = rng.standard_normal(shape).astype(np.float32)
    fd = _dropout_gelu_backward(shape, p)
    results = {}
    for mode in ("off", "always"):
        monkeypatch.setenv("MESHFUSE_CPU_CODEGEN", mode)
        results[mode] = [np.asarray(t) for t in fd.execute([u, dy, 11, 5])]
    assert len(list(codegen_cache.glob("*.so"))) == 1, "always did not compile the segment"
    (dx_off, keep_off), (dx_jit, keep_jit) = results["off"], results["always"]
    np.testing.assert_array_equal(keep_jit, keep_off)  # the same Philox draws
    assert 0.2 < 1 - keep_jit.mean() < 0.3
    # The compiler may contract a multiply and an add into an FMA: rounding-level differences, which
    # 1 - t * t (t near +-1) turns into 1e-5 of the gradient's O(1) scale.
    np.testing.assert_allclose(dx_jit, dx_off, rtol=1e-5, atol=2e-5)
    u64 = u.astype(np.float64)
    t = np.tanh(C * (u64 + A * u64**3))
    grad = 0.5 * (1 + t) + 0.5 * u64 * (1 - t * t) * C * (1 + 3 * A * u64**2)
    want = dy.astype(np.float64) * keep_jit / (1 - p) * grad
    np.testing.assert_allclose(dx_jit, want, rtol=1e-5, atol=1e-5)


def test_a_scalar_input_is_a_parameter_of_one_compiled_kernel(codegen_cache, monkeypatch):
    """p - g * lr with lr a scalar input: its value was a literal in the generated loop, so every new
    learning rate compiled and loaded another kernel (120 ms and five mappings a value, never
    unloaded). It is the kernel's parameter now: one kernel for every value, and the interpreter's
    numbers (the scalar rounded to float once). A constant stays a literal."""
    monkeypatch.setenv("MESHFUSE_CPU_CODEGEN", "always")
    with FusionDefinition() as fd:
        p, g = fd.define_tensor([33, 65]), fd.define_tensor([33, 65])
        lr, fill = fd.define_scalar(dtype=DataType.Double), fd.define_scalar(dtype=DataType.Double)
        fd.add_output(fd.ops.sub(p, fd.ops.mul(g, lr)))
        fd.add_output(fd.ops.add(fd.ops.full([33, 65], fill, DataType.Float), p))
    rng = np.random.default_rng(8)
    x, y = rng.standard_normal((33, 65)).astype(np.float32), rng.standard_normal((33, 65)).astype(np.float32)
    for step in range(5):
        rate, value = 0.1 * (step + 1) + 1e-9, -2.0 + step
        out, filled = fd.execute([x, y, rate, value])
        # The compiler may contract the multiply and the subtraction into an FMA: an ulp or so.
        np.testing.assert_allclose(out, x - y * np.float32(rate), rtol=1e-6, atol=1e-6)
        np.testing.assert_array_equal(filled, np.float32(value) + x)
    assert len(list(codegen_cache.glob("*.so"))) == 1, sorted(codegen_cache.glob("*.so"))


def test_a_scalar_input_of_a_normalization_is_a_parameter_too(codegen_cache, monkeypatch):
    """The same for a normalization segment's compiled stages: (x - mean) * rsqrt(var + eps) * gain
    with eps and gain scalar inputs compiles its stages once for every value."""
    monkeypatch.setenv("MESHFUSE_CPU_CODEGEN", "always")
    with FusionDefinition() as fd:
        x = fd.define_tensor([64, 256])
        eps, gain = fd.define_scalar(dtype=DataType.Double), fd.define_scalar(dtype=DataType.Double)
        var, mean = fd.ops.var_mean(x, [1], keepdim=True)
        fd.add_output(fd.ops.mul(fd.ops.mul(fd.ops.sub(x, mean), fd.ops.rsqrt(fd.ops.add(var, eps))), gain))
    data = np.random.default_rng(9).standard_normal((64, 256)).astype(np.float32)
    built = None
    for step in range(4):
        e, g = 10.0 ** -(step + 2), 1.0 + step
        (out,) = fd.execute([data, e, g])
        x64 = data.astype(np.float64)
        want = (x64 - x64.mean(1, keepdims=True)) / np.sqrt(x64.var(1, keepdims=True) + e) * g
        np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
        kernels = sorted(codegen_cache.glob("*.so"))
        assert built is None or kernels == built, "a new value compiled a new kernel"
        built = kernels
    assert built, "always compiled nothing"


def test_auto_leaves_small_segments_interpreted(codegen_cache, monkeypatch):
    monkeypatch.setenv("MESHFUSE_CPU_CODEGEN", "auto")
    fd = _dropout_gelu_backward((8, 16), 0.1)
    x = np.ones((8, 16), np.float32)
    fd.execute([x, x, 1, 2])
    assert not codegen_cache.exists() or not list(codegen_cache.glob("*.so"))


def test_an_unknown_codegen_mode_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("MESHFUSE_CPU_CODEGEN", "sometimes")
    fd = _dropout_gelu_backward((4, 4), 0.1)
    x = np.ones((4, 4), np.float32)
    with pytest.raises(ValueError, match="MESHFUSE_CPU_CODEGEN must be auto, always or off"):
        fd.execute([x, x, 1, 2])
    monkeypatch.delenv("MESHFUSE_CPU_CODEGEN")
    assert np.asarray(fd.execute([x, x, 1, 2])[0]).shape == (4, 4)  # and nothing is left broken


@pytest.mark.skipif(os.environ.get("MESHFUSE_CXX") is not None, reason="the test sets MESHFUSE_CXX itself")
def test_a_missing_compiler_falls_back_to_the_interpreter(codegen_cache, tmp_path):
    # In a child process: a missing compiler is remembered for the rest of the process.
    import subprocess
    import sys
    code = ("import numpy as np, test_cpu_codegen as t; fd = t._dropout_gelu_backward((64, 64), 0.1); "
            "x = np.full((64, 64), 0.5, np.float32); dx, keep = fd.execute([x, x, 1, 2]); "
            "assert np.isfinite(np.asarray(dx)).all(); print('ok')")
    env = dict(os.environ, MESHFUSE_CPU_CODEGEN="always", MESHFUSE_CXX=str(tmp_path / "no-such-compiler"),
               PYTHONPATH=os.pathsep.join([os.path.dirname(__file__)] + sys.path))
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "ok"
    assert "CPU codegen unavailable" in run.stderr and "no-such-compiler" in run.stderr
