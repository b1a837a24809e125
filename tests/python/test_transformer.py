"""The transformer layer of meshfuse.models.transformer on one process: forward outputs and every
gradient against a float64 numpy layer (transformer_reference.py) computed with the dropout masks
the forward returns, the backward against central finite differences of the forward in float64,
one normalization segment per LayerNorm, the MLP's GELU (and its backward) folded into its matmul's
segment as an epilogue, and the torch autograd wrapper training a toy regression
(the loss falls). The multi-rank schedules are in mp/test_transformer_mp.py."""
import dataclasses
import os
import re

import numpy as np
import pytest

import transformer_reference as ref
from attention_reference import dropout_keep
from conftest import torch_cuda_available
from meshfuse import DataType
from meshfuse.models import BACKWARD_OUTPUTS, FORWARD_OUTPUTS, PARAMETERS, TransformerBackward, TransformerConfig
from meshfuse.models import TransformerForward

CFG = TransformerConfig(batch=2, sequence=7, heads=2, hidden=16, dtype=DataType.Float, dropout_p=0.2,
                        attention_dropout_p=0.0)


def make_inputs(cfg, seed, dtype=np.float32):
    rng = np.random.default_rng(seed)
    params = {n: (rng.standard_normal(s) * (0.3 if len(s) > 1 else 1.0)).astype(dtype)
              for n, s in cfg.parameter_shapes().items()}
    x = rng.standard_normal((cfg.batch, cfg.sequence, cfg.hidden)).astype(dtype)
    return x, params


def run_layer(cfg, x, params, dout):
    fwd = TransformerForward(cfg)
    outs = dict(zip(FORWARD_OUTPUTS, fwd.execute([x] + [params[n] for n in PARAMETERS])))
    bwd = TransformerBackward(cfg)
    arrays = dict(outs, x=x, grad_out=dout, **params)
    grads = dict(zip(BACKWARD_OUTPUTS, bwd.execute([arrays[n] for n in bwd.input_names()])))
    return fwd, bwd, outs, grads


@pytest.mark.parametrize("attention_dropout", [0.0, 0.3], ids=["no-attention-dropout", "attention-dropout"])
def test_forward_and_backward_match_float64_reference(attention_dropout):
    cfg = TransformerConfig(batch=CFG.batch, sequence=CFG.sequence, heads=CFG.heads, hidden=CFG.hidden,
                            dtype=DataType.Float, dropout_p=CFG.dropout_p, attention_dropout_p=attention_dropout)
    x, params = make_inputs(cfg, 3)
    dout = np.random.default_rng(4).standard_normal(x.shape).astype(np.float32)
    _, _, outs, grads = run_layer(cfg, x, params, dout)
    m1, m2 = outs["attn_dropout_mask"], outs["mlp_dropout_mask"]
    assert m1.dtype == np.bool_ and 0.6 < m1.mean() < 0.95, "dropout keeps about 1 - p"
    akeep = None
    if attention_dropout:  # the attention's mask, from the Philox pair its forward returns
        akeep = dropout_keep([cfg.batch, cfg.heads, cfg.sequence, cfg.sequence], outs["sdpa_seed"],
                             outs["sdpa_offset"], attention_dropout)
        assert 0.4 < akeep.mean() < 0.9
    p64 = {k: v.astype(np.float64) for k, v in params.items()}
    r = ref.forward(x.astype(np.float64), p64, m1, m2, cfg, akeep)
    for name in ("ln0_mean", "qkv", "sdpa_out", "sdpa_lse", "attn_out", "ln1_mean", "fc1_out", "gelu_out", "out"):
        np.testing.assert_allclose(outs[name], r[name], rtol=2e-4, atol=2e-4, err_msg=name)
    np.testing.assert_allclose(outs["ln0_rstd"], r["ln0_rstd"], rtol=2e-4, err_msg="ln0_rstd")
    g = ref.backward(dout.astype(np.float64), x.astype(np.float64), p64, m1, m2, cfg, akeep)
    for name in BACKWARD_OUTPUTS:
        scale = np.abs(g[name]).max()
        np.testing.assert_allclose(grads[name], g[name], rtol=1e-3, atol=1e-3 * scale, err_msg=name)


def test_backward_matches_finite_differences_in_float64():
    cfg = TransformerConfig(batch=1, sequence=3, heads=2, hidden=4, dtype=DataType.Double, dropout_p=0.0)
    x, params = make_inputs(cfg, 5, np.float64)
    dout = np.random.default_rng(6).standard_normal(x.shape)
    fwd, _, _, grads = run_layer(cfg, x, params, dout)

    def loss():
        return float((fwd.execute([x] + [params[n] for n in PARAMETERS])[-1] * dout).sum())

    eps = 1e-6
    for name, arr in [("grad_x", x)] + [("grad_" + n, params[n]) for n in ("ln0_weight", "qkv_weight", "fc2_bias")]:
        numeric = np.zeros_like(arr)
        for i in np.ndindex(arr.shape):
            old = arr[i]
            arr[i] = old + eps
            up = loss()
            arr[i] = old - eps
            down = loss()
            arr[i] = old
            numeric[i] = (up - down) / (2 * eps)
        np.testing.assert_allclose(grads[name], numeric, rtol=1e-5, atol=1e-7, err_msg=name)


def test_each_layer_norm_is_one_normalization_segment():
    x, params = make_inputs(CFG, 7)
    fwd = TransformerForward(CFG)
    fwd.execute([x] + [params[n] for n in PARAMETERS])
    ir = fwd.host_ir()
    kinds = [line.split()[1].split("(")[0] for line in ir.splitlines() if "LaunchSegment" in line]
    assert kinds.count("normalization") == 2, ir
    assert kinds.count("attention") == 1, ir
    assert "Allreduce" not in ir and "Allgather" not in ir, "one process: no communication"


def test_the_mlp_gelu_runs_as_the_matmul_epilogue_forward_and_backward():
    """The tanh GELU after fc1 (forward) and its derivative after the fc2 input-gradient GEMM
    (backward) are folded into their matmul segments (cuBLASLt epilogues on CUDA); the other
    matmuls keep theirs alone, and the results above are those of these programs."""
    if os.environ.get("MESHFUSE_MATMUL_EPILOGUES") == "0":
        pytest.skip("MESHFUSE_MATMUL_EPILOGUES=0 turns the folding off")
    x, params = make_inputs(CFG, 8)
    dout = np.random.default_rng(9).standard_normal(x.shape).astype(np.float32)
    fwd, bwd, _, _ = run_layer(CFG, x, params, dout)
    for program, kind, matmuls in ((fwd, "gelu_tanh", 4), (bwd, "gelu_tanh_grad", 8)):
        ir = program.host_ir()
        segments = [line for line in ir.splitlines() if "LaunchSegment matmul" in line]
        assert len(segments) == matmuls, ir
        folded = [line for line in segments if " epilogue " in line]
        assert len(folded) == 1 and f"epilogue {kind} -> " in folded[0], ir
        assert "tanh" in folded[0].split("{")[1], "the chain's exprs are in the segment"
    assert "bias_grad -> " in [line for line in bwd.host_ir().splitlines() if " epilogue " in line][0], \
        "fc1's bias gradient comes from the same GEMM"
    assert not any("tanh" in line for line in fwd.host_ir().splitlines() if "LaunchSegment pointwise" in line)


def test_torch_layer_trains_a_toy_regression():
    torch = pytest.importorskip("torch")
    from meshfuse.torch import TransformerLayer
    torch.manual_seed(0)
    cfg = TransformerConfig(batch=2, sequence=8, heads=2, hidden=16, dtype=DataType.Float, dropout_p=0.0)
    layer = TransformerLayer(cfg)
    x = torch.randn(cfg.batch, cfg.sequence, cfg.hidden)
    target = torch.randn(cfg.batch, cfg.sequence, cfg.hidden) * 0.5
    opt = torch.optim.Adam(layer.parameters(), lr=3e-3)
    losses = []
    for _ in range(30):
        opt.zero_grad()
        loss = ((layer(x) - target) ** 2).mean()
        loss.backward()
        opt.step()
        losses.append(float(loss))
    assert losses[-1] < 0.7 * losses[0], losses
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in layer.parameters())


@pytest.mark.skipif(not torch_cuda_available(), reason="needs torch with a CUDA GPU (and meshfuse built with cuDNN)")
def test_torch_layer_trains_on_cuda_in_bf16():
    # The torch wrapper as a GPU user runs it: the module moved with .cuda(), bf16 parameters, a torch
    # optimizer. The first step's gradients equal the float32 CPU layer's from the same
    # initialization (within bf16), and the loss falls.
    import torch
    from meshfuse.torch import TransformerLayer
    cfg = TransformerConfig(batch=2, sequence=16, heads=2, hidden=32, dtype=DataType.BFloat16, dropout_p=0.0)
    layer = TransformerLayer(cfg).cuda()
    reference = TransformerLayer(dataclasses.replace(cfg, dtype=DataType.Float))
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(cfg.batch, cfg.sequence, cfg.hidden, generator=gen)
    target = x @ (torch.randn(cfg.hidden, cfg.hidden, generator=gen) / cfg.hidden ** 0.5)
    ((reference(x) - target) ** 2).mean().backward()
    xc, tc = x.cuda().to(torch.bfloat16), target.cuda().to(torch.bfloat16)
    opt = torch.optim.Adam(layer.parameters(), lr=3e-3)
    losses = []
    for step in range(30):
        opt.zero_grad()
        loss = ((layer(xc).float() - tc.float()) ** 2).mean()
        loss.backward()
        if step == 0:
            for name, p in layer.named_parameters():
                assert p.grad.is_cuda and p.grad.dtype == torch.bfloat16, name
                want = getattr(reference, name).grad
                err = (p.grad.float().cpu() - want).abs().max() / max(want.abs().max(), 1e-3)
                assert err < 5e-2, f"{name}: max error {float(err):.3g} of the largest gradient"
        opt.step()
        losses.append(float(loss))
    assert losses[-1] < 0.7 * losses[0], losses


def test_bad_configuration_is_a_clear_error():
    with pytest.raises(ValueError, match="not divisible by heads"):
        TransformerForward(TransformerConfig(batch=1, sequence=4, heads=3, hidden=16))._ensure_defined()


@pytest.mark.parametrize("field", ["batch", "sequence", "heads", "hidden"])
@pytest.mark.parametrize("value", [0, -2])
def test_non_positive_sizes_are_a_value_error_at_construction(field, value):
    cfg = dataclasses.replace(CFG, **{field: value})
    with pytest.raises(ValueError, match=f"TransformerConfig.{field} must be positive, got {value}"):
        cfg.check()
    for program in (TransformerForward, TransformerBackward):
        with pytest.raises(ValueError, match=f"TransformerConfig.{field} must be positive"):
            program(cfg)


def test_bad_config_fields_and_attention_dropout_are_clear_errors():
    with pytest.raises(TypeError, match="TransformerConfig.hidden must be an integer, got float"):
        TransformerForward(dataclasses.replace(CFG, hidden=16.0))
    with pytest.raises(ValueError, match=r"attention_dropout_p must be in \[0, 1\), got 1.5"):
        TransformerForward(dataclasses.replace(CFG, attention_dropout_p=1.5))
    with pytest.raises(TypeError, match="cfg must be a TransformerConfig, got dict"):
        TransformerBackward({"batch": 2})


@pytest.mark.parametrize("schedule", ["TP", "dp-tp", "sequence", "pp", None])
def test_unknown_schedule_is_a_value_error_naming_the_valid_ones(schedule):
    from meshfuse.models import SCHEDULES, mesh_for, output_shardings
    message = f"unknown schedule {schedule!r}; choose one of none, tp, sp, dp_tp"
    assert SCHEDULES == ("none", "tp", "sp", "dp_tp")
    for program in (TransformerForward, TransformerBackward):
        # With a mesh a misspelt name was scheduled as tp; without one, an AttributeError.
        for mesh in (mesh_for("tp", 1), None):
            with pytest.raises(ValueError, match=re.escape(message)):
                program(CFG, mesh, schedule)
    for backward in (False, True):
        with pytest.raises(ValueError, match=re.escape(message)):
            output_shardings(schedule, backward=backward)
    with pytest.raises(ValueError, match=re.escape(message)):
        mesh_for(schedule, 1)


@pytest.mark.parametrize("schedule", ["tp", "sp", "dp_tp"])
def test_a_schedule_without_a_mesh_is_a_value_error(schedule):
    for program in (TransformerForward, TransformerBackward):
        with pytest.raises(ValueError, match=re.escape(f"schedule {schedule!r} needs a mesh: mesh_for({schedule!r}, "
                                                       f"world_size)")):
            program(CFG, None, schedule)
    with pytest.raises(TypeError, match="mesh must be a DeviceMesh or None, got list"):
        TransformerForward(CFG, [0], "tp")
    # "none" needs none, and its output table is empty.
    from meshfuse.models import output_shardings
    assert output_shardings("none") == {} and output_shardings("none", backward=True) == {}
    TransformerForward(CFG, None, "none")._ensure_defined()


def test_mesh_for_checks_dp():
    from meshfuse.models import mesh_for
    from meshfuse import ParallelType
    mesh = mesh_for("dp_tp", 4, dp=4)
    assert (mesh.size_along(ParallelType.mesh_y), mesh.size_along(ParallelType.mesh_x)) == (4, 1)
    mesh = mesh_for("dp_tp", 4)  # the default: dp = 2
    assert (mesh.size_along(ParallelType.mesh_y), mesh.size_along(ParallelType.mesh_x)) == (2, 2)
    for dp in (0, -1, -2):  # dp=0 was the default's 2, silently
        with pytest.raises(ValueError, match=f"dp_tp: dp must be at least 1, got {dp}"):
            mesh_for("dp_tp", 4, dp=dp)
    for dp in (3, 8):
        with pytest.raises(ValueError, match=f"the world of 4 ranks does not split into dp = {dp} groups"):
            mesh_for("dp_tp", 4, dp=dp)
    for dp in (2.0, "2", True):
        with pytest.raises(TypeError, match="dp_tp: dp must be an integer"):
            mesh_for("dp_tp", 4, dp=dp)


@pytest.mark.skipif(not torch_cuda_available(), reason="needs torch with a CUDA GPU (and meshfuse built with cuDNN)")
def test_cuda_bf16_layer_matches_float64_reference():
    # The layer as the GPU benchmark runs it (bf16 storage, cuBLASLt GEMMs with fused bias, cuDNN
    # attention, NVRTC normalization and pointwise kernels, the weight gradients' transposed
    # operands read in place, attention dropout through meshfuse's Philox mask), at a size where
    # cuDNN's head-dim rules hold; against float64 from the same bf16-rounded inputs and the masks
    # the forward returns (the attention's from its returned Philox seed and offset).
    import torch
    cfg = TransformerConfig(batch=2, sequence=96, heads=2, hidden=128, dtype=DataType.BFloat16, dropout_p=0.1)
    # Weights at 1/sqrt(fan_in), as a trained layer has them: bf16 rounding then stays small
    # against the values instead of growing with each product.
    rng = np.random.default_rng(11)
    params = {n: ((rng.standard_normal(s) / np.sqrt(s[-1])) if len(s) > 1 else
                  (1.0 if n.startswith("ln") and n.endswith("weight") else 0.0) + 0.1 * rng.standard_normal(s))
              .astype(np.float32) for n, s in cfg.parameter_shapes().items()}
    x = rng.standard_normal((cfg.batch, cfg.sequence, cfg.hidden)).astype(np.float32)
    dout = np.random.default_rng(12).standard_normal(x.shape).astype(np.float32)
    dev = {n: torch.from_numpy(a).to(torch.bfloat16).cuda() for n, a in dict(params, x=x, grad_out=dout).items()}
    fwd, bwd = TransformerForward(cfg), TransformerBackward(cfg)
    outs = dict(zip(FORWARD_OUTPUTS, fwd.execute([dev["x"]] + [dev[n] for n in PARAMETERS])))
    assert outs["out"].is_cuda and outs["out"].dtype == torch.bfloat16
    grads = dict(zip(BACKWARD_OUTPUTS, bwd.execute([dict(outs, **dev)[n] for n in bwd.input_names()])))
    as64 = {n: t.double().cpu().numpy() for n, t in dev.items()}
    m1, m2 = (outs[n].cpu().numpy().astype(bool) for n in ("attn_dropout_mask", "mlp_dropout_mask"))
    assert 0.8 < m1.mean() < 0.97
    akeep = dropout_keep([cfg.batch, cfg.heads, cfg.sequence, cfg.sequence], outs["sdpa_seed"], outs["sdpa_offset"],
                         cfg.sdpa_dropout_p)
    p64 = {n: as64[n] for n in PARAMETERS}
    r = ref.forward(as64["x"], p64, m1, m2, cfg, akeep)
    for name in ("qkv", "sdpa_out", "attn_out", "fc1_out", "gelu_out", "out"):
        got = outs[name].double().cpu().numpy()
        np.testing.assert_allclose(got, r[name], rtol=5e-2, atol=3e-2 * np.abs(r[name]).max(), err_msg=name)
    g = ref.backward(as64["grad_out"], as64["x"], p64, m1, m2, cfg, akeep)
    for name in BACKWARD_OUTPUTS:
        got = grads[name].double().cpu().numpy()
        np.testing.assert_allclose(got, g[name], rtol=5e-2, atol=3e-2 * np.abs(g[name]).max(), err_msg=name)
