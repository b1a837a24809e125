"""The transformer layer on CUDA tensors under mpirun (scripts/test-gpu --python: 2 ranks sharing the
GPU): the TP and SP schedules in bf16, as one rank per GPU would run them, forward outputs and every
gradient on every rank against the float64 numpy layer on the global arrays (from the same
bf16-rounded inputs, with the dropout masks the forward returns). Skipped without torch and a GPU."""
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import transformer_reference as ref  # noqa: E402
from host_ir_lines import communications, launched_while_in_flight  # noqa: E402
from meshfuse import DataType  # noqa: E402
from meshfuse.models import (BACKWARD_OUTPUTS, FORWARD_OUTPUTS, PARAMETERS, TransformerBackward,  # noqa: E402
                             TransformerConfig, TransformerForward, mesh_for, output_shardings,
                             shard_inputs)
from meshfuse.multidevice import Communicator, shard_tensor  # noqa: E402
from test_transformer_mp import gather  # noqa: E402
from torch_gpu import torch_cuda  # noqa: E402

RANK, WORLD = Communicator.instance().rank, Communicator.instance().size


def bf16_rounded(torch, a):
    return torch.from_numpy(a).to(torch.bfloat16).double().numpy()


@pytest.mark.skipif(torch_cuda() is None, reason="needs torch with a CUDA GPU (and meshfuse built with cuDNN)")
@pytest.mark.parametrize("schedule", ["tp", "sp"])
def test_bf16_layer_on_cuda_matches_reference_on_every_rank(schedule):
    torch = torch_cuda()
    # Head dim 16 (cuDNN's rule: a multiple of 8); no dropout inside attention, whose mask on
    # sharded heads the reference would have to redraw (test_attention_mp.py covers that).
    cfg = TransformerConfig(batch=2, sequence=16 * WORLD, heads=2 * WORLD, hidden=32 * WORLD,
                            dtype=DataType.BFloat16, dropout_p=0.1, attention_dropout_p=0.0)
    mesh = mesh_for(schedule, WORLD)
    fwd, bwd = TransformerForward(cfg, mesh, schedule), TransformerBackward(cfg, mesh, schedule)
    # Weights at 1/sqrt(fan_in), as in test_transformer.py's single-GPU test: bf16 rounding stays
    # small against the values.
    rng = np.random.default_rng(23)
    arrays = {n: ((rng.standard_normal(s) / np.sqrt(s[-1])) if len(s) > 1 else
                  (1.0 if n.startswith("ln") and n.endswith("weight") else 0.0) + 0.1 * rng.standard_normal(s))
              .astype(np.float32) for n, s in cfg.parameter_shapes().items()}
    arrays["x"] = rng.standard_normal((cfg.batch, cfg.sequence, cfg.hidden)).astype(np.float32)
    arrays["grad_out"] = rng.standard_normal(arrays["x"].shape).astype(np.float32)

    def on_gpu(shard):
        return torch.from_numpy(shard).to(torch.bfloat16).cuda()

    outs = dict(zip(FORWARD_OUTPUTS, fwd.execute([on_gpu(a) for a in shard_inputs(fwd, arrays, RANK)])))
    assert outs["out"].is_cuda and outs["out"].dtype == torch.bfloat16

    def global_of(tensors, name, fd, shardings):
        t = tensors[name]
        host = t.cpu().numpy() if t.dtype == torch.bool else t.float().cpu().numpy()
        return gather(host, fd.tensors[name], mesh, shardings.get(name),
                      dtype=DataType.Bool if t.dtype == torch.bool else DataType.Float)

    out_sh, grad_sh = output_shardings(schedule), output_shardings(schedule, backward=True)
    m1, m2 = (global_of(outs, n, fwd, out_sh) for n in ("attn_dropout_mask", "mlp_dropout_mask"))
    as64 = {n: bf16_rounded(torch, a) for n, a in arrays.items()}
    p64 = {n: as64[n] for n in PARAMETERS}
    r = ref.forward(as64["x"], p64, m1, m2, cfg)
    for name in ("qkv", "attn_out", "fc1_out", "gelu_out", "out"):
        got = global_of(outs, name, fwd, out_sh)
        np.testing.assert_allclose(got, r[name], rtol=5e-2, atol=3e-2 * np.abs(r[name]).max(),
                                   err_msg=f"rank {RANK}: {name}")

    inputs = {n: outs[n] if n in outs else on_gpu(shard_tensor(arrays[n], bwd.tensors[n], RANK))
              for n in bwd.input_names()}
    grads = dict(zip(BACKWARD_OUTPUTS, bwd.execute([inputs[n] for n in bwd.input_names()])))
    g = ref.backward(as64["grad_out"], as64["x"], p64, m1, m2, cfg)
    for name in BACKWARD_OUTPUTS:
        got = global_of(grads, name, bwd, grad_sh)
        np.testing.assert_allclose(got, g[name], rtol=5e-2, atol=3e-2 * np.abs(g[name]).max(),
                                   err_msg=f"rank {RANK}: {name}")
    if schedule == "tp":
        assert communications(fwd) == ["Allreduce"] * 2, fwd.host_ir()
        assert all("matmul" in kinds for kinds in launched_while_in_flight(bwd)), bwd.host_ir()
