"""A small multi-device Python program for the reliability ctest entries (tests/CMakeLists.txt; not
collected by pytest): every rank allgathers a sharded array with FusionDefinition.execute, except
rank 2 (the last rank in a smaller world), which misbehaves as argv[1] says:
  ok     nobody misbehaves (exits 0 after checking the result against numpy)
  raise  raises a Python exception before execute (the others must not wait forever)
  exit   calls sys.exit(3) before execute (no exception: the exit status is what ends the job)
  hang   stays alive but never executes; with MESHFUSE_ABORT_ON_TIMEOUT=0 the others see
         meshfuse.CommunicationTimeout (a TimeoutError) in Python, print it, see a retry refused
         and exit 4
  interrupted  as hang, and rank 0 gets SIGINT (Ctrl-C) while it waits: the job ends at once, not
         after MESHFUSE_TIMEOUT
Exits 77 (ctest: skipped) when the extension meshfuse._C is not built."""
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir, os.pardir, "python"))
try:
    import numpy as np
    import meshfuse
    from meshfuse import DataType, FusionDefinition, ParallelType
    from meshfuse.multidevice import Communicator, DeviceMesh
except ImportError as e:  # no extension built here
    print(f"skipped: {e}")
    sys.exit(77)

mode = sys.argv[1] if len(sys.argv) > 1 else "ok"
comm = Communicator.instance()
rank, n = comm.rank, comm.size
victim = min(2, n - 1)

with FusionDefinition() as fd:
    x = fd.define_tensor(shape=[2 * n, 3], dtype=DataType.Float)
    y = fd.ops.set(x)
    fd.add_output(y)
    mesh = DeviceMesh(range(n))
    x.set_device_mesh(mesh)
    y.set_device_mesh(mesh)
    x.outer_split(0, n)
    x.axis(0).parallelize(ParallelType.mesh_x)

full = np.arange(6 * n, dtype=np.float32).reshape(2 * n, 3)
if rank == victim and mode == "raise":
    raise RuntimeError("the victim raised before execute")
if rank == victim and mode == "exit":
    print(f"rank {rank}: sys.exit(3) instead of executing", flush=True)
    sys.exit(3)
if rank == victim and mode in ("hang", "interrupted"):
    print(f"rank {rank}: hanging instead of executing", flush=True)
    time.sleep(600)
    sys.exit(0)
if rank == 0 and mode == "interrupted":  # Ctrl-C to rank 0 while it waits for the victim
    import signal
    import threading
    threading.Timer(2.0, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
    print(f"rank {rank}: SIGINT in 2 s", flush=True)
try:
    (out,) = fd.execute([full[2 * rank : 2 * rank + 2].copy()])
except meshfuse.CommunicationTimeout as e:
    assert isinstance(e, TimeoutError)
    print(f"rank {rank}: Python caught CommunicationTimeout: {e}", flush=True)
    # A retry met the timed-out collective's leftovers and crashed the job inside MPI; it is refused.
    try:
        fd.execute([full[2 * rank : 2 * rank + 2].copy()])
        print(f"rank {rank}: the retry ran", flush=True)
    except meshfuse.CommunicationTimeout as again:
        print(f"rank {rank}: the retry was refused: {again}", flush=True)
    sys.exit(4)
except KeyboardInterrupt as e:  # "interrupted" with MESHFUSE_ABORT_ON_TIMEOUT=0
    print(f"rank {rank}: Python caught KeyboardInterrupt: {e}", flush=True)
    sys.exit(5)
ok = np.array_equal(np.asarray(out), full)
print(f"rank {rank}: execute {'matched' if ok else 'MISMATCHED'}", flush=True)
sys.exit(0 if ok else 2)
