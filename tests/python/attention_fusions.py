"""Attention fusions that several test files define alike."""
from meshfuse import DataType, FusionDefinition

BF16 = DataType.BFloat16


def forward_and_backward(b, h, sq, skv, d, p, causal):
    """Two bf16 fusions at [b, h, s, d]: sdpfa_fwd (out, log_sumexp, philox_seed, philox_offset) and the
    sdpfa_bwd that takes them (grad_output, q, k, v, out, log_sumexp, seed, offset -> dq, dk, dv)."""
    with FusionDefinition() as fwd:
        q, k, v = (fwd.define_tensor(s, dtype=BF16) for s in ([b, h, sq, d], [b, h, skv, d], [b, h, skv, d]))
        for t in fwd.ops.sdpfa_fwd(q, k, v, dropout_p=p, is_causal=causal):
            fwd.add_output(t)
    with FusionDefinition() as bwd:
        go, q = (bwd.define_tensor([b, h, sq, d], dtype=BF16) for _ in range(2))
        k, v = (bwd.define_tensor([b, h, skv, d], dtype=BF16) for _ in range(2))
        out = bwd.define_tensor([b, h, sq, d], dtype=BF16)
        lse = bwd.define_tensor([b, h, sq], dtype=DataType.Float)
        seed, offset = bwd.define_tensor([], dtype=DataType.Int), bwd.define_tensor([], dtype=DataType.Int)
        for t in bwd.ops.sdpfa_bwd(go, q, k, v, out, lse, p, causal, seed, offset):
            bwd.add_output(t)
    return fwd, bwd
