"""meshfuse.torch.TransformerLayer's autograd wrapper: a training step leaves nothing allocated
behind (no reference cycle through the autograd context), and its gradients match the fusions'."""
import gc

import numpy as np
import pytest

from meshfuse import DataType, _C
from meshfuse.models import BACKWARD_OUTPUTS, PARAMETERS, TransformerConfig

torch = pytest.importorskip("torch")


def _layer_and_input(keep_last_forward=True):
    from meshfuse.torch import TransformerLayer
    cfg = TransformerConfig(batch=2, sequence=16, heads=2, hidden=32, dtype=DataType.Float, dropout_p=0.1)
    layer = TransformerLayer(cfg, keep_last_forward=keep_last_forward)
    x = torch.from_numpy(np.random.default_rng(3).standard_normal((2, 16, 32)).astype(np.float32))
    return layer, x.requires_grad_(True)


def test_a_step_frees_its_activations_without_the_cycle_collector():
    layer, x = _layer_and_input()
    dy = torch.ones_like(x)

    def step():
        layer.zero_grad(set_to_none=True)
        x.grad = None
        layer(x).backward(dy)

    step()
    gc.collect()
    gc.disable()
    try:
        step()
        in_use = _C.cpu_bytes_in_use()
        for _ in range(3):
            step()
            # Only the new gradients and layer.last_forward replace the old ones: nothing accumulates.
            assert _C.cpu_bytes_in_use() == in_use
    finally:
        gc.enable()


def test_gradients_are_the_backward_fusions():
    layer, x = _layer_and_input()
    dy = torch.from_numpy(np.random.default_rng(4).standard_normal(tuple(x.shape)).astype(np.float32))
    layer(x).backward(dy)
    fwd = layer.last_forward
    arrays = {"x": x.detach(), "grad_out": dy, **{n: getattr(layer, n).detach() for n in PARAMETERS}, **fwd}
    grads = dict(zip(BACKWARD_OUTPUTS, layer.backward_fusion.execute(
        [arrays[n] for n in layer.backward_fusion.input_names()])))
    np.testing.assert_array_equal(x.grad.numpy(), grads["grad_x"].numpy())
    for n in PARAMETERS:
        np.testing.assert_array_equal(getattr(layer, n).grad.numpy(), grads["grad_" + n].numpy(), err_msg=n)


def test_bad_inputs_are_clear_errors_naming_x():
    layer, x = _layer_and_input()
    with pytest.raises(TypeError, match="x must be a torch tensor.*got ndarray"):
        layer(x.detach().numpy())
    with pytest.raises(TypeError, match=r"T0 \(input 0, x\): expected dtype Float, got Double"):
        layer(x.detach().double())
    with pytest.raises(ValueError, match=r"T0 \(input 0, x\): expected 3 dimensions"):
        layer(x.detach()[0])


def _grads(layer, x):
    return [x.grad.clone()] + [getattr(layer, n).grad.clone() for n in PARAMETERS]


def test_retain_graph_keeps_the_saved_tensors_for_a_second_backward():
    # torch's semantics: with retain_graph=True a second backward runs and accumulates the same
    # gradients (dropout masks included: they are saved); without it the graph is freed and a
    # further backward is torch's usual error.
    layer, x = _layer_and_input()
    dy = torch.from_numpy(np.random.default_rng(5).standard_normal(tuple(x.shape)).astype(np.float32))
    y = layer(x)
    y.backward(dy, retain_graph=True)
    once = _grads(layer, x)
    assert all(g.abs().max() > 0 for g in once)
    y.backward(dy)
    for name, g1, g2 in zip(["x", *PARAMETERS], once, _grads(layer, x)):
        torch.testing.assert_close(g2, 2 * g1, rtol=0, atol=0, msg=name)
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        y.backward(dy)


def test_a_second_backward_without_retain_graph_is_torchs_error():
    layer, x = _layer_and_input()
    loss = layer(x).sum()
    loss.backward()
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        loss.backward()


@pytest.mark.parametrize("modified", ["x", "fc1_bias"])
def test_a_saved_tensor_modified_in_place_after_the_forward_is_refused(modified):
    # As torch's own ops: the gradients would be those of the modified values, silently wrong.
    layer, x = _layer_and_input()
    x2 = x.detach().clone()
    y = layer(x2)
    with torch.no_grad():
        (x2 if modified == "x" else getattr(layer, modified)).mul_(3.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()


def test_eval_mode_drops_nothing_and_training_mode_drops_again():
    """layer.eval() kept dropping (the fusions have dropout in them): two evaluations differed. Now
    evaluation runs fusions without dropout: the output is the dropout_p=0 layer's, every time."""
    from meshfuse.torch import TransformerLayer
    layer, x = _layer_and_input()
    layer.eval()
    with torch.no_grad():
        first, second = layer(x), layer(x)
    assert bool(layer.last_forward["attn_dropout_mask"].all()) and bool(layer.last_forward["mlp_dropout_mask"].all())
    np.testing.assert_array_equal(first.numpy(), second.numpy())
    plain = TransformerLayer(TransformerConfig(batch=2, sequence=16, heads=2, hidden=32, dtype=DataType.Float,
                                               dropout_p=0.0))
    with torch.no_grad():
        np.testing.assert_allclose(first.numpy(), plain(x).numpy(), rtol=1e-6, atol=1e-6)
    layer.train()
    with torch.no_grad():
        again, more = layer(x), layer(x)
    assert not bool(layer.last_forward["mlp_dropout_mask"].all())
    assert not np.array_equal(again.numpy(), more.numpy()), "training mode drops again, differently each step"


def test_a_double_backward_is_torchs_error_not_zero_gradients():
    """The backward fusion is not differentiated: create_graph=True gave a gradient without history, so
    a gradient penalty's second-order gradients were silently zero."""
    layer, x = _layer_and_input()
    (g,) = torch.autograd.grad(layer(x).pow(2).sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="once_differentiable|differentiate twice"):
        g.pow(2).sum().backward()


def test_deepcopy_gives_an_independent_layer_with_the_same_parameters():
    """copy.deepcopy raised (a Fusion cannot be pickled): EMA copies and the like need it."""
    import copy
    layer, x = _layer_and_input()
    layer.ln0_weight.requires_grad_(False)
    layer.eval()
    twin = copy.deepcopy(layer)
    assert not twin.training and not twin.ln0_weight.requires_grad and twin.fc1_weight.requires_grad
    with torch.no_grad():
        np.testing.assert_array_equal(twin(x).numpy(), layer(x).numpy())
        twin.fc1_weight.add_(1.0)
    assert not torch.equal(twin.fc1_weight, layer.fc1_weight), "the copy's parameters are its own"


def test_deepcopy_keeps_hooks_buffers_attributes_and_subclasses():
    """The layer's own __deepcopy__ built a fresh TransformerLayer: a forward hook, a buffer, an
    attribute and a subclass's parameter were gone from the copy (an EMA copy then computed
    something else, silently), where torch's deepcopy of a module keeps them."""
    import copy
    from meshfuse.torch import TransformerLayer

    class Scaled(TransformerLayer):
        def __init__(self, cfg):
            super().__init__(cfg)
            self.gain = torch.nn.Parameter(torch.tensor(2.0))

        def forward(self, x):
            return super().forward(x) * self.gain

    cfg = TransformerConfig(batch=2, sequence=16, heads=2, hidden=32, dtype=DataType.Float, dropout_p=0.0)
    layer = Scaled(cfg)
    layer.register_buffer("step", torch.tensor(3))
    layer.tag = "ema"
    layer.register_forward_hook(lambda module, args, out: out + 1.0)
    x = torch.from_numpy(np.random.default_rng(5).standard_normal((2, 16, 32)).astype(np.float32))
    twin = copy.deepcopy(layer)
    assert type(twin) is Scaled and twin.tag == "ema" and int(twin.step) == 3
    assert twin.forward_fusion is not layer.forward_fusion
    with torch.no_grad():
        np.testing.assert_array_equal(twin(x).numpy(), layer(x).numpy())  # the hook and the gain, both
        twin.gain.fill_(1.0)
    assert float(layer.gain) == 2.0


def test_a_layer_keeps_no_activations_unless_asked():
    """Every forward's activations stayed in layer.last_forward until the next one: checkpointing saved
    nothing and inference held them all. They are kept only with keep_last_forward=True."""
    layer, x = _layer_and_input(keep_last_forward=False)
    before = _C.cpu_bytes_in_use()
    with torch.no_grad():
        y = layer(x)
    assert layer.last_forward is None
    assert _C.cpu_bytes_in_use() - before <= y.numel() * y.element_size(), "only the output stays"


def test_torch_save_of_the_whole_layer_loads_a_working_layer(tmp_path):
    """torch.save(layer) raised (a DeviceMesh and a Fusion did not pickle): the loaded layer has the
    parameters, mode and gradients' settings, and computes what the saved one does."""
    layer, x = _layer_and_input()
    layer.eval()
    layer.fc2_bias.requires_grad_(False)
    torch.save(layer, tmp_path / "layer.pt")
    # The whole module is a Python object, not a collection of tensors: torch >= 2.6 loads such files
    # only with weights_only=False (the state_dict below loads with torch's default).
    loaded = torch.load(tmp_path / "layer.pt", weights_only=False)
    assert not loaded.training and not loaded.fc2_bias.requires_grad
    for name, param in layer.named_parameters():
        assert torch.equal(param, getattr(loaded, name)), name
    with torch.no_grad():
        np.testing.assert_array_equal(loaded(x).numpy(), layer(x).numpy())
    loaded.train()
    loaded(x).sum().backward()
    assert loaded.fc1_weight.grad is not None and layer.fc1_weight.grad is None


def test_state_dict_round_trip_loads_with_weights_only(tmp_path):
    """The usual checkpoint: torch.save(layer.state_dict()) and load_state_dict into a fresh layer,
    with torch.load's weights_only=True (the default since torch 2.6). The fresh layer computes what
    the saved one does."""
    layer, x = _layer_and_input()
    layer.eval()
    with torch.no_grad():
        layer.fc1_weight.add_(0.25)
    torch.save(layer.state_dict(), tmp_path / "state.pt")
    fresh, _ = _layer_and_input()
    fresh.eval()
    fresh.load_state_dict(torch.load(tmp_path / "state.pt", weights_only=True))
    with torch.no_grad():
        np.testing.assert_array_equal(fresh(x).numpy(), layer(x).numpy())


def test_frozen_parameters_get_no_gradient_and_no_work():
    """Fine-tuning freezes some parameters: their gradients stay None, the others equal a fully
    trainable layer's, and the backward fusion that ran left out the frozen weight's GEMM (it used
    to compute, and under dp allreduce, every gradient and let torch drop the unwanted ones)."""
    layer, x = _layer_and_input()
    twin, _ = _layer_and_input()
    layer.eval(), twin.eval()
    layer(x).sum().backward()
    for name in ("fc1_weight", "fc1_bias", "ln0_bias"):
        getattr(twin, name).requires_grad_(False)
    x2 = x.detach().clone().requires_grad_(True)
    twin(x2).sum().backward()
    for name, param in layer.named_parameters():
        mine = getattr(twin, name)
        if mine.requires_grad:
            assert torch.equal(mine.grad, param.grad), name
        else:
            assert mine.grad is None, name
    assert torch.equal(x2.grad, x.grad)
    (fusion,) = twin._backward_subsets.values()
    assert "grad_fc1_weight" not in fusion.output_names()
    matmuls = [line for line in fusion.host_ir().splitlines() if line.split("(")[0].endswith("matmul")]
    full = [line for line in layer.fusions()[1].host_ir().splitlines() if line.split("(")[0].endswith("matmul")]
    assert len(matmuls) == len(full) - 1, fusion.host_ir()


def test_a_sharded_state_dict_loads_only_on_the_rank_that_saved_it():
    """"Rank 0 saves the state_dict, every rank loads it" gave rank 1 rank 0's shards with no error
    (the shapes match), and the allreduced output was wrong on every rank. The state_dict records
    the rank and schedule (torch's extra state, which loads with weights_only=True)."""
    from meshfuse.torch import TransformerLayer
    cfg = TransformerConfig(batch=1, sequence=4, heads=2, hidden=8, dtype=DataType.Float)
    layer = TransformerLayer(cfg, schedule="tp")  # a world of one: rank 0 of a one-rank mesh
    state = layer.state_dict()
    assert state["_extra_state"] == {"rank": 0, "schedule": "tp"}
    TransformerLayer(cfg, schedule="tp").load_state_dict(state)
    state["_extra_state"] = {"rank": 1, "schedule": "tp"}
    with pytest.raises(ValueError, match="holds rank 1's parameter shards and is being loaded on rank 0"):
        TransformerLayer(cfg, schedule="tp").load_state_dict(state)
    with pytest.raises(ValueError, match="saved by a layer with schedule 'tp', this layer's is 'none'"):
        TransformerLayer(cfg).load_state_dict(state)
    unsharded = TransformerLayer(cfg).state_dict()
    unsharded["_extra_state"]["rank"] = 3  # an unsharded layer's parameters are whole: any rank's do
    TransformerLayer(cfg).load_state_dict(unsharded)


def test_autocast_runs_the_layer_in_its_own_dtype():
    """Under torch.autocast an earlier Linear hands the layer bf16 activations, which failed execute's
    dtype check ("expected dtype Float, got BFloat16"). The layer casts them to its dtype, as
    torch.amp.custom_fwd(cast_inputs=...) does, and the gradient flows through the cast."""
    layer, x = _layer_and_input()
    layer.eval()
    linear = torch.nn.Linear(32, 32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        hidden = linear(x)
        assert hidden.dtype == torch.bfloat16
        y = layer(hidden)
    assert y.dtype == torch.float32
    with torch.no_grad():
        np.testing.assert_array_equal(y.detach().numpy(), layer(hidden.detach().float()).numpy())
    y.sum().backward()
    assert linear.weight.grad is not None and torch.isfinite(linear.weight.grad).all()


def test_a_batch_of_another_size_names_the_config():
    layer, x = _layer_and_input()
    with pytest.raises(ValueError, match=r"axis 0: expected extent 2, got 3.*TransformerConfig's batch=2 and "
                                         r"sequence=16 fix the layer's input shape"):
        layer(torch.zeros(3, 16, 32))


def test_loading_another_ranks_sharded_layer_is_an_error():
    """A sharded layer's parameters are one rank's shards: loaded on another rank they would be the
    wrong blocks, silently; it says to load on each rank what that rank saved."""
    from meshfuse.torch import TransformerLayer
    cfg = TransformerConfig(batch=1, sequence=4, heads=2, hidden=8, dtype=DataType.Float)
    state = TransformerLayer(cfg, schedule="tp").__getstate__()
    state["rank"] = 1
    with pytest.raises(ValueError, match="holds rank 1's parameter shards and is being loaded on rank 0"):
        TransformerLayer.__new__(TransformerLayer).__setstate__(state)


@pytest.mark.parametrize("use_reentrant", [True, False])
def test_activation_checkpointing_replays_the_forwards_dropout_masks(use_reentrant):
    """Under torch.utils.checkpoint the layer runs its forward again in the backward: it drew new
    dropout masks (meshfuse's own counter), so the gradients were those of another forward (0.5
    relative error). The masks' offset comes from torch's generator, which checkpoint restores: the
    checkpointed step equals the plain one, masks, output and gradients."""
    import torch.utils.checkpoint as checkpoint
    layer, x = _layer_and_input()
    results = []
    for wrap in (lambda f, t: f(t), lambda f, t: checkpoint.checkpoint(f, t, use_reentrant=use_reentrant)):
        torch.manual_seed(7)
        x.grad = None
        layer.zero_grad()
        y = wrap(layer, x)
        y.sum().backward()
        results.append((y.detach().clone(), x.grad.clone(), layer.fc1_weight.grad.clone(),
                        layer.last_forward["mlp_dropout_mask"].clone()))
    for plain, checkpointed in zip(*results):
        assert torch.equal(plain, checkpointed)
    assert 0 < results[0][3].float().mean() < 1, "the masks drop something"


def test_shard_input_gives_the_layers_dtype_and_keeps_autograd():
    """shard_input went through numpy: a bf16 tensor raised (numpy has no bf16) and so did a tensor that
    requires grad."""
    from meshfuse.torch import TransformerLayer
    cfg = TransformerConfig(batch=2, sequence=8, heads=2, hidden=8, dtype=DataType.BFloat16)
    layer = TransformerLayer(cfg)
    x = torch.randn(2, 8, 8, dtype=torch.bfloat16, requires_grad=True)
    local = layer.shard_input(x)
    assert local.dtype == torch.bfloat16 and torch.equal(local, x)
    local.float().sum().backward()
    assert x.grad is not None and torch.equal(x.grad, torch.ones_like(x))
    assert layer.shard_input(np.ones((2, 8, 8))).dtype == torch.bfloat16


def test_a_mesh_without_every_rank_or_of_the_wrong_rank_is_a_clear_error():
    from meshfuse.multidevice import DeviceMesh
    from meshfuse.torch import TransformerLayer
    cfg = TransformerConfig(batch=2, sequence=8, heads=2, hidden=8, dtype=DataType.Float)
    with pytest.raises(ValueError, match=r"must hold every rank of the world \(0..0\)"):
        TransformerLayer(cfg, "tp", mesh=DeviceMesh([0, 1]))
    with pytest.raises(ValueError, match="schedule 'tp' runs on a 1-D mesh"):
        TransformerLayer(cfg, "tp", mesh=DeviceMesh([[0]]))
    with pytest.raises(ValueError, match="schedule 'dp_tp' runs on a 2-D mesh"):
        TransformerLayer(cfg, "dp_tp", mesh=DeviceMesh([0]))


def test_a_module_dtype_conversion_is_a_clear_error_naming_the_config():
    """layer.double() converts the parameters, not the fusions: the error blamed x's dtype."""
    layer, x = _layer_and_input()
    layer.double()
    with pytest.raises(TypeError, match=r"parameter ln0_weight is torch.float64 but the layer's fusions are defined "
                                        r"for torch.float32 \(TransformerConfig.dtype\)"):
        layer(x.double())


def test_clip_grad_norm_is_torchs_on_one_rank():
    """The layer's clip_grad_norm_ (the whole model's norm over the ranks' shards; at 2 ranks in
    examples/train_transformer.py, which checks the replicated parameters stay equal) on one rank is
    torch.nn.utils.clip_grad_norm_: the same norm and the same clipped gradients."""
    import copy
    from meshfuse.torch import TransformerLayer
    cfg = TransformerConfig(batch=2, sequence=8, heads=2, hidden=16, dtype=DataType.Float)
    layer = TransformerLayer(cfg, schedule="tp")      # a world of one: the tp mesh is one rank
    x = torch.randn(2, 8, 16, generator=torch.Generator().manual_seed(2))
    torch.manual_seed(0)
    (layer(x) ** 2).sum().backward()
    twin = copy.deepcopy(layer)
    for name, param in layer.named_parameters():  # torch's deepcopy of a Parameter leaves its grad behind
        getattr(twin, name).grad = param.grad.clone()
    expected = torch.nn.utils.clip_grad_norm_(twin.parameters(), 0.5)
    norm = layer.clip_grad_norm_(0.5)
    assert norm.dtype == torch.float64 and abs(float(norm) - float(expected)) < 1e-5 * float(expected)
    assert float(norm) > 0.5, "the test clips"
    for name, param in layer.named_parameters():
        torch.testing.assert_close(param.grad, getattr(twin, name).grad, rtol=1e-6, atol=0)
    for bad in (0, -1.0, True, "1"):
        with pytest.raises(ValueError, match="max_norm must be a positive number"):
            layer.clip_grad_norm_(bad)
