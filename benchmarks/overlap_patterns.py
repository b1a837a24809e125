"""The two communication/compute overlap patterns of ParallelType.stream as FusionDefinitions over
the world mesh, plus their parts alone (the communication, the local matmul). Shared by
benchmarks/overlap.py and tests/python/mp/test_overlap.py, so both run exactly the same programs.

  allgather_linear       x [S, K] sharded on axis 0 (sequence parallel), w [N, K] sharded on axis 0
                         (column parallel); y = linear(x, w) [S, N] sharded on axis 1. Stream split:
                         y.outer_split(0, s); y.axis(0).parallelize(stream) -> the allgather of x
                         chunk i+1 overlaps the matmul of chunk i.
  linear_reduce_scatter  h [S, K] and w [N, K] sharded on axis 1 (row parallel); y = linear(h, w)
                         [S, N] sharded on axis 0, its local rows stream-split: the reduce-scatter of
                         chunk i overlaps the matmul of chunk i+1.

chunks=None is the same program without the stream split (one allgather, one matmul).
"""
from meshfuse import DataType, FusionDefinition, ParallelType
from meshfuse.multidevice import Communicator, DeviceMesh, shard_tensor

ALLGATHER_LINEAR = "allgather_linear"
LINEAR_REDUCE_SCATTER = "linear_reduce_scatter"
PATTERNS = (ALLGATHER_LINEAR, LINEAR_REDUCE_SCATTER)

# The logical axis each input is sharded on, per pattern (x/h first, then w).
_INPUT_SHARD_AXIS = {ALLGATHER_LINEAR: (0, 0), LINEAR_REDUCE_SCATTER: (1, 1)}


def world_mesh():
    return DeviceMesh(range(Communicator.instance().size))


def _shard(tv, mesh, axis):
    tv.set_device_mesh(mesh)
    tv.outer_split(axis, mesh.size)
    tv.axis(axis).parallelize(ParallelType.mesh_x)


class OverlapProgram:
    """One pattern as a FusionDefinition on the world mesh.

    dtype is the inputs' and output's dtype; compute_dtype (e.g. DataType.BFloat16), when given, is
    what the linear and its communication run in: the inputs are cast to it and the result back."""

    def __init__(self, pattern, rows, k, cols, *, chunks=None, dtype=DataType.Float, compute_dtype=None,
                 backend, number_of_streams=2, timeout=None):
        if pattern not in PATTERNS:
            raise ValueError(f"unknown pattern {pattern!r}; expected one of {PATTERNS}")
        self.pattern = pattern
        mesh = world_mesh()
        fd = FusionDefinition(backend_type=backend, number_of_streams=number_of_streams, timeout=timeout)
        self.x = fd.define_tensor([rows, k], dtype, contiguity=True)
        self.w = fd.define_tensor([cols, k], dtype, contiguity=True)
        x, w = self.x, self.w
        if compute_dtype is not None:
            x, w = fd.ops.cast(x, compute_dtype), fd.ops.cast(w, compute_dtype)
        y = fd.ops.linear(x, w)
        self.out = fd.ops.cast(y, dtype) if compute_dtype is not None else y
        fd.add_output(self.out)
        y.set_device_mesh(mesh)
        x_axis, w_axis = _INPUT_SHARD_AXIS[pattern]
        for tv in {self.x, x}:  # the cast copies keep the inputs' sharding: no communication before it
            _shard(tv, mesh, x_axis)
        for tv in {self.w, w}:
            _shard(tv, mesh, w_axis)
        if pattern == ALLGATHER_LINEAR:
            y.outer_split(1, mesh.size)
            y.axis(1).parallelize(ParallelType.mesh_x)  # loop [i0, mesh_x:i1o, i1i]
            if chunks is not None:
                y.outer_split(0, chunks)
                y.axis(0).parallelize(ParallelType.stream)  # [stream:i0o, i0i, mesh_x:i1o, i1i]
        else:
            y.outer_split(0, mesh.size)
            y.axis(0).parallelize(ParallelType.mesh_x)  # [mesh_x:i0o, i0i, i1]
            if chunks is not None:
                y.outer_split(1, chunks)  # this device's rows in chunks: [mesh_x:i0o, stream:i0io, i0ii, i1]
                y.axis(1).parallelize(ParallelType.stream)
        if self.out is not y:
            self.out.set_device_mesh(mesh)
            axis = 1 if pattern == ALLGATHER_LINEAR else 0
            self.out.outer_split(axis, mesh.size)
            self.out.axis(axis).parallelize(ParallelType.mesh_x)
        self.fd = fd

    def local_inputs(self, x_full, w_full, rank):
        """rank's shards of the global x and w."""
        return [shard_tensor(x_full, self.x, rank), shard_tensor(w_full, self.w, rank)]

    def local_output(self, y_full, rank):
        """rank's shard of a global result (for comparing with what execute returns)."""
        return shard_tensor(y_full, self.out, rank)

    def execute(self, local_inputs, trace=None):
        (y,) = self.fd.execute(local_inputs, trace=trace)
        return y


def communication_only(pattern, rows, k, cols, *, dtype=DataType.Float, backend, timeout=None):
    """The pattern's communication alone, through meshfuse, on the same bytes as the overlapped program.

    allgather_linear: set(x) of x [rows, k] sharded on axis 0 to replicated (an allgather).
    linear_reduce_scatter: sum over axis 0 of p [d, rows, cols] sharded on axis 0, the result sharded
    on axis 0 (a Partial reduce-scattered: rows*cols elements in, rows*cols/d out).
    Returns (OverlapProgram-like object with .fd, global input shape, input TensorView)."""
    mesh = world_mesh()
    d = mesh.size
    fd = FusionDefinition(backend_type=backend, timeout=timeout)
    if pattern == ALLGATHER_LINEAR:
        shape = [rows, k]
        x = fd.define_tensor(shape, dtype, contiguity=True)
        y = fd.ops.set(x)
        fd.add_output(y)
        for tv in (x, y):
            tv.set_device_mesh(mesh)
        _shard(x, mesh, 0)
    elif pattern == LINEAR_REDUCE_SCATTER:
        shape = [d, rows, cols]
        x = fd.define_tensor(shape, dtype, contiguity=True)
        y = fd.ops.sum(x, 0)
        fd.add_output(y)
        for tv in (x, y):
            tv.set_device_mesh(mesh)
        _shard(x, mesh, 0)
        y.outer_split(0, d)
        y.axis(0).parallelize(ParallelType.mesh_x)
    else:
        raise ValueError(f"unknown pattern {pattern!r}; expected one of {PATTERNS}")
    return fd, shape, x


def local_part_of_communication_only(pattern, rows, cols, *, dtype=DataType.Float):
    """The local compute inside communication_only, alone, or None: for linear_reduce_scatter, the
    sum over the extent-1 local axis 0 of p [1, rows, cols] that produces the Partial (a full pass
    over the data the reduce-scatter then sends). Subtract its time to get the communication's.
    Returns (fd, input shape) or None."""
    if pattern != LINEAR_REDUCE_SCATTER:
        return None
    fd = FusionDefinition()
    p = fd.define_tensor([1, rows, cols], dtype, contiguity=True)
    fd.add_output(fd.ops.sum(p, 0))
    return fd, [1, rows, cols]


def local_linear(pattern, rows, k, cols, *, dtype=DataType.Float):
    """The matmul one rank does in the pattern, alone (no mesh): linear of [rows, k'] and [cols', k']
    with k' = k/d (row parallel) or cols' = cols/d (column parallel). Returns (fd, x shape, w shape)."""
    d = Communicator.instance().size
    x_shape, w_shape = ([rows, k], [cols // d, k]) if pattern == ALLGATHER_LINEAR else ([rows, k // d], [cols, k // d])
    fd = FusionDefinition()
    x = fd.define_tensor(x_shape, dtype, contiguity=True)
    w = fd.define_tensor(w_shape, dtype, contiguity=True)
    fd.add_output(fd.ops.linear(x, w))
    return fd, x_shape, w_shape
