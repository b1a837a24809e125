"""float64 numpy references for fused attention (sdpfa_fwd / sdpfa_bwd) and the dropout mask that a
(philox_seed, philox_offset) pair implies (numpy Philox, philox_reference.py), shared by the single-
and multi-process tests."""
import numpy as np

import philox_reference


def attention_reference(q, k, v, causal=False, scale=None, keep=None, p=0.0):
    """(out, log_sumexp, probs) in float64; `keep` is the dropout mask [b, h, s_q, s_kv] (bool)."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    scale = 1.0 / np.sqrt(q.shape[-1]) if scale is None else scale
    s = q @ np.swapaxes(k, -1, -2) * scale
    if causal:
        sq, skv = s.shape[-2:]
        s = np.where(np.arange(skv)[None, :] <= np.arange(sq)[:, None], s, -np.inf)
    m = s.max(-1, keepdims=True)
    e = np.exp(s - m)
    l = e.sum(-1, keepdims=True)
    probs = e / l
    dropped = probs if keep is None else probs * keep / (1.0 - p)
    return dropped @ v, (m + np.log(l))[..., 0], probs


def attention_grad_reference(q, k, v, grad_out, causal=False, scale=None, keep=None, p=0.0):
    """(grad_q, grad_k, grad_v) in float64 through the explicit [s_q, s_kv] matrices."""
    q, k, v, go = (np.asarray(x, dtype=np.float64) for x in (q, k, v, grad_out))
    scale = 1.0 / np.sqrt(q.shape[-1]) if scale is None else scale
    _, _, probs = attention_reference(q, k, v, causal, scale)
    z = np.ones_like(probs) if keep is None else keep / (1.0 - p)
    grad_v = np.swapaxes(probs * z, -1, -2) @ go
    dp = (go @ np.swapaxes(v, -1, -2)) * z
    ds = probs * (dp - (dp * probs).sum(-1, keepdims=True))
    return ds @ k * scale, np.swapaxes(ds, -1, -2) @ q * scale, grad_v


def dropout_keep(shape, seed, offset, p):
    """The mask sdpfa_fwd's (philox_seed, philox_offset) imply: the Float-precision uniform of each
    element of the global [b, h, s_q, s_kv] (word g % 4 of Philox counter g / 4), >= p. Drawn by the
    numpy Philox of philox_reference.py, independent of meshfuse."""
    return philox_reference.dropout_keep(list(shape), int(seed), int(offset), p)
