"""torch_skips (scripts/test's list of the tests to rerun where torch is), exercised on a pytest run of
its own with stand-in skips: whether torch is installed here does not matter."""
pytest_plugins = ["pytester"]

MISSING = "could not import 'torch': No module named 'torch'"

FAKE_TESTS = f'''
import pytest

@pytest.mark.parametrize("n", [1, 2])
def test_needs_torch(n):
    pytest.skip("{MISSING}")

def test_needs_a_gpu():
    pytest.skip("needs torch with a CUDA GPU")

def test_runs():
    assert 2 + 2 == 4
'''

FAKE_TORCH_MODULE = f'''
import pytest
pytest.skip("{MISSING}", allow_module_level=True)

def test_never_collected():
    pass
'''


def test_lists_the_tests_and_modules_skipped_for_want_of_torch(pytester, tmp_path, monkeypatch):
    listing = tmp_path / "skips.txt"
    monkeypatch.setenv("MESHFUSE_TORCH_SKIPS", str(listing))
    pytester.makeconftest('pytest_plugins = ["torch_skips"]')
    pytester.makepyfile(test_a=FAKE_TESTS, test_b=FAKE_TORCH_MODULE)
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, skipped=4)
    assert sorted(listing.read_text().splitlines()) == [
        "test_a.py::test_needs_torch[1]", "test_a.py::test_needs_torch[2]", "test_b.py"]


def test_records_only_when_asked(pytester, tmp_path, monkeypatch):
    pytester.makeconftest('pytest_plugins = ["torch_skips"]')
    monkeypatch.delenv("MESHFUSE_TORCH_SKIPS", raising=False)
    assert pytester.parseconfigure().pluginmanager.get_plugin("meshfuse_torch_skips_recorder") is None
    monkeypatch.setenv("MESHFUSE_TORCH_SKIPS", str(tmp_path / "skips.txt"))
    assert pytester.parseconfigure().pluginmanager.get_plugin("meshfuse_torch_skips_recorder") is not None
