"""The MESHFUSE_* variables of README's table, checked at import (meshfuse/_settings.py): a value the
library would ignore warns, naming what the variable takes; the table in the code and README's stay
one list."""
import os
import re
import subprocess
import sys

import pytest

from meshfuse import _settings

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir, os.pardir))


def readme_variables():
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        rows = [line for line in f if line.startswith("| `MESHFUSE_")]
    return {name for row in rows for name in re.findall(r"`(MESHFUSE_[A-Z0-9_]+)`", row.split(" | ")[0])}


def test_every_readme_variable_is_checked_and_every_checked_one_documented():
    assert readme_variables() == set(_settings.SETTINGS)


@pytest.mark.parametrize("name,bad,good", [
    ("MESHFUSE_DEBUG", "DEBUG", "info"),
    ("MESHFUSE_UCC_PROGRESS_THREAD", "true", "1"),
    ("MESHFUSE_ABORT_ON_TIMEOUT", "banana", "0"),
    ("MESHFUSE_ABORT_ON_EXCEPTION", "banana", " Off "),
    ("MESHFUSE_TRACE_HOST", "yes", "1"),
    ("MESHFUSE_CPU_GEMM", "bogus", "openblas"),
    ("MESHFUSE_MATMUL_EPILOGUES", "bogus", "0"),
    ("MESHFUSE_MATMUL_AUTOTUNE", "1", "16"),
    ("MESHFUSE_OVERLAP_SM_MARGIN", "-2", "8"),
    ("MESHFUSE_NORM_AUTOTUNE", "always", "split"),
    ("MESHFUSE_ATTENTION_RNG", "torch", "meshfuse"),
])
def test_a_value_meshfuse_ignores_is_named_and_a_meaningful_one_passes(name, bad, good):
    [(got_name, got_value, expected)] = _settings.ignored_settings({name: bad})
    assert (got_name, got_value) == (name, bad) and expected
    assert _settings.ignored_settings({name: good}) == []
    assert _settings.ignored_settings({name: ""}) == []  # empty is unset
    assert _settings.ignored_settings({"MESHFUSE_TRACE": "/any/path", "MESHFUSE_GLOO_IFACE": "eth7"}) == []


def test_importing_meshfuse_warns_about_an_ignored_value():
    env = dict(os.environ, MESHFUSE_DEBUG="DEBUG", PYTHONPATH=os.path.join(ROOT, "python"))
    env.pop("MESHFUSE_UCC_PROGRESS_THREAD", None)
    done = subprocess.run([sys.executable, "-W", "always", "-c", "import meshfuse"], env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "SettingWarning: MESHFUSE_DEBUG='DEBUG' is not a value meshfuse knows (info, warn, off, 0)" in done.stderr
