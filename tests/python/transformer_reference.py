"""A float64 numpy transformer layer (the one meshfuse.models.transformer defines), forward and
backward by hand, with the dropout masks given: the reference for the layer's tests. Its backward
is itself checked against central finite differences of its forward (test_transformer.py)."""
import numpy as np

GELU_C = np.sqrt(2.0 / np.pi)
GELU_A = 0.044715


def layer_norm(x, w, b, eps):
    mu = x.mean(-1, keepdims=True)
    rstd = 1.0 / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + eps)
    xhat = (x - mu) * rstd
    return xhat * w + b, mu[..., 0], rstd, xhat


def layer_norm_backward(dy, xhat, rstd, w):
    dxhat = dy * w
    dx = rstd * (dxhat - dxhat.mean(-1, keepdims=True) - xhat * (dxhat * xhat).mean(-1, keepdims=True))
    return dx, (dy * xhat).sum((0, 1)), dy.sum((0, 1))


def gelu(u):
    return 0.5 * u * (1 + np.tanh(GELU_C * (u + GELU_A * u ** 3)))


def gelu_grad(u):
    t = np.tanh(GELU_C * (u + GELU_A * u ** 3))
    return 0.5 * (1 + t) + 0.5 * u * (1 - t * t) * GELU_C * (1 + 3 * GELU_A * u * u)


def attention(q, k, v, causal, z=None):
    """softmax(q k^T / sqrt(d)) v over [b, h, s, d], the softmax dropped and rescaled by `z` (the
    keep mask over 1 - p) when given; also the softmax (before dropout) and log-sum-exp."""
    scores = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    if causal:
        s_q, s_k = scores.shape[-2:]
        scores = np.where(np.tril(np.ones((s_q, s_k), dtype=bool), s_k - s_q), scores, -np.inf)
    m = scores.max(-1, keepdims=True)
    p = np.exp(scores - m)
    denom = p.sum(-1, keepdims=True)
    dropped = p / denom if z is None else p / denom * z
    return dropped @ v, p / denom, (m + np.log(denom))[..., 0]


def attention_backward(dout, q, k, v, p, z=None):
    z = 1.0 if z is None else z
    dv = np.swapaxes(p * z, -1, -2) @ dout
    dp = (dout @ np.swapaxes(v, -1, -2)) * z
    ds = p * (dp - (dp * p).sum(-1, keepdims=True)) / np.sqrt(q.shape[-1])
    return ds @ k, np.swapaxes(ds, -1, -2) @ q, dv


def _heads(t, h):
    b, s, e = t.shape
    return t.reshape(b, s, h, e // h).transpose(0, 2, 1, 3)


def _split_qkv(qkv, h):
    b, s, e3 = qkv.shape
    t = qkv.reshape(b, s, h, e3 // h)
    dh = e3 // h // 3
    return [t[..., i * dh:(i + 1) * dh].transpose(0, 2, 1, 3) for i in range(3)]


def _attention_z(cfg, attn_keep):
    """The attention dropout's keep mask over 1 - p (None without attention dropout)."""
    return None if attn_keep is None else attn_keep / (1.0 - cfg.sdpa_dropout_p)


def forward(x, p, mask1, mask2, cfg, attn_keep=None):
    """Every intermediate the backward needs, and `out`; `attn_keep` is the attention dropout's
    keep mask [b, h, s, s] (bool) when the layer drops inside attention."""
    keep = 1.0 - cfg.dropout_p
    r = {}
    ln0, r["ln0_mean"], r["ln0_rstd"], r["xhat0"] = layer_norm(x, p["ln0_weight"], p["ln0_bias"], cfg.eps)
    r["ln0"] = ln0
    r["qkv"] = ln0 @ p["qkv_weight"].T + p["qkv_bias"]
    q, k, v = _split_qkv(r["qkv"], cfg.heads)
    r["sdpa_out"], r["probs"], r["sdpa_lse"] = attention(q, k, v, cfg.causal, _attention_z(cfg, attn_keep))
    b, h, s, dh = r["sdpa_out"].shape
    r["merged"] = r["sdpa_out"].transpose(0, 2, 1, 3).reshape(b, s, h * dh)
    r["attn_out"] = r["merged"] @ p["out_weight"].T + p["out_bias"]
    r["h1"] = x + r["attn_out"] * mask1 / keep
    ln1, r["ln1_mean"], r["ln1_rstd"], r["xhat1"] = layer_norm(r["h1"], p["ln1_weight"], p["ln1_bias"], cfg.eps)
    r["ln1"] = ln1
    r["fc1_out"] = ln1 @ p["fc1_weight"].T + p["fc1_bias"]
    r["gelu"] = r["gelu_out"] = gelu(r["fc1_out"])
    r["fc2_out"] = r["gelu"] @ p["fc2_weight"].T + p["fc2_bias"]
    r["out"] = r["h1"] + r["fc2_out"] * mask2 / keep
    return r


def _linear_backward(dy, x, w):
    b, s, n = dy.shape
    dy2, x2 = dy.reshape(b * s, n), x.reshape(b * s, -1)
    return (dy2 @ w).reshape(b, s, -1), dy2.T @ x2, dy2.sum(0)


def backward(dout, x, p, mask1, mask2, cfg, attn_keep=None):
    """Gradients of sum(out * dout): grad_x and grad_<parameter>."""
    keep = 1.0 - cfg.dropout_p
    r = forward(x, p, mask1, mask2, cfg, attn_keep)
    g = {}
    dfc2 = dout * mask2 / keep
    dgelu, g["grad_fc2_weight"], g["grad_fc2_bias"] = _linear_backward(dfc2, r["gelu"], p["fc2_weight"])
    dfc1 = dgelu * gelu_grad(r["fc1_out"])
    dln1, g["grad_fc1_weight"], g["grad_fc1_bias"] = _linear_backward(dfc1, r["ln1"], p["fc1_weight"])
    dh1_ln, g["grad_ln1_weight"], g["grad_ln1_bias"] = layer_norm_backward(dln1, r["xhat1"], r["ln1_rstd"],
                                                                           p["ln1_weight"])
    dh1 = dout + dh1_ln
    dattn = dh1 * mask1 / keep
    dmerged, g["grad_out_weight"], g["grad_out_bias"] = _linear_backward(dattn, r["merged"], p["out_weight"])
    q, k, v = _split_qkv(r["qkv"], cfg.heads)
    dq, dk, dv = attention_backward(_heads(dmerged, cfg.heads), q, k, v, r["probs"], _attention_z(cfg, attn_keep))
    b, h, s, dh = dq.shape
    dqkv = np.concatenate([t.transpose(0, 2, 1, 3) for t in (dq, dk, dv)], axis=3).reshape(b, s, 3 * h * dh)
    dln0, g["grad_qkv_weight"], g["grad_qkv_bias"] = _linear_backward(dqkv, r["ln0"], p["qkv_weight"])
    dx_ln, g["grad_ln0_weight"], g["grad_ln0_bias"] = layer_norm_backward(dln0, r["xhat0"], r["ln0_rstd"],
                                                                          p["ln0_weight"])
    g["grad_x"] = dh1 + dx_ln
    return g
