"""MESHFUSE_ATTENTION_RNG=cudnn (runtime/cuda/attention_rng.h): cuDNN draws attention's dropout inside
its kernels from philox_seed and philox_offset. Its mask is not meshfuse's Philox mask, so it is read
back from the backward itself (dO = identity turns dV into the dropped probability matrix) and every
output is then checked against float64 numpy with that mask: the forward and the backward must drop
the same elements, scale the kept ones by 1 / (1 - p), and drop about p of them."""
import numpy as np
import pytest

from attention_reference import attention_grad_reference, attention_reference, dropout_keep
from attention_fusions import forward_and_backward as fusions
from conftest import torch_cuda_available

pytestmark = pytest.mark.skipif(not torch_cuda_available(),
                                reason="needs torch with a CUDA GPU (and meshfuse built with cuDNN)")


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_cudnn_rng_forward_and_backward_drop_the_same_elements(causal, monkeypatch):
    import torch
    monkeypatch.setenv("MESHFUSE_ATTENTION_RNG", "cudnn")
    b, h, sq, skv, d, p = 1, 2, 64, 96, 128, 0.2
    rng = np.random.default_rng(23)
    q, k, v = (torch.from_numpy(rng.standard_normal(s).astype(np.float32) * 0.5).to(torch.bfloat16).cuda()
               for s in ([b, h, sq, d], [b, h, skv, d], [b, h, skv, d]))
    fwd, bwd = fusions(b, h, sq, skv, d, p, causal)
    out, lse, seed, offset = fwd.execute([q, k, v])
    # dO = identity on the first s_q of the d columns: dV[j, i] = (P * Z / (1 - p))[i, j].
    eye = torch.zeros([b, h, sq, d], dtype=torch.bfloat16, device="cuda")
    eye[..., torch.arange(sq), torch.arange(sq)] = 1
    _, _, dv = bwd.execute([eye, q, k, v, out, lse, seed, offset])
    dropped = dv.double().cpu().numpy()[..., :sq].swapaxes(-1, -2)  # [b, h, s_q, s_kv]
    rq, rk, rv = (t.double().cpu().numpy() for t in (q, k, v))
    probs = attention_reference(rq, rk, rv, causal)[2]
    visible = probs > 0
    keep = dropped > 0
    assert not keep[~visible].any()
    kept = keep[visible].mean()
    assert abs(kept - (1 - p)) < 0.03, f"{kept:.3f} of the elements kept at p = {p}"
    np.testing.assert_allclose(dropped, probs * keep / (1 - p), rtol=2e-2, atol=1e-4)
    # The forward applied the same mask, and the backward's gradients follow it.
    ref_out, ref_lse, _ = attention_reference(rq, rk, rv, causal, keep=keep, p=p)
    np.testing.assert_allclose(out.double().cpu().numpy(), ref_out, rtol=2e-2, atol=2e-2)
    np.testing.assert_allclose(lse.double().cpu().numpy(), ref_lse, rtol=1e-3, atol=1e-3)
    go = torch.from_numpy(rng.standard_normal([b, h, sq, d]).astype(np.float32)).to(torch.bfloat16).cuda()
    grads = bwd.execute([go, q, k, v, out, lse, seed, offset])
    for name, got, want in zip("qkv", grads, attention_grad_reference(rq, rk, rv, go.double().cpu().numpy(), causal,
                                                                      keep=keep, p=p)):
        err = np.abs(got.double().cpu().numpy() - want).max() / max(1.0, np.abs(want).max())
        assert err < 1.5e-2, f"grad_{name}: max error {err:.3g} of the largest gradient"
    # Reproducible from the seed and offset; and not meshfuse's Philox mask (which the CPU draws).
    again = bwd.execute([go, q, k, v, out, lse, seed, offset])
    for a, g in zip(again, grads):
        assert torch.equal(a, g)
    assert (dropout_keep([b, h, sq, skv], seed.cpu(), offset.cpu(), p)[visible] != keep[visible]).any()


def test_an_unknown_attention_rng_is_a_clear_error(monkeypatch):
    import torch
    monkeypatch.setenv("MESHFUSE_ATTENTION_RNG", "curand")
    fwd, _ = fusions(1, 1, 16, 16, 64, 0.1, False)
    x = torch.zeros([1, 1, 16, 64], dtype=torch.bfloat16, device="cuda")
    with pytest.raises(Exception, match="MESHFUSE_ATTENTION_RNG=curand is not one of cudnn"):
        fwd.execute([x, x, x])
