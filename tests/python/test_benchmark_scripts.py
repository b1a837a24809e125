"""The CPU benchmark scripts still run, each at a tiny size in a child process with a time limit: a
change to the library or to a script that breaks a benchmark fails here, not in the next measuring
session. Their timings are not asserted (benchmarks measure, tests assert); the accuracy each script
prints against its float64 or numpy reference is."""
import contextlib
import io
import os
import re
import subprocess
import sys

import pytest
from conftest import torch_cuda_available

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir)


def run_script(*args, timeout=120):
    """The script's standard output; fails with its output when it exits non-zero or runs too long."""
    # The checkout's meshfuse first, as the README runs the benchmarks (some scripts add it themselves).
    path = os.pathsep.join(p for p in (os.path.join(ROOT, "python"), os.environ.get("PYTHONPATH")) if p)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=path)
    try:
        run = subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True,
                             timeout=timeout)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{' '.join(args)} ran past {timeout} s: {e.stdout!r}")
    assert run.returncode == 0, f"{' '.join(args)} exited {run.returncode}:\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
    return run.stdout


def floats_after(label, text):
    return [float(x) for x in re.findall(re.escape(label) + r"\s*([0-9.eE+-]+)", text)]


def test_attention_cpu_matches_numpy():
    out = run_script("benchmarks/attention.py", "--cpu", "--reps", "1")
    diffs = floats_after("max|diff|", out)
    assert len(diffs) == 2, out  # causal and not
    assert max(diffs) < 1e-4, out


def test_attention_cpu_dropout_cost():
    out = run_script("benchmarks/attention.py", "--cpu-dropout", "--reps", "1")
    assert len(floats_after("sdpfa_bwd", out)) == 2, out  # dropout 0 and 0.1


def test_pointwise_chain_matches_float64():
    out = run_script("benchmarks/pointwise_chain.py", "--shape", "64", "256", "--calls", "1", "--repeat", "1")
    (err,) = floats_after("max |error| vs float64", out)
    assert err < 1e-5, out
    assert "meshfuse interpreted" in out, out


def test_half_casts_match_numpy():
    # The script checks each result against numpy and exits non-zero on a mismatch.
    out = run_script("benchmarks/half_casts.py", "--mb", "0.25", "--calls", "1", "--repeat", "1")
    for case in ("cast f32->f16", "cast f16->f32", "cast f32->bf16,", "cast f32->bf16->f32", "8 Half pointwise ops",
                 "Half layernorm", "Half softmax"):
        assert case in out, out


def test_reductions_match_numpy():
    # The script checks each reduction against float64 numpy and exits non-zero on a mismatch.
    out = run_script("benchmarks/reductions.py", "--shapes", "64x300", "--calls", "1", "--repeat", "1")
    for case in ("sum axis 1 64x300", "max axis 0 64x300", "mean axis 1 64x300"):
        assert case in out, out


def test_norms_cpu_table():
    out = run_script("benchmarks/norms.py", "--device", "cpu", "--rows", "64", "--cols", "256", "--repeat", "1")
    for case in ("| layernorm | meshfuse |", "| rmsnorm | meshfuse |", "| layernorm_bwd | meshfuse |"):
        assert case in out, out


def test_host_overhead_table():
    out = run_script("benchmarks/host_overhead.py", "--iters", "50")
    assert "cached execute of add" in out, out


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_host_overhead_of_the_transformer_passes(device):
    if device == "cuda" and not torch_cuda_available():
        pytest.skip("needs torch with a CUDA GPU (and meshfuse built with cuDNN)")
    out = run_script("benchmarks/host_overhead.py", "--transformer", "--iters", "5", "--device", device)
    rows = re.findall(r"^\| (.+?) \| ([0-9.]+) \| ([0-9.]+) \|$", out, re.M)
    assert [r[0].strip() for r in rows] == [
        "cached execute", "of which: inputs checked and imported", "of which: C++ FusionExecutorCache.execute",
        "of which: outputs exported", "the host program alone, traced (trace_host=True)"], out
    assert all(float(r[1]) > 0 and float(r[2]) > 0 for r in rows), out


def test_cpu_layer_gemms_probe_lists_every_gemm():
    out = run_script("benchmarks/probes/cpu_layer_gemms.py", "--hidden", "64", "--sequence", "32", "--ranks", "2",
                     "--repeat", "1")
    rows = [line for line in out.splitlines() if re.match(r"\| (qkv|out|fc1|fc2) \|", line)]
    assert len(rows) == 12, out  # four linears, three products each
    assert "| fc2 | weight grad | 32 x 128 x 64 |" in out, out  # fc2's inputs split over the 2 ranks


@pytest.mark.skipif(not torch_cuda_available(), reason="needs torch with a CUDA GPU")
def test_backward_streams_probe_times_every_pair():
    out = run_script("benchmarks/probes/backward_streams.py", "--sequence", "256", "--hidden", "512", "--heads", "4",
                     "--repeat", "2")
    assert len(re.findall(r"^\| .+ \| [0-9.]+x \|$", out, re.M)) == 7, out  # six pairs and the sum


@pytest.mark.skipif(not torch_cuda_available(), reason="needs torch with a CUDA GPU (and meshfuse built with cuDNN)")
def test_layer_norm_kernels_probe_finds_the_layers_normalizations():
    out = run_script("benchmarks/probes/layer_norm_kernels.py", "--sequence", "256", "--hidden", "512", "--heads", "4",
                     "--repeat", "3", timeout=300)
    # Two LayerNorms forward and two backward, at least (the bias gradients may be normalization segments too).
    assert len(re.findall(r"^\| [0-9]+ \| .+ \| [0-9.]+ \|$", out, re.M)) >= 4, out


@pytest.mark.parametrize("backend", ["auto", "gloo"])
def test_transformer_cpu_one_rank(backend):
    pytest.importorskip("torch")  # its peer is the same layer in torch
    if backend != "auto":
        from meshfuse import CommunicatorBackend
        from meshfuse.multidevice import Communicator
        if getattr(CommunicatorBackend, backend) not in Communicator.instance().available_backends():
            pytest.skip(f"this build has no {backend} backend")
    out = run_script("benchmarks/transformer.py", "--device", "cpu", "--hidden", "64", "--sequence", "32", "--heads",
                     "4", "--iters", "1", "--warmup", "1", "--breakdown", "1", "--host-breakdown", "--backend", backend)
    # Both sides were checked against each other before any timing (it timed unchecked work before).
    diffs = [float(v) for v in re.findall(r"max rel\. diff ([0-9.e+-]+)", out)]
    assert "# checked against torch, dropout off" in out and len(diffs) == 2 and max(diffs) < 1e-4, out
    for row in ("forward ", "forward+backward ", "rank 0 forward ms by segment kind", "rank 0 backward ms",
                "# GEMM floor:", f"meshfuse backend {backend}", "rank 0 forward host ms launching its segments",
                "rank 0 backward host ms launching its segments", "rank 0 backward host steps inside the segments"):
        assert row in out, out
    assert re.search(r"host steps inside the segments, self us \(calls\): .*host allocate [0-9]+ \([0-9]+\)", out), out


@pytest.mark.skipif(not torch_cuda_available(), reason="needs torch with a CUDA GPU (and meshfuse built with cuDNN)")
@pytest.mark.parametrize("block_cache", ["1", "0"])
def test_transformer_cuda_host_breakdown_names_each_library_call(monkeypatch, block_cache):
    monkeypatch.setenv("MESHFUSE_CUDA_BLOCK_CACHE", block_cache)
    out = run_script("benchmarks/transformer.py", "--device", "cuda", "--hidden", "128", "--sequence", "64", "--heads",
                     "2", "--iters", "1", "--warmup", "1", "--host-breakdown", timeout=300)
    steps = [line for line in out.splitlines() if "host steps inside the segments" in line]
    assert len(steps) == 2, out  # forward and backward
    for step in ("cudaLaunchKernel", "cublasLtMatmul", "cuDNN execute", "segment: setup"):
        assert all(step in line for line in steps), out
    # After the warm-up the block cache (runtime/cuda/allocator.cpp, on by default) serves every
    # allocation of a pass: the driver's allocator is called only with the cache off.
    assert all(("cudaMallocAsync" in line) == (block_cache == "0") for line in steps), out


def test_transformer_cpu_in_blocks():
    pytest.importorskip("torch")
    out = run_script("benchmarks/transformer.py", "--device", "cpu", "--hidden", "64", "--sequence", "32", "--heads",
                     "4", "--iters", "2", "--warmup", "1", "--order", "blocks")
    assert "calls in blocks" in out and "forward+backward " in out, out


def test_transformer_breakdown_counts_waiting_not_communications_in_flight(tmp_path):
    """A communication's trace event spans its post to the end of its wait, over the compute it ran
    beside: the breakdown sums segments by kind and the compute lane's gaps, never those spans."""
    pytest.importorskip("torch")
    import importlib.util
    import json
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    spec = importlib.util.spec_from_file_location("transformer_bench", os.path.join(ROOT, "benchmarks", "transformer.py"))
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    events = [  # rank 0: a GEMM with an allreduce in flight beside it, 3 ms of waiting, a normalization
        {"name": "matmul T87", "cat": "compute", "ph": "X", "pid": 0, "tid": 0, "ts": 0.0, "dur": 10000.0},
        {"name": "Allreduce T83", "cat": "communication", "ph": "X", "pid": 0, "tid": 1, "ts": 100.0, "dur": 12900.0},
        {"name": "normalization T94", "cat": "compute", "ph": "X", "pid": 0, "tid": 0, "ts": 13000.0, "dur": 2000.0},
        {"name": "matmul T87", "cat": "compute", "ph": "X", "pid": 1, "tid": 0, "ts": 0.0, "dur": 12000.0}]
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"traceEvents": events}))
    assert bench.trace_breakdown(str(path), pid=0) == pytest.approx(
        {"matmul": 10.0, "normalization": 2.0, "communication wait": 3.0})
    assert bench.trace_breakdown(str(path)) == pytest.approx(
        {"matmul": 22.0, "normalization": 2.0, "communication wait": 3.0})
    # The per-rank line reads each rank's lane of the same trace: rank 1's slower GEMM is what rank 0
    # waited for.
    parts = {pid: {"forward": bench.trace_breakdown(str(path), pid=pid), "backward": {}} for pid in (0, 1)}
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        bench.print_rank_balance(parts)
    assert printed.getvalue() == ("# per rank, forward / backward ms: rank 0 matmul 10.0 / 0.0, waiting 3.0 / 0.0; "
                                  "rank 1 matmul 12.0 / 0.0, waiting 0.0 / 0.0\n")


def built_probe(name):
    """The path of a C++ probe built in the GPU build (scripts/test-gpu's build-gpu) or the local one."""
    for build in (os.environ.get("MESHFUSE_GPU_BUILD_DIR"), "build-gpu", "build"):
        path = os.path.join(ROOT, build, "benchmarks", name) if build else None
        if path and os.access(path, os.X_OK):
            return path
    return None


def run_probe(name, *args, timeout=120):
    """A built C++ probe's standard output (skips where none is built); fails as run_script does."""
    path = built_probe(name)
    if path is None:
        pytest.skip(f"{name} is not built (a CUDA build's target)")
    run = subprocess.run([path, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    assert run.returncode == 0, f"{name} exited {run.returncode}:\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
    return run.stdout


@pytest.mark.skipif(not torch_cuda_available(), reason="needs a CUDA GPU (and the probe built with CUDA)")
def test_cublaslt_algo_search_probe_rows_every_product_and_checks_the_winner():
    out = run_probe("probe_cublaslt_algo_search", "256", "256", "8")
    rows = re.findall(r"^\| (\S+ \S+) \| [0-9.]+ \(.*\| ([0-9.eE+-]+) \|$", out, re.M)
    assert len(rows) == 12, out  # four linears, three products each
    assert max(float(error) for _, error in rows) < 1e-2, out  # the enumerated best computes the same product


@pytest.mark.skipif(not torch_cuda_available(), reason="needs a CUDA GPU (and the probe built with CUDA)")
def test_cublaslt_bias_gradient_probe_checks_the_epilogue():
    out = run_probe("probe_cublaslt_bias_gradient", "256", "256")
    assert len(re.findall(r"^\| (qkv|out-projection|fc1|fc2) \| ", out, re.M)) == 12, out
    errors = floats_after("against float64 column sums", out)
    assert len(errors) <= 1 and all(e < 0.1 for e in errors), out  # bf16 rounds sums of about 5 to within 0.02


def run_failing(*args, timeout=60):
    """(exit status, standard error) of a script expected to refuse its arguments."""
    path = os.pathsep.join(p for p in (os.path.join(ROOT, "python"), os.environ.get("PYTHONPATH")) if p)
    run = subprocess.run([sys.executable, *args], cwd=ROOT, env=dict(os.environ, PYTHONPATH=path),
                         capture_output=True, text=True, timeout=timeout)
    return run.returncode, run.stderr


@pytest.mark.parametrize("args", [
    ("benchmarks/norms.py", "--repeat", "0"), ("benchmarks/norms.py", "--rows", "0"),
    ("benchmarks/pointwise_chain.py", "--calls", "0"), ("benchmarks/attention.py", "--cpu", "--reps", "0"),
    ("benchmarks/host_overhead.py", "--iters", "0"), ("benchmarks/overlap.py", "--repeats", "0")],
    ids=lambda a: " ".join(a))
def test_a_count_of_zero_is_an_argument_error(args):
    """Zero repeats, iterations or rows ended in tracebacks (an empty min(), a division by zero, a median
    of nothing) after setting up; argparse refuses them now."""
    status, err = run_failing(*args)
    assert status == 2 and "must be at least 1, got 0" in err, err[-2000:]


def test_benchmark_arguments_that_cannot_run_are_refused_before_running():
    # overlap.py checked only the largest chunk count against the sizes: 3 chunks of 256 rows failed
    # after the header, in a traceback.
    status, err = run_failing("benchmarks/overlap.py", "--sizes", "256", "--chunks", "1", "3", "8")
    assert status != 0 and "size 256 does not split into 1 ranks x 3 chunks" in err, err[-2000:]
    # attention.py without a flag printed nothing and exited 0.
    status, err = run_failing("benchmarks/attention.py")
    assert status == 2 and "--cpu, --cpu-dropout and/or --gpu" in err, err[-2000:]
