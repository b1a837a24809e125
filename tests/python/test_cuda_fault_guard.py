"""cuda_fault_guard (the GPU runs' pytest plugin), exercised on a pytest run of its own with stand-in
failures: no GPU is needed to check which tests it stops and what it reports."""
import pytest

pytest_plugins = ["pytester"]

FAKE_SUITE = '''
def test_cuda_first_fault():
    raise RuntimeError("CUDA error: misaligned address")

def test_cpu_still_runs():
    assert 1 + 1 == 2

def test_cuda_after_the_fault():
    assert True
'''


def test_later_cuda_tests_name_the_first_fault(pytester):
    pytester.makeconftest('pytest_plugins = ["cuda_fault_guard"]')
    pytester.makepyfile(FAKE_SUITE)
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=1, errors=1)
    result.stdout.fnmatch_lines(["*not run: test_*.py::test_cuda_first_fault hit a CUDA fault (CUDA error: misaligned*"])


def test_an_ordinary_failure_stops_nothing(pytester):
    pytester.makeconftest('pytest_plugins = ["cuda_fault_guard"]')
    pytester.makepyfile(FAKE_SUITE.replace("CUDA error: misaligned address", "an assertion of the test itself"))
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=2, failed=1)
