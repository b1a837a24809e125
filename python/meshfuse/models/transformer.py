"""The GPT-3 transformer layer (pre-LayerNorm, causal attention, tanh GELU, dropout) as two meshfuse
programs, forward and backward, written as nvFuser's multi-device transformer tests write them:
var_mean + rsqrt LayerNorm, linear with bias, q/k/v by reshape and slice, sdpfa_fwd / sdpfa_bwd,
uniform dropout masks. Schedules shard them the Megatron ways:

- "tp": tensor parallel. QKV and MLP-up weights column-parallel, attention-out and MLP-down weights
  row-parallel: one allreduce after attention and one after the MLP (forward), and one after each
  of the two input-gradient GEMMs that contract the sharded features (backward).
- "sp": sequence parallel. As TP, with activations sharded on the sequence axis between the
  blocks: an allgather before each column-parallel linear, a reduce-scatter after each
  row-parallel one.
- "dp_tp": a [dp, tp] mesh, batch sharded over dp (mesh_y) and TP over tp (mesh_x): the forward is
  TP's; the backward adds the data-parallel reduction of the weight gradients.

Only inputs are annotated (and, for SP, the results of the row-parallel linears and the dropout
masks, which fix where the sequence shards live); everything else follows by propagation.

    cfg = TransformerConfig(batch=1, sequence=2048, heads=96, hidden=12288, dtype=DataType.BFloat16)
    fwd = TransformerForward(cfg, mesh_for("tp", world_size), "tp")
    outs = fwd.execute(shard_inputs(fwd, global_arrays, rank))   # global_arrays: {name: array}

(docs/transformer.md has the whole program.)
"""
from dataclasses import dataclass

from .._C import DataType, ParallelType
from ..fusion_definition import FusionDefinition

SCHEDULES = ("none", "tp", "sp", "dp_tp")

# The forward's inputs, in order, and the shapes they have in terms of (b, s, e).
PARAMETERS = ("ln0_weight", "ln0_bias", "qkv_weight", "qkv_bias", "out_weight", "out_bias", "ln1_weight", "ln1_bias",
              "fc1_weight", "fc1_bias", "fc2_weight", "fc2_bias")

# Forward outputs, in order: what the backward needs, then the layer's output.
FORWARD_OUTPUTS = ("ln0_mean", "ln0_rstd", "qkv", "sdpa_out", "sdpa_lse", "sdpa_seed", "sdpa_offset", "attn_out",
                   "attn_dropout_mask", "ln1_mean", "ln1_rstd", "fc1_out", "gelu_out", "mlp_dropout_mask", "out")

# Backward outputs, in order: the input's gradient, then one per parameter.
BACKWARD_OUTPUTS = ("grad_x",) + tuple("grad_" + p for p in PARAMETERS)

GELU_C = 0.7978845608028654  # sqrt(2 / pi)
GELU_A = 0.044715


@dataclass(frozen=True)
class TransformerConfig:
    batch: int
    sequence: int
    heads: int
    hidden: int
    dtype: DataType = DataType.Float
    dropout_p: float = 0.1
    eps: float = 1e-5
    causal: bool = True
    # Dropout inside attention (sdpfa's); None: dropout_p. Tests set 0 to compare with a reference
    # that has no access to the attention kernel's mask.
    attention_dropout_p: float = None

    @property
    def sdpa_dropout_p(self):
        return self.dropout_p if self.attention_dropout_p is None else self.attention_dropout_p

    @property
    def head_dim(self):
        return self.hidden // self.heads

    def parameter_shapes(self):
        e = self.hidden
        return {"ln0_weight": [e], "ln0_bias": [e], "qkv_weight": [3 * e, e], "qkv_bias": [3 * e],
                "out_weight": [e, e], "out_bias": [e], "ln1_weight": [e], "ln1_bias": [e],
                "fc1_weight": [4 * e, e], "fc1_bias": [4 * e], "fc2_weight": [e, 4 * e], "fc2_bias": [e]}

    def check(self):
        for name in ("batch", "sequence", "heads", "hidden"):
            value = getattr(self, name)
            if isinstance(value, bool) or not hasattr(value, "__index__"):
                raise TypeError(f"TransformerConfig.{name} must be an integer, got {type(value).__name__} {value!r}")
            if value < 1:
                raise ValueError(f"TransformerConfig.{name} must be positive, got {value}")
        if self.hidden % self.heads:
            raise ValueError(f"hidden {self.hidden} is not divisible by heads {self.heads}")
        if not 0 <= self.dropout_p < 1:
            raise ValueError(f"dropout_p must be in [0, 1), got {self.dropout_p}")
        if not 0 <= self.sdpa_dropout_p < 1:
            raise ValueError(f"attention_dropout_p must be in [0, 1), got {self.attention_dropout_p}")


def _to_float(fd, t):
    """t in the layer's compute dtype: Float, or Double for a Double layer (and its Bool masks)."""
    compute = fd.compute_dtype
    return t if t.dtype == compute else fd.ops.cast(t, compute)


def _compute_dtype(cfg):
    return DataType.Double if cfg.dtype == DataType.Double else DataType.Float


def _to_dtype(fd, t, dtype):
    return t if t.dtype == dtype else fd.ops.cast(t, dtype)


def _layer_norm(fd, x, weight, bias, cfg):
    """LayerNorm over the last axis in fp32: (y, mean [b, s], rstd [b, s, 1])."""
    b, s = cfg.batch, cfg.sequence
    var, mean = fd.ops.var_mean(x, [2], correction=0, keepdim=False)
    rstd = fd.ops.rsqrt(fd.ops.add(fd.ops.broadcast_in_dim(var, [b, s, 1], [0, 1]), cfg.eps))
    return _normalized(fd, x, mean, rstd, weight, bias, cfg), mean, rstd


def _split_heads(fd, qkv, cfg):
    """[b, s, 3e] -> q, k, v of [b, h, s, dh]. Reshape before slicing: the sharded features (a
    block of whole heads per rank) become the head axis, and the slices cut an unsharded axis."""
    b, s, h, dh = cfg.batch, cfg.sequence, cfg.heads, cfg.head_dim
    t = fd.ops.reshape(qkv, [b, s, h, 3 * dh])
    parts = [fd.ops.slice(t, [0, 0, 0, i * dh], [b, s, h, (i + 1) * dh]) for i in range(3)]
    return [fd.ops.permute(p, [0, 2, 1, 3]) for p in parts]


def _merge_heads(fd, t, cfg):
    """[b, h, s, dh] -> [b, s, e]."""
    return fd.ops.reshape(fd.ops.permute(t, [0, 2, 1, 3]), [cfg.batch, cfg.sequence, cfg.hidden])


def _dropout_mask(fd, cfg):
    keep = 1.0 - cfg.dropout_p
    u = fd.ops.uniform(0.0, 1.0, [cfg.batch, cfg.sequence, cfg.hidden], dtype=DataType.Float)
    return fd.ops.lt(u, keep)


def _apply_dropout(fd, x, mask, cfg):
    return fd.ops.mul(fd.ops.mul(x, fd.ops.cast(mask, DataType.Float)), 1.0 / (1.0 - cfg.dropout_p))


def _gelu_tanh(fd, u):
    inner = fd.ops.mul(GELU_C, fd.ops.add(u, fd.ops.mul(GELU_A, fd.ops.mul(fd.ops.mul(u, u), u))))
    return fd.ops.mul(fd.ops.mul(0.5, u), fd.ops.add(1.0, fd.ops.tanh(inner)))


def _gelu_tanh_grad(fd, u):
    """d gelu_tanh(u) / du."""
    u2 = fd.ops.mul(u, u)
    t = fd.ops.tanh(fd.ops.mul(GELU_C, fd.ops.add(u, fd.ops.mul(GELU_A, fd.ops.mul(u2, u)))))
    dinner = fd.ops.mul(GELU_C, fd.ops.add(1.0, fd.ops.mul(3 * GELU_A, u2)))
    return fd.ops.add(fd.ops.mul(0.5, fd.ops.add(1.0, t)),
                      fd.ops.mul(fd.ops.mul(fd.ops.mul(0.5, u), fd.ops.sub(1.0, fd.ops.mul(t, t))), dinner))


def define_forward(fd, cfg):
    """Appends the layer's forward to `fd`; returns {name: TensorView} of inputs and outputs."""
    cfg.check()
    fd.compute_dtype = _compute_dtype(cfg)
    b, s, e = cfg.batch, cfg.sequence, cfg.hidden
    tv = {"x": fd.define_tensor([b, s, e], cfg.dtype)}
    for name, shape in cfg.parameter_shapes().items():
        tv[name] = fd.define_tensor(shape, cfg.dtype)
    x32 = _to_float(fd, tv["x"])
    ln0, tv["ln0_mean"], tv["ln0_rstd"] = _layer_norm(fd, x32, tv["ln0_weight"], tv["ln0_bias"], cfg)
    tv["qkv"] = fd.ops.linear(_to_dtype(fd, ln0, cfg.dtype), tv["qkv_weight"], tv["qkv_bias"])
    q, k, v = _split_heads(fd, tv["qkv"], cfg)
    (tv["sdpa_out"], tv["sdpa_lse"], tv["sdpa_seed"],
     tv["sdpa_offset"]) = fd.ops.sdpfa_fwd(q, k, v, dropout_p=cfg.sdpa_dropout_p, is_causal=cfg.causal)
    tv["attn_out"] = fd.ops.linear(_merge_heads(fd, tv["sdpa_out"], cfg), tv["out_weight"], tv["out_bias"])
    tv["attn_dropout_mask"] = _dropout_mask(fd, cfg)
    h1 = fd.ops.add(x32, _apply_dropout(fd, _to_float(fd, tv["attn_out"]), tv["attn_dropout_mask"], cfg))
    ln1, tv["ln1_mean"], tv["ln1_rstd"] = _layer_norm(fd, h1, tv["ln1_weight"], tv["ln1_bias"], cfg)
    tv["fc1_out"] = fd.ops.linear(_to_dtype(fd, ln1, cfg.dtype), tv["fc1_weight"], tv["fc1_bias"])
    # Kept for the backward (fc2's weight gradient reads it), as torch's autograd keeps it: the
    # recomputation cost the CPU backward a pass with a tanh over [b, s, 4e/d] (2.7 ms of the
    # 2-rank benchmark step), and the forward writes the tensor anyway.
    gelu = tv["gelu_out"] = _to_dtype(fd, _gelu_tanh(fd, _to_float(fd, tv["fc1_out"])), cfg.dtype)
    fc2 = fd.ops.linear(gelu, tv["fc2_weight"], tv["fc2_bias"])
    tv["fc2_out"] = fc2
    tv["mlp_dropout_mask"] = _dropout_mask(fd, cfg)
    out = fd.ops.add(h1, _apply_dropout(fd, _to_float(fd, fc2), tv["mlp_dropout_mask"], cfg))
    tv["out"] = _to_dtype(fd, out, cfg.dtype)
    for name in FORWARD_OUTPUTS:
        fd.add_output(tv[name])
    return tv


def _layer_norm_backward(fd, dy, x, mean, rstd, weight, cfg):
    """Gradients of LayerNorm(x) given dy: (dx, dweight, dbias); all fp32 [b, s, e] / [e]."""
    b, s, e = cfg.batch, cfg.sequence, cfg.hidden
    xhat = fd.ops.mul(fd.ops.sub(x, fd.ops.broadcast_in_dim(mean, [b, s, e], [0, 1])),
                      fd.ops.broadcast_in_dim(rstd, [b, s, e], [0, 1, 2]))
    dweight = fd.ops.sum(fd.ops.mul(dy, xhat), [0, 1])
    dbias = fd.ops.sum(dy, [0, 1])
    dxhat = fd.ops.mul(dy, _to_float(fd, fd.ops.broadcast_in_dim(weight, [b, s, e], [2])))
    mean_dxhat = fd.ops.mean(dxhat, [2], keepdim=True)
    mean_dxhat_xhat = fd.ops.mean(fd.ops.mul(dxhat, xhat), [2], keepdim=True)
    centred = fd.ops.sub(fd.ops.sub(dxhat, mean_dxhat), fd.ops.mul(xhat, mean_dxhat_xhat))
    dx = fd.ops.mul(fd.ops.broadcast_in_dim(rstd, [b, s, e], [0, 1, 2]), centred)
    return dx, dweight, dbias


def _linear_backward(fd, dy, x, weight, cfg):
    """y = x @ w.T + bias over [b, s, *]: (dx, dw, dbias) with dx in dy's dtype."""
    b, s = cfg.batch, cfg.sequence
    n, k = weight.shape
    dy2 = fd.ops.reshape(dy, [b * s, n])
    dx = fd.ops.reshape(fd.ops.matmul(dy2, weight), [b, s, k])
    dw = fd.ops.matmul(fd.ops.permute(dy2, [1, 0]), fd.ops.reshape(x, [b * s, k]))
    dbias = fd.ops.sum(_to_float(fd, dy), [0, 1])
    return dx, dw, dbias


def _check_backward_outputs(outputs):
    if outputs is None:
        return BACKWARD_OUTPUTS
    outputs = tuple(outputs)
    unknown = [n for n in outputs if n not in BACKWARD_OUTPUTS]
    if unknown or not outputs or len(set(outputs)) != len(outputs):
        raise ValueError(f"backward outputs must be distinct names from {BACKWARD_OUTPUTS}, got {outputs!r}")
    return tuple(n for n in BACKWARD_OUTPUTS if n in outputs)


def define_backward(fd, cfg, outputs=None):
    """Appends the layer's backward to `fd`: inputs are the output gradient, the layer's input and
    parameters, and the forward outputs it needs; outputs are `outputs` (default BACKWARD_OUTPUTS),
    in BACKWARD_OUTPUTS' order. A gradient left out is not computed, nor reduced across ranks: only
    outputs are scheduled, so a frozen parameter costs neither its GEMM nor its allreduce."""
    outputs = _check_backward_outputs(outputs)
    cfg.check()
    fd.compute_dtype = cf = _compute_dtype(cfg)
    b, s, e = cfg.batch, cfg.sequence, cfg.hidden
    h, dh, dt = cfg.heads, cfg.head_dim, cfg.dtype
    tv = {"grad_out": fd.define_tensor([b, s, e], dt), "x": fd.define_tensor([b, s, e], dt)}
    for name, shape in cfg.parameter_shapes().items():
        tv[name] = fd.define_tensor(shape, dt)
    saved = {"ln0_mean": ([b, s], cf), "ln0_rstd": ([b, s, 1], cf),
             "qkv": ([b, s, 3 * e], dt), "sdpa_out": ([b, h, s, dh], dt), "sdpa_lse": ([b, h, s], DataType.Float),
             "attn_out": ([b, s, e], dt), "attn_dropout_mask": ([b, s, e], DataType.Bool),
             "ln1_mean": ([b, s], cf), "ln1_rstd": ([b, s, 1], cf),
             "fc1_out": ([b, s, 4 * e], dt), "gelu_out": ([b, s, 4 * e], dt),
             "mlp_dropout_mask": ([b, s, e], DataType.Bool)}
    for name, (shape, dtype) in saved.items():
        tv[name] = fd.define_tensor(shape, dtype)
    # sdpfa_fwd's Philox seed and offset: 0-dim Int tensors, replicated.
    tv["sdpa_seed"], tv["sdpa_offset"] = fd.define_tensor([], DataType.Int), fd.define_tensor([], DataType.Int)

    grad = {}
    dout = _to_float(fd, tv["grad_out"])
    x32 = _to_float(fd, tv["x"])
    # MLP block: out = h1 + dropout(fc2(gelu(fc1(ln1(h1))))).
    h1 = fd.ops.add(x32, _apply_dropout(fd, _to_float(fd, tv["attn_out"]), tv["attn_dropout_mask"], cfg))
    # The intermediates named in tv (dfc2, ln1_out, dln1 and their attention-block twins) are where
    # the SP schedule places its gathers and reduce-scatters (apply_schedule). The gathered ones are
    # sets, so that each is computed locally and gathered once; the sets join their producers'
    # pointwise segments. dln1/dln0 are the GEMMs' reshaped results themselves (no copy).
    dfc2 = tv["dfc2"] = fd.ops.set(_to_dtype(fd, _apply_dropout(fd, dout, tv["mlp_dropout_mask"], cfg), dt))
    fc1_32 = _to_float(fd, tv["fc1_out"])
    dgelu, grad["grad_fc2_weight"], grad["grad_fc2_bias"] = _linear_backward(fd, dfc2, tv["gelu_out"],
                                                                              tv["fc2_weight"], cfg)
    dfc1 = _to_dtype(fd, fd.ops.mul(_to_float(fd, dgelu), _gelu_tanh_grad(fd, fc1_32)), dt)
    ln1_out = tv["ln1_out"] = fd.ops.set(_to_dtype(fd, _normalized(fd, h1, tv["ln1_mean"], tv["ln1_rstd"],
                                                                  tv["ln1_weight"], tv["ln1_bias"], cfg), dt))
    dln1, grad["grad_fc1_weight"], grad["grad_fc1_bias"] = _linear_backward(fd, dfc1, ln1_out, tv["fc1_weight"], cfg)
    tv["dln1"] = dln1
    dh1_ln, grad["grad_ln1_weight"], grad["grad_ln1_bias"] = _layer_norm_backward(
        fd, _to_float(fd, dln1), h1, tv["ln1_mean"], tv["ln1_rstd"], tv["ln1_weight"], cfg)
    dh1 = fd.ops.add(dout, dh1_ln)
    # Attention block: h1 = x + dropout(out_proj(attention(qkv(ln0(x))))).
    dattn = tv["dattn"] = fd.ops.set(_to_dtype(fd, _apply_dropout(fd, dh1, tv["attn_dropout_mask"], cfg), dt))
    merged = _merge_heads(fd, tv["sdpa_out"], cfg)
    dmerged, grad["grad_out_weight"], grad["grad_out_bias"] = _linear_backward(fd, dattn, merged, tv["out_weight"],
                                                                                cfg)
    dsdpa = fd.ops.permute(fd.ops.reshape(dmerged, [b, s, h, dh]), [0, 2, 1, 3])
    q, k, v = _split_heads(fd, tv["qkv"], cfg)
    dq, dk, dv = fd.ops.sdpfa_bwd(dsdpa, q, k, v, tv["sdpa_out"], tv["sdpa_lse"], cfg.sdpa_dropout_p, cfg.causal,
                                  tv["sdpa_seed"], tv["sdpa_offset"])
    # Concatenate per head before merging heads, so that the cat cuts no sharded axis.
    dqkv = fd.ops.reshape(fd.ops.cat([fd.ops.permute(t, [0, 2, 1, 3]) for t in (dq, dk, dv)], 3), [b, s, 3 * e])
    ln0_out = tv["ln0_out"] = fd.ops.set(_to_dtype(fd, _normalized(fd, x32, tv["ln0_mean"], tv["ln0_rstd"],
                                                                  tv["ln0_weight"], tv["ln0_bias"], cfg), dt))
    dln0, grad["grad_qkv_weight"], grad["grad_qkv_bias"] = _linear_backward(fd, dqkv, ln0_out, tv["qkv_weight"], cfg)
    tv["dln0"] = dln0
    dx_ln, grad["grad_ln0_weight"], grad["grad_ln0_bias"] = _layer_norm_backward(
        fd, _to_float(fd, dln0), x32, tv["ln0_mean"], tv["ln0_rstd"], tv["ln0_weight"], cfg)
    grad["grad_x"] = _to_dtype(fd, fd.ops.add(dh1, dx_ln), dt)
    for name in BACKWARD_OUTPUTS:
        if name != "grad_x" and grad[name].dtype != dt and name.endswith(("weight", "bias")):
            grad[name] = _to_dtype(fd, grad[name], dt)
        if name in outputs:
            fd.add_output(grad[name])
    tv.update(grad)
    return tv


def _normalized(fd, x, mean, rstd, weight, bias, cfg):
    """LayerNorm's output recomputed from the saved mean and rstd (fp32)."""
    b, s, e = cfg.batch, cfg.sequence, cfg.hidden
    xhat = fd.ops.mul(fd.ops.sub(x, fd.ops.broadcast_in_dim(mean, [b, s, e], [0, 1])),
                      fd.ops.broadcast_in_dim(rstd, [b, s, e], [0, 1, 2]))
    w = _to_float(fd, fd.ops.broadcast_in_dim(weight, [b, s, e], [2]))
    bb = _to_float(fd, fd.ops.broadcast_in_dim(bias, [b, s, e], [2]))
    return fd.ops.add(fd.ops.mul(xhat, w), bb)


def _shard(tv, axis, parts, parallel):
    tv.outer_split(axis, parts)
    tv.axis(axis).parallelize(parallel)


def _check_schedule(schedule):
    if not isinstance(schedule, str) or schedule not in SCHEDULES:
        raise ValueError(f"unknown schedule {schedule!r}; choose one of {', '.join(SCHEDULES)}")


def _check_schedule_and_mesh(schedule, mesh):
    """Before any definition, on every rank: a misspelt schedule was scheduled as tp, and a mesh-less
    one failed deep inside apply_schedule."""
    from ..multidevice import DeviceMesh
    _check_schedule(schedule)
    if schedule != "none" and mesh is None:
        raise ValueError(f"schedule {schedule!r} needs a mesh: mesh_for({schedule!r}, world_size) gives the one "
                         f"it runs on")
    if mesh is not None and not isinstance(mesh, DeviceMesh):
        raise TypeError(f"mesh must be a DeviceMesh or None, got {type(mesh).__name__}")
    # tp/sp on a [dp, tp] mesh shard along mesh_x only: every dp row computed the same whole batch.
    wanted = 2 if schedule == "dp_tp" else 1
    if mesh is not None and schedule != "none" and mesh.ndim != wanted:
        raise ValueError(f"schedule {schedule!r} runs on a {wanted}-D mesh, got {mesh!r} ({mesh.ndim}-D): "
                         f"mesh_for({schedule!r}, world_size) gives the one it runs on")


def mesh_for(schedule, world_size, dp=None):
    """The device mesh a schedule runs on: 1-D over the world for tp/sp, [dp, tp] for dp_tp."""
    from ..multidevice import DeviceMesh
    _check_schedule(schedule)
    if schedule != "dp_tp":
        return DeviceMesh(range(world_size))
    if dp is None:
        dp = 2 if world_size % 2 == 0 and world_size > 1 else 1
    elif isinstance(dp, bool) or not hasattr(dp, "__index__"):
        raise TypeError(f"dp_tp: dp must be an integer, got {type(dp).__name__} {dp!r}")
    elif dp < 1:  # dp=0 used to fall back to the default silently
        raise ValueError(f"dp_tp: dp must be at least 1, got {dp}")
    dp = int(dp)
    if world_size % dp:
        raise ValueError(f"dp_tp: the world of {world_size} ranks does not split into dp = {dp} groups")
    return DeviceMesh(range(world_size), [dp, world_size // dp])


def apply_schedule(tv, cfg, mesh, schedule, backward=False):
    """Sets meshes and shardings on a layer definition's tensors (see the module docstring)."""
    _check_schedule_and_mesh(schedule, mesh)
    if schedule == "none":
        return
    tp = mesh.size_along(ParallelType.mesh_x)
    if cfg.heads % tp:
        raise ValueError(f"{schedule}: {cfg.heads} heads do not divide over {tp} tensor-parallel ranks")
    if schedule == "sp" and cfg.sequence % tp:
        raise ValueError(f"sp: sequence {cfg.sequence} does not divide over {tp} ranks")
    # Every input on the mesh, sdpa_seed/sdpa_offset included: the forward's outputs are None on
    # ranks outside a sub-mesh, and a mesh-less input is one every world rank must hold.
    for name in _input_names(backward):
        if name in tv and tv[name].is_tensor:
            tv[name].set_device_mesh(mesh)
    x = ParallelType.mesh_x
    for name in ("qkv_weight", "qkv_bias", "fc1_weight", "fc1_bias"):
        _shard(tv[name], 0, tp, x)  # column-parallel
    for name in ("out_weight", "fc2_weight"):
        _shard(tv[name], 1, tp, x)  # row-parallel
    if backward:  # saved activations of the column-parallel / head-parallel parts
        for name in ("qkv", "fc1_out", "gelu_out"):
            _shard(tv[name], 2, tp, x)
        for name in ("sdpa_out", "sdpa_lse"):
            _shard(tv[name], 1, tp, x)
    if schedule == "sp":
        seq = ["grad_out", "x"] if backward else ["x"]
        if backward:
            seq += ["ln0_mean", "ln0_rstd", "ln1_mean", "ln1_rstd", "attn_out", "attn_dropout_mask",
                    "mlp_dropout_mask"]
            # Megatron's backward: the gradients entering the row-parallel linears and the LayerNorm
            # outputs the column-parallel weight gradients need are gathered over the sequence once
            # (replicated); the column-parallel input gradients are reduce-scattered onto it.
            for name in ("dfc2", "ln1_out", "dattn", "ln0_out", "dln1", "dln0"):
                tv[name].set_device_mesh(mesh)
            seq += ["dln1", "dln0"]
        else:  # intermediates that fix where the sequence shards live (reduce-scatter targets)
            seq += ["attn_out", "fc2_out", "attn_dropout_mask", "mlp_dropout_mask"]
            for name in ("attn_out", "fc2_out", "attn_dropout_mask", "mlp_dropout_mask"):
                tv[name].set_device_mesh(mesh)
        for name in seq:
            _shard(tv[name], 1, tp, x)
    if schedule == "dp_tp":
        dp = mesh.size_along(ParallelType.mesh_y)
        if cfg.batch % dp:
            raise ValueError(f"dp_tp: batch {cfg.batch} does not divide over {dp} data-parallel ranks")
        batch = ["x"]
        if backward:
            batch = ["grad_out", "x", "ln0_mean", "ln0_rstd", "qkv", "sdpa_out", "sdpa_lse", "attn_out",
                     "attn_dropout_mask", "ln1_mean", "ln1_rstd", "fc1_out", "gelu_out", "mlp_dropout_mask"]
        if not backward:  # each rank draws only its batch block of the dropout masks
            batch += ["attn_dropout_mask", "mlp_dropout_mask"]
            for name in ("attn_dropout_mask", "mlp_dropout_mask"):
                tv[name].set_device_mesh(mesh)
        for name in batch:
            _shard(tv[name], 0, dp, ParallelType.mesh_y)


def output_shardings(schedule, backward=False):
    """{output name: [(axis, ParallelType), ...]}: how the schedule's outputs come out sharded (by
    propagation from the annotated inputs; tests check it). Outputs not listed are replicated."""
    _check_schedule(schedule)
    if schedule == "none":
        return {}
    x, y = ParallelType.mesh_x, ParallelType.mesh_y
    if backward:
        out = {n: [(0, x)] for n in ("grad_qkv_weight", "grad_qkv_bias", "grad_fc1_weight", "grad_fc1_bias")}
        out.update({n: [(1, x)] for n in ("grad_out_weight", "grad_fc2_weight")})
        if schedule == "sp":
            out["grad_x"] = [(1, x)]
        if schedule == "dp_tp":
            out["grad_x"] = [(0, y)]
        return out
    out = {"qkv": [(2, x)], "sdpa_out": [(1, x)], "sdpa_lse": [(1, x)], "fc1_out": [(2, x)], "gelu_out": [(2, x)]}
    if schedule == "sp":
        for n in ("ln0_mean", "ln0_rstd", "attn_out", "attn_dropout_mask", "ln1_mean", "ln1_rstd", "mlp_dropout_mask",
                  "out"):
            out[n] = [(1, x)]
    if schedule == "dp_tp":
        for n in FORWARD_OUTPUTS:
            if n not in ("sdpa_seed", "sdpa_offset"):
                out[n] = [(0, y)] + out.get(n, [])
    return out


def _input_names(backward):
    names = ["x", *PARAMETERS]
    if backward:
        names += ["grad_out", "ln0_mean", "ln0_rstd", "qkv", "sdpa_out", "sdpa_lse", "sdpa_seed", "sdpa_offset",
                  "attn_out", "attn_dropout_mask", "ln1_mean", "ln1_rstd", "fc1_out", "gelu_out", "mlp_dropout_mask"]
    return names


def _check_layer(cfg, mesh, schedule):
    """At construction, identically on every rank: bad arguments raise before any collective."""
    if not isinstance(cfg, TransformerConfig):
        raise TypeError(f"cfg must be a TransformerConfig, got {type(cfg).__name__}")
    cfg.check()
    _check_schedule_and_mesh(schedule, mesh)


class TransformerForward(FusionDefinition):
    """The layer's forward on `mesh` with `schedule` ("none", "tp", "sp" or "dp_tp")."""

    def __init__(self, cfg, mesh=None, schedule="none", **kwargs):
        _check_layer(cfg, mesh, schedule)
        super().__init__(**kwargs)
        self.cfg, self.mesh, self.schedule = cfg, mesh, schedule
        self.tensors = {}

    def definition(self):
        self.tensors = define_forward(self, self.cfg)

    def multidevice_schedule(self):
        apply_schedule(self.tensors, self.cfg, self.mesh, self.schedule)

    def input_names(self):
        return ["x", *PARAMETERS]


class TransformerBackward(FusionDefinition):
    """The layer's backward; its inputs are named by input_names(), its outputs by output_names()
    (`outputs`, default all of BACKWARD_OUTPUTS: the gradients wanted, e.g. none of frozen parameters)."""

    def __init__(self, cfg, mesh=None, schedule="none", outputs=None, **kwargs):
        _check_layer(cfg, mesh, schedule)
        self._output_names = _check_backward_outputs(outputs)
        super().__init__(**kwargs)
        self.cfg, self.mesh, self.schedule = cfg, mesh, schedule
        self.tensors = {}

    def definition(self):
        self.tensors = define_backward(self, self.cfg, self._output_names)

    def output_names(self):
        return self._output_names

    def multidevice_schedule(self):
        apply_schedule(self.tensors, self.cfg, self.mesh, self.schedule, backward=True)

    def input_names(self):
        self._ensure_defined()
        by_name = {v.name: name for name, v in self.tensors.items()}
        return [by_name.get(v.name) for v in self._fusion.inputs()]


def shard_inputs(fd, arrays, rank):
    """This rank's shards of global arrays {name: array} in fd's input order."""
    from ..multidevice import shard_tensor
    fd._ensure_defined()
    return [shard_tensor(arrays[name], fd.tensors[name], rank) for name in fd.input_names()]
