"""The GPT-3-style transformer layer (meshfuse.models.transformer), forward and backward, under a
schedule: prints this rank's lowered host programs (their communications are the schedule's) and the
error of the layer's output and input gradient, assembled from every rank's part (gather_tensor),
against a float64 numpy layer.

    mpirun -np 2 .venv/bin/python examples/transformer.py --schedule tp
    mpirun -np 4 .venv/bin/python examples/transformer.py --schedule dp_tp [--backend gloo]
"""
import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "python"))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "tests", "python"))

from meshfuse import CommunicatorBackend, DataType  # noqa: E402
from meshfuse.models import (BACKWARD_OUTPUTS, FORWARD_OUTPUTS, PARAMETERS, SCHEDULES,  # noqa: E402
                             TransformerBackward, TransformerConfig, TransformerForward, mesh_for, shard_inputs)
from meshfuse.multidevice import Communicator, gather_tensor, shard_tensor  # noqa: E402
import transformer_reference as ref  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--schedule", choices=SCHEDULES, default="tp")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--sequence", type=int, default=16)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=32)
    ap.add_argument("--backend", default="auto", choices=list(CommunicatorBackend.__members__))
    args = ap.parse_args()
    comm = Communicator.instance()
    schedule = args.schedule if comm.size > 1 else "none"
    cfg = TransformerConfig(batch=args.batch, sequence=args.sequence, heads=args.heads, hidden=args.hidden,
                            dtype=DataType.Float, dropout_p=0.1, attention_dropout_p=0.0)
    mesh = mesh_for(schedule, comm.size) if schedule != "none" else None
    backend = getattr(CommunicatorBackend, args.backend)
    fwd = TransformerForward(cfg, mesh, schedule, backend_type=backend)
    bwd = TransformerBackward(cfg, mesh, schedule, backend_type=backend)
    rng = np.random.default_rng(0)
    arrays = {n: (rng.standard_normal(s) * 0.3).astype(np.float32) for n, s in cfg.parameter_shapes().items()}
    arrays["x"] = rng.standard_normal((cfg.batch, cfg.sequence, cfg.hidden)).astype(np.float32)
    arrays["grad_out"] = rng.standard_normal(arrays["x"].shape).astype(np.float32)
    outs = dict(zip(FORWARD_OUTPUTS, fwd.execute(shard_inputs(fwd, arrays, comm.rank))))
    local = {n: outs[n] if n in outs else shard_tensor(arrays[n], bwd.tensors[n], comm.rank)
             for n in bwd.input_names()}
    grads = dict(zip(BACKWARD_OUTPUTS, bwd.execute([local[n] for n in bwd.input_names()])))
    if comm.rank == 0:
        print(f"== forward host program ({schedule}, {comm.size} ranks, rank 0)\n{fwd.host_ir()}")
        print(f"== backward host program\n{bwd.host_ir()}")
    # Each rank holds its part of the outputs; gather_tensor assembles the global arrays from them, by
    # where execute says each output lives (fd.output_shardings()), to compare with the float64 layer.
    whole = {n: gather_tensor(outs[n], tv) for n, tv in zip(FORWARD_OUTPUTS, fwd.output_shardings())}
    grad_x = gather_tensor(grads["grad_x"], bwd.output_shardings()[0])
    p64 = {n: arrays[n].astype(np.float64) for n in PARAMETERS}
    m1, m2 = whole["attn_dropout_mask"], whole["mlp_dropout_mask"]
    r = ref.forward(arrays["x"].astype(np.float64), p64, m1, m2, cfg)
    g = ref.backward(arrays["grad_out"].astype(np.float64), arrays["x"].astype(np.float64), p64, m1, m2, cfg)
    err = max(np.abs(whole["out"] - r["out"]).max(), np.abs(grad_x - g["grad_x"]).max())
    print(f"rank {comm.rank}: max |error| of out and grad_x against float64 numpy: {err:.2e}")

if __name__ == "__main__":
    main()
