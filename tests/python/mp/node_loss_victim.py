"""A multi-node Python program for tests/python/test_cluster.py (not collected by pytest): every
rank allreduces a partial sum over the world in a loop on the backend argv[1] names, and rank 0
prints each iteration. The test kills one simulated node's ranks mid-run (scripts/cluster-sim
--kill-node); the survivors must then end the job within MESHFUSE_TIMEOUT, never hang.
Stops by itself after argv[2] seconds (default 60) so that a run nobody kills ends too."""
import sys
import time

import numpy as np

from meshfuse import CommunicatorBackend, DataType, FusionDefinition, ParallelType
from meshfuse.multidevice import Communicator, DeviceMesh

backend = getattr(CommunicatorBackend, sys.argv[1] if len(sys.argv) > 1 else "mpi")
seconds = float(sys.argv[2]) if len(sys.argv) > 2 else 60.0
comm = Communicator.instance()
rank, n = comm.rank, comm.size

with FusionDefinition(backend_type=backend) as fd:
    x = fd.define_tensor(shape=[4, n * 8], dtype=DataType.Float)
    y = fd.ops.sum(x, [1])  # sharded axis 1 reduced: a Partial sum, then an allreduce
    fd.add_output(y)
    mesh = DeviceMesh(range(n))
    for tv in (x, y):
        tv.set_device_mesh(mesh)
    x.outer_split(1, n)
    x.axis(1).parallelize(ParallelType.mesh_x)

local = np.ones((4, 8), dtype=np.float32)
start = time.monotonic()
iteration = 0
while time.monotonic() - start < seconds:
    (out,) = fd.execute([local])
    if not np.allclose(out, 8 * n):
        raise SystemExit(f"rank {rank}: iteration {iteration} summed to {out}, not {8 * n}")
    if rank == 0:
        print(f"rank 0 on node {comm.node_id}: iteration {iteration} done", flush=True)
    iteration += 1
    time.sleep(0.05)
print(f"rank {rank}: no node was lost in {seconds} s", flush=True)
