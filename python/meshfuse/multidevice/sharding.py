"""shard_tensor: the part of a global array that one rank holds under a TensorView's sharding."""
import numpy as np

from .. import _arrays, _C

ParallelType = _C.ParallelType
_MESH_TYPES = (ParallelType.mesh_x, ParallelType.mesh_y, ParallelType.mesh_z)


def shard_tensor(full, tv, rank):
    """rank's shard of the global array `full` (numpy array or torch tensor) according to tv's mesh and
    loop domain: each logical axis parallelized on a mesh dimension is cut into that dimension's size
    of contiguous chunks, and the rank gets the chunk at its coordinate along it. Returns a contiguous
    array, `full` itself for a tensor without a mesh, and None for a rank outside tv's mesh."""
    if not isinstance(tv, _C.TensorView):
        raise TypeError(f"shard_tensor: tv must be a TensorView, got {type(tv).__name__}")
    shape = tuple(int(e) for e in full.shape)
    if len(shape) != tv.ndim:
        raise ValueError(f"shard_tensor: {tv.name} has {tv.ndim} dimensions, the array has {len(shape)} "
                         f"(shape {list(shape)})")
    mesh = tv.device_mesh
    if mesh is None:
        return full
    if rank not in mesh:
        return None
    index = [slice(None)] * len(shape)
    for p in _MESH_TYPES:
        axis = tv.sharded_axis(p)
        if axis < 0:
            continue
        if index[axis] != slice(None):
            raise ValueError(f"shard_tensor: {tv.name} shards axis {axis} over more than one mesh dimension "
                             f"({tv.loop}); not supported here")
        parts = mesh.size_along(p)
        if shape[axis] % parts != 0:
            raise ValueError(f"shard_tensor: {tv.name} axis {axis} of extent {shape[axis]} does not split into "
                             f"{parts} shards along {p.name}")
        chunk = shape[axis] // parts
        coordinate = mesh.coordinate(rank, p)
        index[axis] = slice(coordinate * chunk, (coordinate + 1) * chunk)
    shard = full[tuple(index)]
    if isinstance(shard, np.ndarray):
        return np.ascontiguousarray(shard)
    if _arrays.is_torch_tensor(shard):
        return shard.contiguous()
    return shard
