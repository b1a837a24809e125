"""Trains one tensor-parallel transformer layer with a torch optimizer (meshfuse.torch) on a toy
regression: the target is a fixed random linear map of the input. Every rank holds its parameter
shards; the loss (of replicated outputs) is the same on every rank and falls.

    mpirun -np 2 /usr/bin/python3 examples/train_transformer.py --steps 50

(torch comes from Debian's python3-torch, which Debian's /usr/bin/python3 sees.)"""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "python"))

import torch  # noqa: E402

from meshfuse import DataType  # noqa: E402
from meshfuse.models import TransformerConfig  # noqa: E402
from meshfuse.multidevice import Communicator  # noqa: E402
from meshfuse.torch import TransformerLayer  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--clip", type=float, default=1.0, help="the whole model's gradient norm is clipped to this")
    args = ap.parse_args()
    comm = Communicator.instance()
    cfg = TransformerConfig(batch=4, sequence=16, heads=4, hidden=32, dtype=DataType.Float, dropout_p=0.0)
    layer = TransformerLayer(cfg, schedule="tp" if comm.size > 1 else "none", init_seed=0)
    gen = torch.Generator().manual_seed(1)  # the same data on every rank
    x = torch.randn(cfg.batch, cfg.sequence, cfg.hidden, generator=gen)
    target = x @ (torch.randn(cfg.hidden, cfg.hidden, generator=gen) / cfg.hidden ** 0.5)
    opt = torch.optim.Adam(layer.parameters(), lr=args.lr)
    losses = []
    for step in range(args.steps):
        opt.zero_grad()
        loss = ((layer(x) - target) ** 2).mean()
        loss.backward()
        # torch.nn.utils.clip_grad_norm_ would see only this rank's shards; the layer's own takes the
        # norm over the whole model, so the ranks clip alike and their replicated parameters stay equal.
        layer.clip_grad_norm_(args.clip)
        opt.step()
        losses.append(float(loss))
        if comm.rank == 0 and (step % 10 == 0 or step == args.steps - 1):
            print(f"step {step:3d}  loss {losses[-1]:.5f}")
    # The check the tests rely on: half the loss in 50 steps (fewer steps need only a fall).
    target = 0.5 * losses[0] if args.steps >= 50 else losses[0]
    if losses[-1] >= target:
        raise SystemExit(f"rank {comm.rank}: the loss did not fall enough: {losses[0]:.4f} -> {losses[-1]:.4f}")
    # Replicated parameters (the LayerNorms', the row-parallel biases) are the same on every rank.
    for name in ("ln0_weight", "ln1_weight", "out_bias"):
        rows = gather_rows(getattr(layer, name).detach(), comm)
        if not all(torch.equal(rows[0], r) for r in rows):
            raise SystemExit(f"rank {comm.rank}: replicated parameter {name} differs between ranks")
    print(f"rank {comm.rank}: loss {losses[0]:.4f} -> {losses[-1]:.4f} in {args.steps} steps")


def gather_rows(value, comm):
    """Every rank's copy of a replicated 1-D parameter, by a meshfuse allgather over the world."""
    from meshfuse import FusionDefinition, ParallelType
    from meshfuse.multidevice import DeviceMesh
    mesh = DeviceMesh(range(comm.size))
    with FusionDefinition() as fd:
        rows = fd.define_tensor([comm.size, value.numel()], DataType.Float)
        whole = fd.ops.set(rows)
        fd.add_output(whole)
        rows.set_device_mesh(mesh)
        rows.outer_split(0, comm.size)
        rows.axis(0).parallelize(ParallelType.mesh_x)
        whole.set_device_mesh(mesh)
    return list(fd.execute([value.reshape(1, -1).contiguous()])[0])


if __name__ == "__main__":
    main()
