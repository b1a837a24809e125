"""Training meshfuse programs with torch: an autograd.Function that runs a forward FusionDefinition
and, in the backward pass, the matching backward FusionDefinition, and a transformer layer module
built on it, so that a torch optimizer trains the sharded layer.

    layer = TransformerLayer(cfg, schedule="tp")          # this rank's parameter shards
    opt = torch.optim.SGD(layer.parameters(), lr=1e-2)
    y = layer(x_local); loss = ...; loss.backward(); opt.step()

Every rank builds the same global parameters from `init_seed` and keeps its shards, so ranks start
consistent without communication. Parameters are replicated or sharded exactly as the schedule
shards them; the backward fusion returns each gradient with its parameter's sharding (replicated
gradients are identical on every rank, data-parallel ones are already reduced), so a plain
optimizer step keeps the ranks consistent.
"""
import numpy as np
import torch

from .models import transformer as _tf
from .multidevice import Communicator, shard_tensor

_TORCH_DTYPE = {"Float": torch.float32, "Double": torch.float64, "BFloat16": torch.bfloat16, "Half": torch.float16}


def _plain(t):
    """A tensor meshfuse can take through DLPack (no autograd history, contiguous)."""
    return t.detach().contiguous()


class _LayerFunction(torch.autograd.Function):
    # ctx keeps only what the backward fusion reads, never the output: the output's grad_fn is ctx,
    # so ctx -> output -> ctx would be a reference cycle that only Python's cycle collector frees.
    # Each step's activations then stayed allocated for ~20 steps (13 MB a step per rank in the
    # 2-rank benchmark layer), and every step ran on freshly faulted pages instead of the CPU
    # allocator's cached blocks (~3400 page faults a step).
    # The tensors go through save_for_backward, not a ctx attribute: torch then frees them after a
    # backward without retain_graph (and refuses a second one), keeps them for one with it, and
    # refuses a backward whose inputs or parameters were modified in place since the forward.
    @staticmethod
    def forward(ctx, layer, x, *params):
        outs = layer.forward_fusion.execute([_plain(x)] + [_plain(p) for p in params])
        named = dict(zip(_tf.FORWARD_OUTPUTS, outs))
        ctx.layer = layer
        arrays = {"x": x, **dict(zip(_tf.PARAMETERS, params)), **named}
        ctx.saved_names = [n for n in layer.backward_fusion.input_names() if n in arrays]
        ctx.save_for_backward(*[arrays[n] for n in ctx.saved_names])
        # Detached: the output that autograd tracks (and its graph) is not kept alive by the layer.
        layer.last_forward = {n: t.detach() for n, t in named.items()}
        return named["out"]

    @staticmethod
    def backward(ctx, grad_out):
        layer = ctx.layer
        arrays = {n: _plain(t) for n, t in zip(ctx.saved_names, ctx.saved_tensors)}
        arrays["grad_out"] = _plain(grad_out)
        inputs = [arrays.pop(n) for n in layer.backward_fusion.input_names()]
        grads = dict(zip(_tf.BACKWARD_OUTPUTS, layer.backward_fusion.execute(inputs)))
        return (None, grads["grad_x"]) + tuple(grads["grad_" + n] for n in _tf.PARAMETERS)


class TransformerLayer(torch.nn.Module):
    """One transformer layer (meshfuse.models.transformer) with parameters as this rank's shards."""

    def __init__(self, cfg, schedule="none", mesh=None, init_seed=0, backend=None):
        super().__init__()
        comm = Communicator.instance()
        self.cfg, self.schedule, self.rank = cfg, schedule, comm.rank
        self.mesh = mesh if mesh is not None or schedule == "none" else _tf.mesh_for(schedule, comm.size)
        kwargs = {} if backend is None else {"backend_type": backend}
        self.forward_fusion = _tf.TransformerForward(cfg, self.mesh, schedule, **kwargs)
        self.backward_fusion = _tf.TransformerBackward(cfg, self.mesh, schedule, **kwargs)
        self.forward_fusion._ensure_defined()
        self.last_forward = None
        dtype = _TORCH_DTYPE[cfg.dtype.name]
        for name, array in self.initial_parameters(cfg, init_seed).items():
            local = shard_tensor(array, self.forward_fusion.tensors[name], self.rank)
            self.register_parameter(name, torch.nn.Parameter(torch.from_numpy(np.ascontiguousarray(local)).to(dtype)))

    @staticmethod
    def initial_parameters(cfg, seed):
        """Global parameters (GPT-2 style: N(0, 0.02) weights, zero biases, unit LayerNorm weights)."""
        rng = np.random.default_rng(seed)
        params = {}
        for name, shape in cfg.parameter_shapes().items():
            if name.startswith("ln") and name.endswith("weight"):
                params[name] = np.ones(shape, np.float32)
            elif name.endswith("bias"):
                params[name] = np.zeros(shape, np.float32)
            else:
                params[name] = (rng.standard_normal(shape) * 0.02).astype(np.float32)
        return params

    def shard_input(self, x):
        """This rank's shard of a global input [b, s, e] under the schedule."""
        return torch.as_tensor(np.ascontiguousarray(shard_tensor(x, self.forward_fusion.tensors["x"], self.rank)))

    def forward(self, x):
        if not isinstance(x, torch.Tensor):  # else an AttributeError from deep inside autograd
            raise TypeError(f"TransformerLayer: x must be a torch tensor (this rank's shard of the [b, s, e] input: "
                            f"shard_input() makes it), got {type(x).__name__}")
        return _LayerFunction.apply(self, x, *[getattr(self, n) for n in _tf.PARAMETERS])
