"""The README's and the docs' programs on every rank of mpirun -np 2 / 4 (tests/python/test_docs.py
runs them in one process): each rank's result is its block of the float64 reference."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir))

import doc_blocks  # noqa: E402


def test_readme_first_program_matches_numpy_on_every_rank(capsys):
    doc_blocks.check_readme_first_program(capsys)


def test_design_example_matches_numpy_on_every_rank(capsys):
    doc_blocks.check_design_example(capsys)


def test_transformer_doc_program_matches_float64_layer_on_every_rank(capsys):
    doc_blocks.check_transformer_program(capsys)
