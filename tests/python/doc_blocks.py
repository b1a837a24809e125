"""The ```python blocks of the repository's Markdown files, so that tests can run what the README and the
docs show a newcomer (test_docs.py, mp/test_docs_mp.py)."""
import os
import re

import numpy as np

REPOSITORY = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir))
_BLOCK = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)


def python_blocks(markdown_path):
    """Every ```python block of `markdown_path` (relative to the repository), in order."""
    with open(os.path.join(REPOSITORY, markdown_path), encoding="utf-8") as f:
        return _BLOCK.findall(f.read())


def readme_first_program():
    """The README's "A first program" block: the first Python a newcomer runs."""
    blocks = python_blocks("README.md")
    assert blocks, "README.md has no ```python block"
    return blocks[0]


def run_block(code, **names):
    """Runs `code` as a script would (its own globals, `names` predefined) and returns its globals."""
    namespace = {"__name__": "__doc_block__", **names}
    exec(compile(code, "<doc block>", "exec"), namespace)  # noqa: S102: the repository's own docs
    return namespace


def _relu_linear_reference(x, w):
    return np.maximum(x.astype(np.float64) @ w.astype(np.float64).T, 0.0)


def _column_block(a, rank, size):
    cols = a.shape[1] // size
    return a[:, rank * cols:(rank + 1) * cols]


def check_readme_first_program(capsys):
    """README's first program: its y_local is this rank's columns of relu(x w^T), and it prints the host IR."""
    from meshfuse.multidevice import Communicator
    comm = Communicator.instance()
    ns = run_block(readme_first_program())
    whole = _relu_linear_reference(ns["x_np"], ns["w_np"])
    np.testing.assert_allclose(ns["y_local"], _column_block(whole, comm.rank, comm.size), rtol=1e-4, atol=1e-3)
    assert "LaunchSegment" in capsys.readouterr().out, "the README says it prints this rank's host program"
    # The next block: where y lives, and y assembled from every rank's columns.
    ns = run_block(python_blocks("README.md")[1], **{k: v for k, v in ns.items() if not k.startswith("__")})
    assert capsys.readouterr().out.split() == ["1"], "the README says y is split on axis 1"
    np.testing.assert_allclose(ns["y"], whole, rtol=1e-4, atol=1e-3)


def check_design_example(capsys):
    """docs/design.md's example, given the x_np and w_local_np it leaves to the reader; after its last
    line (set_backend(gloo)) the next execution's program runs on Gloo where Gloo is built."""
    import meshfuse
    from meshfuse.multidevice import Communicator
    comm = Communicator.instance()
    code = python_blocks("docs/design.md")[0]
    rng = np.random.default_rng(1)
    x_np = rng.standard_normal((6, 1024)).astype(np.float32)
    w_np = rng.standard_normal((4096, 1024)).astype(np.float32)
    rows = 4096 // comm.size
    gloo = meshfuse.CommunicatorBackend.gloo in meshfuse.available_backends()
    if not gloo:
        code = code.replace("fd.set_backend(CommunicatorBackend.gloo)", "pass")
    ns = run_block(code, x_np=x_np, w_local_np=w_np[comm.rank * rows:(comm.rank + 1) * rows])
    expected = _column_block(_relu_linear_reference(x_np, w_np), comm.rank, comm.size)
    np.testing.assert_allclose(ns["y_local"], expected, rtol=1e-4, atol=1e-3)
    assert "LaunchSegment" in capsys.readouterr().out
    if gloo:
        (again,) = ns["fd"].execute([x_np, w_np[comm.rank * rows:(comm.rank + 1) * rows]])
        np.testing.assert_allclose(again, expected, rtol=1e-4, atol=1e-3)


def check_transformer_program(capsys):
    """docs/transformer.md's program: the TP layer's replicated output equals the float64 numpy layer's,
    computed with the dropout masks (residual and attention) the forward returns."""
    import transformer_reference as ref
    from philox_reference import dropout_keep
    from meshfuse.models import PARAMETERS
    ns = run_block(python_blocks("docs/transformer.md")[0])
    cfg, outs, arrays = ns["cfg"], ns["outs"], ns["global_arrays"]
    assert outs["out"].shape == (cfg.batch, cfg.sequence, cfg.hidden)
    assert str(outs["out"].shape) in capsys.readouterr().out
    akeep = dropout_keep([cfg.batch, cfg.heads, cfg.sequence, cfg.sequence], outs["sdpa_seed"], outs["sdpa_offset"],
                         cfg.sdpa_dropout_p)
    p64 = {n: arrays[n].astype(np.float64) for n in PARAMETERS}
    r = ref.forward(arrays["x"].astype(np.float64), p64, outs["attn_dropout_mask"], outs["mlp_dropout_mask"], cfg,
                    akeep)
    np.testing.assert_allclose(outs["out"], r["out"], rtol=2e-4, atol=2e-4)
