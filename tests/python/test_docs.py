"""The Python the README and the docs show a newcomer runs as written and computes what it claims (one
process here; mp/test_docs_mp.py runs the same checks on 2 and 4 ranks, on every rank)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import doc_blocks  # noqa: E402

MARKDOWN = ("README.md", "docs/design.md", "docs/transformer.md", "docs/overlap.md", "docs/cluster.md")


def test_every_python_block_compiles():
    blocks = [(path, code) for path in MARKDOWN for code in doc_blocks.python_blocks(path)]
    assert len(blocks) >= 6
    for path, code in blocks:
        compile(code, path, "exec")


def test_readme_first_program_matches_numpy(capsys):
    doc_blocks.check_readme_first_program(capsys)


def test_design_example_matches_numpy_and_switches_backend(capsys):
    doc_blocks.check_design_example(capsys)


def test_transformer_doc_program_matches_float64_layer(capsys):
    doc_blocks.check_transformer_program(capsys)
