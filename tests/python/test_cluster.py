"""Across nodes (issue 16): jobs on a simulated cluster of network namespaces (scripts/cluster-sim,
2 nodes x 2 ranks unless said otherwise), on every CPU backend meshfuse.available_backends()
lists (a backend added later, such as ucc, is picked up without editing this file):
  - each rank's node as Python sees it,
  - the tensor-parallel MLP example,
  - the multi-device suite's communicator and collective tests (C++, every backend compiled in),
  - a node whose ranks are killed mid-run: the survivors end the job within MESHFUSE_TIMEOUT.
Skipped, with cluster-sim's reason, where namespaces cannot be made (not root, no `ip`)."""
import os
import re
import subprocess
import sys
import time

import pytest

import meshfuse
from meshfuse import CommunicatorBackend

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir, os.pardir))
CLUSTER_SIM = os.path.join(ROOT, "scripts", "cluster-sim")
BUILD = os.path.join(ROOT, os.environ.get("MESHFUSE_BUILD_DIR", "build"))
SKIP = 77  # cluster-sim's exit code where it cannot make the namespaces
NODE_LOSS_TIMEOUT = 5  # MESHFUSE_TIMEOUT of the node-loss jobs, in seconds

# The backends that carry host tensors: every available one but those made for CUDA tensors.
CPU_BACKENDS = [
    b.name
    for b in meshfuse.available_backends()
    if b not in (CommunicatorBackend.auto, CommunicatorBackend.nccl, CommunicatorBackend.cuda)
]


def job_env(**overrides):
    """This environment without the launcher's variables (this pytest process may itself be an MPI
    singleton, whose OMPI_/PMIX_ variables would confuse the cluster's mpirun)."""
    env = {k: v for k, v in os.environ.items() if not re.match(r"(OMPI_|PMIX_|PMI_)", k)}
    env.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MESHFUSE_TIMEOUT="60")
    # The ranks import meshfuse from this tree as this process does: Debian's python3 (the torch
    # run of scripts/test) has no .pth for it, unlike .venv.
    env["PYTHONPATH"] = os.pathsep.join(p for p in (os.path.join(ROOT, "python"), env.get("PYTHONPATH")) if p)
    env.update(overrides)
    return env


def cluster(args, limit, **env):
    """Runs scripts/cluster-sim ARGS under a wall-clock limit (SIGTERM first, so that it cleans up);
    skips where it cannot make the cluster. Returns (exit code, output, seconds)."""
    start = time.monotonic()
    proc = subprocess.run(
        ["timeout", "--kill-after=15", str(limit), CLUSTER_SIM, *args],
        cwd=ROOT,
        env=job_env(**env),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    seconds = time.monotonic() - start
    skipped = re.search(r"^skipped: (.*)$", proc.stdout, re.M)
    if proc.returncode == SKIP and skipped:
        pytest.skip(skipped.group(1))
    assert proc.returncode != 124, f"the job hung: still running after {limit} s\n{proc.stdout}"
    return proc.returncode, proc.stdout, seconds


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_tp_mlp_on_two_nodes(backend):
    rc, out, _ = cluster(["--", sys.executable, "examples/tp_mlp.py", "--backend", backend], 120, MESHFUSE_DEBUG="INFO")
    assert rc == 0, out
    # Not anchored: mpirun may interleave the ranks' lines.
    ranks = re.findall(r"rank (\d)/4: y \(8, 256\) float32, max \|error\| vs float64 reference", out)
    assert sorted(ranks) == ["0", "1", "2", "3"], out
    assert f"team=[0, 1, 2, 3], op=sum, backend={backend})" in out, out
    if backend == "gloo":  # the device follows Open MPI's TCP interface, on each node its own address
        devices = re.findall(r"gloo backend for team \[0, 1, 2, 3\]: TCP device on interface sim0 \(([\d.]+)\)", out)
        assert len(devices) == 4 and len(set(devices)) == 2, out


@pytest.mark.parametrize("schedule", ["dp_tp", "sp"])
def test_transformer_layer_on_two_nodes(schedule):
    """The layer forward and backward on 2 nodes x 2 ranks: DPxTP with TP inside a node and data
    parallelism across the two, and SP's sequence shards over all four; each rank's assembled output and
    input gradient against float64 numpy (examples/transformer.py), on the last CPU backend listed."""
    backend = CPU_BACKENDS[-1]
    rc, out, _ = cluster(["--", sys.executable, "examples/transformer.py", "--schedule", schedule, "--backend",
                          backend], 120)
    assert rc == 0, out
    errors = re.findall(r"rank (\d): max \|error\| of out and grad_x against float64 numpy: ([\d.e+-]+)", out)
    assert sorted(r for r, _ in errors) == ["0", "1", "2", "3"], out
    assert max(float(e) for _, e in errors) < 1e-4, out
    assert f"backend={backend}" in out, out


def test_python_sees_each_ranks_node():
    program = (
        "from meshfuse.multidevice import Communicator as C; c = C.instance(); "
        "print(f'rank {c.rank}: node {c.node_id} of {c.node_count} ({c.node_name(c.node_id)}) "
        "local {c.local_rank}/{c.local_size} nodes {[c.node_of(r) for r in range(c.size)]}', flush=True)"
    )
    rc, out, _ = cluster(["--", sys.executable, "-c", program], 60)
    assert rc == 0, out
    for rank, node, local in ((0, 0, 0), (1, 0, 1), (2, 1, 0), (3, 1, 1)):
        line = f"rank {rank}: node {node} of 2 (node{node}) local {local}/2 nodes [0, 0, 1, 1]"
        assert line in out, out


def test_tp_mlp_on_three_nodes_over_gloo():
    if "gloo" not in CPU_BACKENDS:
        pytest.skip("this build has no Gloo")
    args = ["--nodes", "3", "--ranks-per-node", "1", "--", sys.executable, "examples/tp_mlp.py"]
    rc, out, _ = cluster(args + ["--backend", "gloo", "--hidden", "96"], 120)
    assert rc == 0, out
    assert len(re.findall(r"rank \d/3: y \(8, 96\) float32, max \|error\|", out)) == 3, out


def test_collectives_on_two_nodes():
    binary = os.path.join(BUILD, "tests", "meshfuse_mp_tests")
    if not os.path.exists(binary):
        pytest.skip(f"{binary} is not built")
    suites = [
        "CommunicatorMp.*",
        "MultiNode.*",
        "CommunicatorBackendChoice.*",
        "GlooRendezvous.*",
        "GlooPointToPoint.*",
        "EveryBackendDtypeAndTeam/BackendCollectives.*",
        "HostBackends/EveryCommunication.*",
    ]
    rc, out, _ = cluster(["--", binary, "--gtest_filter=" + ":".join(suites)], 240, MESHFUSE_TIMEOUT="30")
    assert rc == 0, out
    assert re.search(r"PASSED .*\d+ tests", out), out
    for backend in CPU_BACKENDS:  # every backend the binary was built with ran its collectives
        assert re.search(rf"BackendCollectives\.\w+/{backend}_", out), f"no {backend} collectives ran\n{out}"


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_losing_a_node_ends_the_job_within_the_timeout(backend):
    args = ["--kill-node", "1", "--kill-when", "iteration 5 done", "--", sys.executable]
    args += ["tests/python/mp/node_loss_victim.py", backend, "60"]
    rc, out, _ = cluster(args, 90, MESHFUSE_TIMEOUT=str(NODE_LOSS_TIMEOUT))
    assert "killing node1's ranks" in out, out
    assert rc not in (0, SKIP), out
    ended = re.search(r"the job ended (\d+) ms after node1's ranks were killed", out)
    assert ended, out
    # The survivors' timeout, then MPI_Abort ending every process (a few seconds on a busy machine).
    assert int(ended.group(1)) < (NODE_LOSS_TIMEOUT + 20) * 1000, out
    assert re.search(r"meshfuse: rank [01] of 4 aborts the job", out), "no survivor ended the job\n" + out
