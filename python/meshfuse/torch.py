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
import dataclasses
import functools

import numpy as np
import torch

from . import DataType, FusionDefinition, ParallelType
from .models import transformer as _tf
from .multidevice import Communicator, shard_tensor

_TORCH_DTYPE = {"Float": torch.float32, "Double": torch.float64, "BFloat16": torch.bfloat16, "Half": torch.float16}


_MESH_TYPES = (ParallelType.mesh_x, ParallelType.mesh_y, ParallelType.mesh_z)


@functools.lru_cache(maxsize=64)
def _mesh_dim_sum(mesh, parallel):
    """A [team size] vector sharded along `parallel`, summed: an allreduce over each team along that
    dim. Defined once per (mesh, dim), so that clipping every step does not lower it again."""
    size = mesh.size_along(parallel)
    with FusionDefinition() as fd:
        slots = fd.define_tensor([size], DataType.Double)
        fd.add_output(fd.ops.sum(slots, [0]))
        slots.set_device_mesh(mesh)
        slots.outer_split(0, size)
        slots.axis(0).parallelize(parallel)
    return fd


def _sum_over_mesh_dim(value, mesh, parallel):
    """The sum of `value` over the ranks of this rank's team along `parallel` (every rank of the mesh
    calls it)."""
    return float(_mesh_dim_sum(mesh, parallel).execute([np.array([value], np.float64)])[0])


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
        forward_fusion, backward_fusion = layer.fusions()  # the training or the evaluation pair
        # The dropout masks' Philox offset from torch's (CPU) generator, as nvFuser takes torch's: a
        # recomputation under torch.utils.checkpoint, which restores that generator's state, drops the
        # same elements as the forward it replays (meshfuse's own counter would draw new masks, and
        # the gradients would be those of another forward). Ranks agree on the largest offset.
        rng_offset = int(torch.randint(0, 2 ** 52, (1,)).item()) if layer.training else None
        try:
            outs = forward_fusion.execute([_plain(x)] + [_plain(p) for p in params], rng_offset=rng_offset)
        except ValueError as error:  # raised on every rank alike: so is the hint
            if "(input 0, x) axis" in str(error) and "expected extent" in str(error):
                raise ValueError(f"{error} (TransformerConfig's batch={layer.cfg.batch} and sequence="
                                 f"{layer.cfg.sequence} fix the layer's input shape: a batch of another size, the "
                                 f"last partial one of a DataLoader say, needs drop_last=True or a layer for it)") \
                    from None
            raise
        named = dict(zip(_tf.FORWARD_OUTPUTS, outs))
        ctx.backward_fusion, ctx.layer = backward_fusion, layer
        arrays = {"x": x, **dict(zip(_tf.PARAMETERS, params)), **named}
        ctx.saved_names = [n for n in backward_fusion.input_names() if n in arrays]
        ctx.save_for_backward(*[arrays[n] for n in ctx.saved_names])
        # Only on request (keep_last_forward): every activation of the layer, kept past the step, would
        # defeat activation checkpointing and hold memory in inference. Detached: the output that
        # autograd tracks (and its graph) is not kept alive by the layer.
        if layer.keep_last_forward:
            layer.last_forward = {n: t.detach() for n, t in named.items()}
        return named["out"]

    # The backward fusion is not itself differentiated: a double backward (a gradient penalty, say)
    # gets torch's error instead of silently zero second-order gradients.
    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out):
        arrays = {n: _plain(t) for n, t in zip(ctx.saved_names, ctx.saved_tensors)}
        arrays["grad_out"] = _plain(grad_out)
        # Only the gradients torch asks for (needs_input_grad follows (layer, x, *params), the order of
        # BACKWARD_OUTPUTS): a frozen parameter's GEMM and allreduce are left out of the fusion.
        wanted = tuple(n for n, need in zip(_tf.BACKWARD_OUTPUTS, ctx.needs_input_grad[1:]) if need)
        fusion = ctx.layer.backward_fusion_for(ctx.backward_fusion, wanted)
        inputs = [arrays[n] for n in fusion.input_names()]
        try:
            grads = dict(zip(fusion.output_names(), fusion.execute(inputs)))
        except ValueError as error:
            if "definitions differ" not in str(error):
                raise
            raise ValueError(f"TransformerLayer: the ranks want different gradients (this rank: {list(wanted)}): "
                             f"x's requires_grad and the frozen parameters must be the same on every rank, as "
                             f"their backward is one collective program. {error}") from None
        return (None,) + tuple(grads.get(n) for n in _tf.BACKWARD_OUTPUTS)


class TransformerLayer(torch.nn.Module):
    """One transformer layer (meshfuse.models.transformer) with parameters as this rank's shards.

    In evaluation mode (`layer.eval()`) it drops nothing: it runs a second pair of fusions, built on
    first use, whose dropout probabilities are 0 (the masks it returns then keep everything)."""

    def __init__(self, cfg, schedule="none", mesh=None, init_seed=0, backend=None, keep_last_forward=False):
        super().__init__()
        # keep_last_forward: keep the last forward's outputs (activations, dropout masks) in
        # layer.last_forward, for inspection; off by default, as torch modules keep nothing.
        self.keep_last_forward = bool(keep_last_forward)
        comm = Communicator.instance()
        self.cfg, self.schedule, self.rank, self.backend = cfg, schedule, comm.rank, backend
        self.mesh = mesh if mesh is not None or schedule == "none" else _tf.mesh_for(schedule, comm.size)
        # Every rank holds shards of the parameters: a mesh without some ranks (a script written for
        # another world size) left those without parameters (a TypeError deep in numpy) and the others
        # waiting for them in the first collective.
        if self.mesh is not None and sorted(self.mesh.devices) != list(range(comm.size)):
            raise ValueError(f"TransformerLayer: the mesh {self.mesh!r} must hold every rank of the world "
                             f"(0..{comm.size - 1}), once: mesh_for(schedule, world_size) gives one")
        self.forward_fusion, self.backward_fusion = self._make_fusions(cfg)
        self._eval_fusions, self._backward_subsets = None, {}
        self.forward_fusion._ensure_defined()
        self.last_forward = None
        dtype = _TORCH_DTYPE[cfg.dtype.name]
        for name, array in self.initial_parameters(cfg, init_seed).items():
            local = shard_tensor(array, self.forward_fusion.tensors[name], self.rank)
            self.register_parameter(name, torch.nn.Parameter(torch.from_numpy(np.ascontiguousarray(local)).to(dtype)))

    def _make_fusions(self, cfg):
        kwargs = {} if self.backend is None else {"backend_type": self.backend}
        return (_tf.TransformerForward(cfg, self.mesh, self.schedule, **kwargs),
                _tf.TransformerBackward(cfg, self.mesh, self.schedule, **kwargs))

    def fusions(self):
        """The (forward, backward) FusionDefinitions this mode runs: with the configuration's dropout
        when training, without any in evaluation mode."""
        if self.training:
            return self.forward_fusion, self.backward_fusion
        if self._eval_fusions is None:
            self._eval_fusions = self._make_fusions(
                dataclasses.replace(self.cfg, dropout_p=0.0, attention_dropout_p=0.0))
        return self._eval_fusions

    def backward_fusion_for(self, backward_fusion, wanted):
        """`backward_fusion` (this mode's) restricted to the gradients named in `wanted`, built once
        per subset. Every rank must want the same ones (the same parameters frozen): the definitions
        would differ otherwise, and execute says so on every rank."""
        if wanted == backward_fusion.output_names():
            return backward_fusion
        key = (backward_fusion.cfg, wanted)
        if key not in self._backward_subsets:
            kwargs = {} if self.backend is None else {"backend_type": self.backend}
            self._backward_subsets[key] = _tf.TransformerBackward(backward_fusion.cfg, self.mesh, self.schedule,
                                                                   outputs=wanted, **kwargs)
        return self._backward_subsets[key]

    # Pickling (torch.save(layer), multiprocessing) and copy.deepcopy: the fusions hold C++ objects
    # that neither pickle nor copy; they are left out and rebuilt from the configuration, schedule and
    # mesh. Everything else is copied as for any torch module (parameters, buffers, hooks, attributes,
    # a subclass's own); a custom __deepcopy__ that built a fresh layer lost all of those.
    _UNPICKLED = ("forward_fusion", "backward_fusion", "_eval_fusions", "_backward_subsets", "last_forward")

    def __getstate__(self):
        return {k: v for k, v in self.__dict__.items() if k not in self._UNPICKLED}

    def __setstate__(self, state):
        rank = Communicator.instance().rank
        if state["schedule"] != "none" and state["rank"] != rank:
            raise ValueError(f"TransformerLayer: this layer holds rank {state['rank']}'s parameter shards and is "
                             f"being loaded on rank {rank}: load on each rank the layer that rank saved")
        self.__dict__.update(state)
        self.__dict__.setdefault("keep_last_forward", False)  # saved before it existed
        self.forward_fusion, self.backward_fusion = self._make_fusions(self.cfg)
        self.forward_fusion._ensure_defined()
        self._eval_fusions, self._backward_subsets, self.last_forward = None, {}, None

    # A state_dict holds this rank's shards: it records the rank and schedule (torch's extra state, a
    # plain dict that loads with weights_only=True), and loading it on another rank of a sharded
    # layer is an error. Loaded silently, rank 1 computed with rank 0's blocks, and the allreduced
    # output was wrong on every rank.
    def get_extra_state(self):
        return {"rank": self.rank, "schedule": self.schedule}

    def set_extra_state(self, state):
        if not isinstance(state, dict) or "rank" not in state:
            raise ValueError(f"TransformerLayer: the state_dict's extra state {state!r} is not a TransformerLayer's")
        if state.get("schedule") != self.schedule:
            raise ValueError(f"TransformerLayer: the state_dict was saved by a layer with schedule "
                             f"{state.get('schedule')!r}, this layer's is {self.schedule!r}")
        if self.schedule != "none" and state["rank"] != self.rank:
            raise ValueError(f"TransformerLayer: this state_dict holds rank {state['rank']}'s parameter shards and "
                             f"is being loaded on rank {self.rank}: load on each rank the state_dict that rank saved")

    def clip_grad_norm_(self, max_norm):
        """torch.nn.utils.clip_grad_norm_ for the sharded layer: scales every gradient by
        min(1, max_norm / (norm + 1e-6)) where norm is the 2-norm of the whole model's gradient, and
        returns that norm (a float64 tensor, equal on every rank). Each sharded gradient's squares are
        summed over the ranks that hold its blocks (one allreduce per mesh dimension that shards
        some), each replicated one counted once: torch's own clip_grad_norm_ on a rank sees only its
        shards, so tensor-parallel ranks would clip their replicated LayerNorm parameters by
        different factors and drift apart. A collective over the layer's mesh: call it on every rank."""
        if isinstance(max_norm, bool) or not isinstance(max_norm, (int, float)) or not max_norm > 0:
            raise ValueError(f"clip_grad_norm_: max_norm must be a positive number, got {max_norm!r}")
        grads = {n: getattr(self, n).grad for n in _tf.PARAMETERS if getattr(self, n).grad is not None}
        squares = {}  # the mesh dimension a gradient is sharded along (None: replicated) -> its local sum of squares
        for name, grad in grads.items():
            tv = self.forward_fusion.tensors[name]
            dims = [p for p in _MESH_TYPES if tv.device_mesh is not None and tv.sharded_axis(p) >= 0]
            if len(dims) > 1:
                raise NotImplementedError(f"clip_grad_norm_: {name} is sharded along several mesh dimensions")
            key = dims[0] if dims else None
            squares[key] = squares.get(key, 0.0) + float(grad.detach().double().pow(2).sum())
        total = squares.pop(None, 0.0)
        for parallel in _MESH_TYPES:  # the same order on every rank: each is a collective over the mesh
            if self.mesh is not None and self.mesh.size_along(parallel) > 1 and self._shards_along(parallel):
                total += _sum_over_mesh_dim(squares.get(parallel, 0.0), self.mesh, parallel)
            else:  # along a dim of one device a shard is the whole gradient
                total += squares.get(parallel, 0.0)
        norm = torch.tensor(total, dtype=torch.float64).sqrt()
        scale = max_norm / (float(norm) + 1e-6)
        if scale < 1.0:
            with torch.no_grad():
                for grad in grads.values():
                    grad.mul_(scale)
        return norm

    def _shards_along(self, parallel):
        tv = self.forward_fusion.tensors
        return any(tv[n].device_mesh is not None and tv[n].sharded_axis(parallel) >= 0 for n in _tf.PARAMETERS)

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
        """This rank's shard of a global input [b, s, e] (a torch tensor or numpy array) under the
        schedule, a torch tensor in the layer's dtype; a torch input's autograd history carries over."""
        if not isinstance(x, torch.Tensor):
            x = torch.from_numpy(np.ascontiguousarray(x))
        dtype = _TORCH_DTYPE[self.cfg.dtype.name]
        return shard_tensor(x, self.forward_fusion.tensors["x"], self.rank).to(dtype)

    def forward(self, x):
        forward_fusion = self.fusions()[0]
        try:
            x = self._checked_input(x)
        except TypeError as error:
            # The other ranks are (or will be) in this fusion's execute: tell them, so that every rank
            # raises this error there instead of pairing its next step with their current one, or
            # waiting for it until the timeout.
            forward_fusion.report_error(error)
            raise
        return _LayerFunction.apply(self, x, *[getattr(self, n) for n in _tf.PARAMETERS])

    def _checked_input(self, x):
        """x as the layer takes it, or a TypeError (raised on this rank only: forward reports it)."""
        if not isinstance(x, torch.Tensor):  # else an AttributeError from deep inside autograd
            raise TypeError(f"TransformerLayer: x must be a torch tensor (this rank's shard of the [b, s, e] input: "
                            f"shard_input() makes it), got {type(x).__name__}")
        # layer.double() or .to(torch.bfloat16) converts the parameters, not the fusions (defined for
        # cfg.dtype): the execute error then blamed x.
        dtype = _TORCH_DTYPE[self.cfg.dtype.name]
        for name in _tf.PARAMETERS:
            if getattr(self, name).dtype != dtype:
                raise TypeError(f"TransformerLayer: parameter {name} is {getattr(self, name).dtype} but the layer's "
                                f"fusions are defined for {dtype} (TransformerConfig.dtype); a module dtype "
                                f"conversion (layer.double(), .to(dtype)) does not redefine them: build the layer "
                                f"with TransformerConfig(dtype=...) instead")
        # Under torch.autocast the layer runs in its own dtype, as torch.amp.custom_fwd(cast_inputs=...)
        # makes an autograd.Function do: the activations autocast hands it (bf16 after an autocast
        # Linear) are cast to cfg.dtype, and the cast is differentiated as usual.
        if x.dtype != dtype and x.is_floating_point() and _autocast_enabled(x.device.type):
            x = x.to(dtype)
        return x


def _autocast_enabled(device_type):
    try:
        return torch.is_autocast_enabled(device_type)
    except TypeError:  # torch < 2.4 has no device argument; CPU has its own query there
        return torch.is_autocast_cpu_enabled() if device_type == "cpu" else torch.is_autocast_enabled()
