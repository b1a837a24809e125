"""Widening casts of a segment's inputs are recomputed where they are read instead of being written
out (host_ir/cast_forwarding.h): the host program no longer carries the wide copy from one segment
to another, and the results still match float64 numpy."""
import re

import numpy as np
import pytest
from host_ir_lines import launches

from meshfuse import DataType, FusionDefinition

SEGMENT = re.compile(r"LaunchSegment (\w+)\(([^)]*)\) -> \(([^)]*)\) \{([^}]*)\}")


def segments(fd):
    """(kind, inputs, outputs, computed values) of each launched segment, in order."""
    out = []
    for m in SEGMENT.finditer(fd.host_ir()):
        split = (lambda text: [v.strip() for v in text.split(",") if v.strip()])
        computed = [item.split("=")[0] for item in m.group(4).split()]
        out.append((m.group(1), split(m.group(2)), split(m.group(3)), computed))
    return out


def writers(fd, name):
    return [s for s in segments(fd) if name in s[2]]


def computing(fd, name):
    return [s for s in segments(fd) if name in s[3]]


@pytest.fixture
def rng():
    return np.random.default_rng(16)


@pytest.mark.parametrize("source,target,forwarded", [(np.float16, np.float32, True), (np.float32, np.float16, False)])
def test_a_widening_cast_read_after_a_matmul_is_recomputed_there(rng, source, target, forwarded):
    dtypes = {np.float16: DataType.Half, np.float32: DataType.Float}
    x = rng.standard_normal((32, 24)).astype(source)
    w = rng.standard_normal((24, 24)).astype(np.float32)
    with FusionDefinition() as fd:
        tx, tw = fd.define_tensor([32, 24], dtypes[source]), fd.define_tensor([24, 24])
        xc = fd.ops.cast(tx, dtypes[target])
        z = fd.ops.matmul(fd.ops.cast(fd.ops.mul(xc, 2.0), DataType.Float), tw)
        fd.add_output(fd.ops.add(z, fd.ops.cast(fd.ops.mul(xc, xc), DataType.Float)))
    (out,) = fd.execute([x, w])
    xc64 = x.astype(target).astype(np.float64)
    rounding = 1e-5 if target == np.float32 else 4e-3  # x * x rounded to half when the cast narrows
    np.testing.assert_allclose(out, (2 * xc64) @ w + xc64 * xc64, rtol=rounding, atol=rounding)
    if forwarded:  # no segment writes the fp32 copy of x: both pointwise segments cast x themselves
        assert writers(fd, xc.name) == []
        assert [s[0] for s in computing(fd, xc.name)] == ["pointwise", "pointwise"]
        assert all(tx.name in s[1] for s in computing(fd, xc.name))
    else:  # half the bytes of x: cheaper to read back than to recompute
        assert len(writers(fd, xc.name)) == 1 and len(computing(fd, xc.name)) == 1


def test_a_cast_alone_in_its_segment_leaves_no_launch(rng):
    x = rng.standard_normal((16, 8)).astype(np.float16)
    a, w = rng.standard_normal((16, 8)).astype(np.float32), rng.standard_normal((8, 8)).astype(np.float32)
    with FusionDefinition() as fd:
        tx, ta, tw = fd.define_tensor([16, 8], DataType.Half), fd.define_tensor([16, 8]), fd.define_tensor([8, 8])
        xf = fd.ops.cast(tx, DataType.Float)  # lowered ahead of the matmul, read only after it
        z = fd.ops.matmul(ta, tw)
        fd.add_output(fd.ops.sub(z, xf))
    (out,) = fd.execute([x, a, w])
    np.testing.assert_allclose(out, a.astype(np.float64) @ w - x, rtol=1e-5, atol=1e-5)
    assert launches(fd) == ["matmul", "pointwise"]
    assert set(computing(fd, xf.name)[0][1]) == {tx.name, z.name}


def test_a_normalization_segment_takes_the_cast(rng):
    x = rng.standard_normal((4, 5, 64)).astype(np.float16)
    a, w = rng.standard_normal((20, 64)).astype(np.float32), rng.standard_normal((64, 64)).astype(np.float32)
    with FusionDefinition() as fd:
        tx = fd.define_tensor([4, 5, 64], DataType.Half)
        ta, tw = fd.define_tensor([20, 64]), fd.define_tensor([64, 64])
        xf = fd.ops.cast(tx, DataType.Float)
        fd.add_output(fd.ops.mul(xf, 3.0))
        z = fd.ops.reshape(fd.ops.matmul(ta, tw), [4, 5, 64])
        h = fd.ops.add(z, xf)  # a residual: LayerNorm's input
        var, mean = fd.ops.var_mean(h, [2], correction=0, keepdim=False)
        centred = fd.ops.sub(h, fd.ops.broadcast_in_dim(mean, [4, 5, 64], [0, 1]))
        rstd = fd.ops.rsqrt(fd.ops.add(fd.ops.broadcast_in_dim(var, [4, 5, 64], [0, 1]), 1e-5))
        fd.add_output(fd.ops.mul(centred, rstd))
    tripled, normed = fd.execute([x, a, w])
    h64 = (a.astype(np.float64) @ w).reshape(4, 5, 64) + x
    ref = (h64 - h64.mean(-1, keepdims=True)) / np.sqrt(h64.var(-1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(tripled, 3.0 * x.astype(np.float64), rtol=1e-6)
    np.testing.assert_allclose(normed, ref, rtol=1e-4, atol=1e-4)
    assert writers(fd, xf.name) == []
    assert "normalization" in [s[0] for s in computing(fd, xf.name)]


def test_a_cast_a_matmul_reads_is_written_out(rng):
    x = rng.standard_normal((8, 8)).astype(np.float16)
    w = rng.standard_normal((8, 8)).astype(np.float32)
    with FusionDefinition() as fd:
        tx, tw = fd.define_tensor([8, 8], DataType.Half), fd.define_tensor([8, 8])
        xf = fd.ops.cast(tx, DataType.Float)
        z = fd.ops.matmul(fd.ops.mul(xf, 2.0), tw)
        fd.add_output(fd.ops.matmul(xf, z))  # a matmul cannot take a cast: xf is materialized
    (out,) = fd.execute([x, w])
    x64 = x.astype(np.float64)
    np.testing.assert_allclose(out, x64 @ ((2 * x64) @ w), rtol=1e-4, atol=1e-4)
    assert len(writers(fd, xf.name)) == 1
