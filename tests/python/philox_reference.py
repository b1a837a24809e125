"""Philox 4x32-10 in numpy, written from the paper (Salmon et al., SC'11) and independent of meshfuse:
the numbers fd.ops.uniform / fd.ops.normal and the attention dropout mask must draw.

The stream of a draw with (seed, offset): counter c (counter words {c, offset}, key {seed}) gives the
stream's words 4c .. 4c + 3. Element g of the global tensor takes W words, g * W .. g * W + W - 1:
W = 1 for a Float-precision uniform (and the attention mask), 2 for a Double uniform and a Float
normal, 4 for a Double normal."""
import numpy as np

_MASK = np.uint64(0xFFFFFFFF)
_MUL = (np.uint64(0xD2511F53), np.uint64(0xCD9E8D57))
_WEYL = (0x9E3779B9, 0xBB67AE85)


def philox4x32(counter, offset, seed):
    """The four words of each counter (uint64 array) as a [..., 4] uint32 array."""
    counter = np.asarray(counter, dtype=np.uint64)
    c0, c1 = counter & _MASK, counter >> np.uint64(32)
    c2 = np.full_like(counter, int(offset) & 0xFFFFFFFF)
    c3 = np.full_like(counter, int(offset) >> 32)
    k0, k1 = int(seed) & 0xFFFFFFFF, int(seed) >> 32
    for _ in range(10):
        p0, p1 = _MUL[0] * c0, _MUL[1] * c2  # 32 x 32 -> 64-bit products
        n0 = (p1 >> np.uint64(32)) ^ c1 ^ np.uint64(k0)
        n2 = (p0 >> np.uint64(32)) ^ c3 ^ np.uint64(k1)
        c0, c1, c2, c3 = n0, p1 & _MASK, n2, p0 & _MASK
        k0, k1 = (k0 + _WEYL[0]) & 0xFFFFFFFF, (k1 + _WEYL[1]) & 0xFFFFFFFF
    return np.stack([c0, c1, c2, c3], axis=-1).astype(np.uint32)


def words_per_element(normal, wide):
    return (2 if normal else 1) * (2 if wide else 1)


def element_words(g, w, offset, seed):
    """The W words of elements g (any shape) as [..., W]: stream words g * W + i, word k of the
    stream being word k % 4 of counter k // 4."""
    k = np.asarray(g, dtype=np.uint64)[..., None] * np.uint64(w) + np.arange(w, dtype=np.uint64)
    words = philox4x32(k // np.uint64(4), offset, seed)
    return np.take_along_axis(words, (k % np.uint64(4)).astype(np.int64)[..., None], axis=-1)[..., 0]


def _unit_float(w):
    return (w >> np.uint32(8)).astype(np.float32) * np.float32(2.0 ** -24)


def _unit_double(hi, lo):
    bits = (hi.astype(np.uint64) << np.uint64(32)) | lo.astype(np.uint64)
    return (bits >> np.uint64(11)).astype(np.float64) * 2.0 ** -53


def global_indices(shape, global_shape=None, offsets=None):
    """Row-major indices in `global_shape` of the block of `shape` at `offsets` (default: all of it)."""
    global_shape = shape if global_shape is None else global_shape
    offsets = [0] * len(shape) if offsets is None else offsets
    axes = np.meshgrid(*[np.arange(o, o + n, dtype=np.uint64) for o, n in zip(offsets, shape)], indexing="ij")
    g = np.zeros(shape, dtype=np.uint64)
    for a, extent in zip(axes, global_shape):
        g = g * np.uint64(extent) + a
    return g


def uniform(shape, lo, hi, wide, seed, offset, global_shape=None, offsets=None):
    """fd.ops.uniform's values (Float precision: float32 step by step; wide: Double, 53 bits)."""
    g = global_indices(shape, global_shape, offsets)
    w = element_words(g, words_per_element(False, wide), offset, seed)
    if wide:
        return lo + (hi - lo) * _unit_double(w[..., 0], w[..., 1])
    lo32, hi32 = np.float32(lo), np.float32(hi)
    return lo32 + (hi32 - lo32) * _unit_float(w[..., 0])


def normal(shape, mean, std, wide, seed, offset, global_shape=None, offsets=None):
    """fd.ops.normal's values: Box-Muller's cosine half on the element's two uniforms (to rounding:
    numpy's log and cos are not the C library's)."""
    g = global_indices(shape, global_shape, offsets)
    w = element_words(g, words_per_element(True, wide), offset, seed)
    if wide:
        u1 = _unit_double(w[..., 0], w[..., 1]) + 2.0 ** -53
        u2 = _unit_double(w[..., 2], w[..., 3])
        return mean + std * np.sqrt(-2.0 * np.log(u1)) * np.cos(2 * np.pi * u2)
    u1 = _unit_float(w[..., 0]) + np.float32(2.0 ** -24)
    u2 = _unit_float(w[..., 1])
    z = np.sqrt(np.float32(-2.0) * np.log(u1)) * np.cos(np.float32(2 * np.pi) * u2)
    return np.float32(mean) + np.float32(std) * z


def dropout_keep(shape, seed, offset, p, global_shape=None, offsets=None):
    """The attention dropout mask: kept where the element's Float uniform is >= p."""
    return uniform(shape, 0.0, 1.0, False, seed, offset, global_shape, offsets) >= np.float32(p)
