"""Which backward cuDNN needs behind a one-byte (0/1) dropout mask, measured on the GPU.

    PYTHONPATH=python python3 scripts/attention-byte-probe.py

Each case runs sdpfa_fwd + sdpfa_bwd (bf16, dropout) in a child process, so that a CUDA fault in one
(a misaligned read poisons the context) leaves the others to run, under a mask width
(MESHFUSE_ATTENTION_MASK) and a byte-backward strategy (MESHFUSE_ATTENTION_BYTE_BACKWARD,
runtime/cuda/attention.cpp). It prints each result's error against float64 (the mask the returned
seed and offset imply), and least-squares fits of what cuDNN computed:
  dQ = (a * P*Z*dP_d - c * P*D) K * scale   (Z the 0/1 keep mask, D = rowsum(dO * O)): a = 1/(1-p), c = 1 right
  dV = b * (P*Z)^T dO                                                                  : b = 1/(1-p) right
"""
import json
import os
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, os.pardir, "python"), os.path.join(HERE, os.pardir, "tests", "python")]


def child(case):
    import torch
    from attention_reference import attention_grad_reference, attention_reference, dropout_keep
    from meshfuse import DataType, FusionDefinition

    b, h, sq, skv, d = case["shape"]
    p, causal = case["p"], case["causal"]
    rng = np.random.default_rng(22)
    host = [rng.standard_normal(s).astype(np.float32) for s in ([b, h, sq, d], [b, h, skv, d], [b, h, skv, d],
                                                              [b, h, sq, d])]
    dev = [torch.from_numpy(x).to(torch.bfloat16).cuda() for x in host]
    with FusionDefinition() as fd:
        q, k, v, go = (fd.define_tensor(list(x.shape), dtype=DataType.BFloat16) for x in host)
        out, lse, seed, offset = fd.ops.sdpfa_fwd(q, k, v, dropout_p=p, is_causal=causal)
        grads = fd.ops.sdpfa_bwd(go, q, k, v, out, lse, p, causal, seed, offset)
        for t in (out, lse, seed, offset, *grads):
            fd.add_output(t)
    res = fd.execute(dev)
    torch.cuda.synchronize()
    rq, rk, rv, rgo = (t.double().cpu().numpy() for t in dev)
    keep = dropout_keep([b, h, sq, skv], res[2], res[3], p)
    ref_out, ref_lse, probs = attention_reference(rq, rk, rv, causal, keep=keep, p=p)
    want = attention_grad_reference(rq, rk, rv, rgo, causal, keep=keep, p=p)
    got = [t.double().cpu().numpy() for t in (res[0], res[1], *res[4:])]
    errors = {}
    for name, g, w in zip(("out", "lse", "dq", "dk", "dv"), got, (ref_out, ref_lse, *want)):
        errors[name] = float(np.abs(g - w).max() / max(1.0, np.abs(w).max()))
    scale = 1.0 / np.sqrt(d)
    z = keep.astype(np.float64)
    dpd = rgo @ np.swapaxes(rv, -1, -2)
    dsum = (rgo * ref_out).sum(-1, keepdims=True)
    x1 = (probs * z * dpd) @ rk * scale
    x2 = (probs * dsum) @ rk * scale
    (a, c), *_ = np.linalg.lstsq(np.stack([x1.ravel(), -x2.ravel()], 1), got[2].ravel(), rcond=None)
    y = np.swapaxes(probs * z, -1, -2) @ rgo
    bv = float((y * got[4]).sum() / (y * y).sum())
    return {"errors": errors, "fit": {"a": float(a), "c": float(c), "b": bv, "keep_scale": 1 / (1 - p)}}


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        print("RESULT " + json.dumps(child(json.loads(sys.argv[2]))), flush=True)
        return
    strategies = ("rescaled-o", "scale-inv", "plain")
    cases = []
    for shape, causals in (([1, 2, 64, 64, 64], (False, True)), ([2, 3, 200, 330, 64], (False,))):
        for causal in causals:
            for width, how in (("narrow", ""),) + tuple(("byte", how) for how in strategies):
                cases.append({"shape": shape, "p": 0.2, "causal": causal, "width": width, "how": how})
    # The float64 tests' bounds (tests/python/test_attention.py), relative to max(1, |largest|).
    bounds = {"out": 2e-2, "lse": 1e-3, "dq": 1.5e-2, "dk": 1.5e-2, "dv": 1.5e-2}
    passing = set(strategies)
    for case in cases:
        env = dict(os.environ, MESHFUSE_ATTENTION_MASK=case["width"])
        if case["how"]:
            env["MESHFUSE_ATTENTION_BYTE_BACKWARD"] = case["how"]
        label = (f"{'x'.join(map(str, case['shape'])):>15} {'causal' if case['causal'] else 'full':>6} "
                 f"{case['width']:>6} {case['how'] or '-':>10}")
        try:
            run = subprocess.run([sys.executable, __file__, "--child", json.dumps(case)], env=env,
                                 capture_output=True, text=True, timeout=120)
        except subprocess.TimeoutExpired:
            print(f"{label}  timed out", flush=True)
            passing.discard(case["how"])
            continue
        line = next((ln for ln in run.stdout.splitlines() if ln.startswith("RESULT ")), None)
        if line is None:
            tail = (run.stderr.strip().splitlines() or ["no output"])[-1]
            print(f"{label}  FAILED: {tail[:150]}", flush=True)
            passing.discard(case["how"])
            continue
        r = json.loads(line[len("RESULT "):])
        e, f = r["errors"], r["fit"]
        if any(e[k] >= bound for k, bound in bounds.items()):
            passing.discard(case["how"])
        print(f"{label}  err " + " ".join(f"{k} {v:.3g}" for k, v in e.items()) +
              f"  fit a {f['a']:.4f} c {f['c']:.4f} b {f['b']:.4f} (keep scale {f['keep_scale']:.4f})", flush=True)
    # The byte-backward strategies right in every case, first the one dropout_mask.h prefers.
    print("PASSING: " + " ".join(how for how in strategies if how in passing), flush=True)


if __name__ == "__main__":
    main()
