"""The source distribution `pip install .` and PyPI users build from: every tracked file, and nothing a
development checkout holds besides (builds, .venv, the third-party prefixes). A pattern in pyproject.toml's
sdist.exclude once matched scripts/build-ucc as well as the build folders."""
import os
import shutil
import subprocess
import sys
import tarfile

import pytest

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir))

pytest.importorskip("scikit_build_core", reason="scikit-build-core (scripts/setup installs it in .venv)")


def _tracked_files():
    if shutil.which("git") is None or not os.path.isdir(os.path.join(ROOT, ".git")):
        pytest.skip("not a git checkout: no list of tracked files to compare with")
    run = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True)
    # A tracked file deleted in the working tree and not yet committed is not in the sdist either.
    return {f for f in run.stdout.decode().split("\0") if f and os.path.isfile(os.path.join(ROOT, f))}


def test_the_sdist_holds_the_tracked_files_and_nothing_else(tmp_path):
    tracked = _tracked_files()
    code = ("import sys; from scikit_build_core.build import build_sdist; "
            "print(build_sdist(sys.argv[1]))")
    run = subprocess.run([sys.executable, "-c", code, str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    name = run.stdout.strip().splitlines()[-1]
    with tarfile.open(tmp_path / name) as sdist:
        top = name[: -len(".tar.gz")] + "/"
        members = {m.name[len(top):] for m in sdist.getmembers() if m.isfile()}
    members.discard("PKG-INFO")
    # Files not yet added to git (a new source in a change under way) are in the sdist too; they must
    # not be what the comparison fails on.
    untracked = subprocess.run(["git", "ls-files", "--others", "--exclude-standard", "-z"], cwd=ROOT,
                               capture_output=True, check=True).stdout.decode().split("\0")
    extra = members - tracked - set(untracked)
    missing = tracked - members
    assert not missing, f"tracked files left out of the sdist: {sorted(missing)[:20]}"
    assert not extra, f"files in the sdist that git does not track: {sorted(extra)[:20]}"
    assert {"CMakeLists.txt", "pyproject.toml", "python/meshfuse/__init__.py", "scripts/build-ucc"} <= members
