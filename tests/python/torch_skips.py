"""A pytest plugin for CI's second interpreter: the project's .venv has no torch (torch comes from
Debian's python3-torch, which only /usr/bin/python3 sees), so the torch tests skip in the .venv run.
With MESHFUSE_TORCH_SKIPS=PATH set, this plugin writes to PATH the ids of the tests (and the modules)
that skipped because torch could not be imported, one per line; scripts/test then runs exactly those
under Debian's interpreter instead of the whole suite a second time (about a minute of CI saved).
Tests that skip for want of a GPU are not listed: Debian's torch has no CUDA either."""
import os

# pytest.importorskip's message when the module is missing.
TORCH_MISSING = "could not import 'torch'"


def _skipped_for_torch(report):
    # A skip's longrepr is (path, line, "Skipped: reason") for tests and modules alike.
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    return report.skipped and TORCH_MISSING in reason


class _Recorder:
    """One per pytest session (a session run inside another, as this plugin's own test does, has its
    own), registered as a plugin: collection reports are not given the config, so a stash won't do."""

    def __init__(self, path):
        self.path, self.ids = path, []

    def pytest_collectreport(self, report):
        # A module that imports torch at its top skips as a whole, at collection.
        if _skipped_for_torch(report):
            self.ids.append(report.nodeid)

    def pytest_runtest_logreport(self, report):
        if _skipped_for_torch(report):
            self.ids.append(report.nodeid)

    def pytest_sessionfinish(self):
        with open(self.path, "w", encoding="utf-8") as out:
            out.writelines(nodeid + "\n" for nodeid in dict.fromkeys(self.ids))  # once each, in order


def pytest_configure(config):
    path = os.environ.get("MESHFUSE_TORCH_SKIPS")
    if path:
        config.pluginmanager.register(_Recorder(path), "meshfuse_torch_skips_recorder")
