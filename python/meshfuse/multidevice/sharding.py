"""shard_tensor: the part of a global array that one rank holds under a TensorView's sharding."""
import numpy as np

from .. import _arrays, _C

ParallelType = _C.ParallelType
_MESH_TYPES = (ParallelType.mesh_x, ParallelType.mesh_y, ParallelType.mesh_z)


def shard_tensor(full, tv, rank):
    """rank's shard of the global array `full` (numpy array or torch tensor) according to tv's mesh and
    loop domain. Each logical axis is viewed as its loop parts (a split axis [a] as [a_outer, a_inner],
    a nested split as three parts, row-major); every part parallelized on a mesh dimension keeps only
    the index of the rank's coordinate along that dimension. For an axis outer-split into mesh-size
    parts that is the rank's contiguous chunk. Returns a contiguous array, `full` itself for a tensor
    without a mesh, and None for a rank outside tv's mesh."""
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

    parts = [[] for _ in shape]  # per logical axis: (extent, parallel type) of its loop parts, in order
    for i in range(tv.num_loop_axes):
        axis = tv.axis(i)
        parts[axis.logical_axis].append((axis.extent_given(shape[axis.logical_axis]), axis.parallel_type))
    split_shape, index, local_shape = [], [], []
    for logical, axis_parts in enumerate(parts):
        extents = [e for e, _ in axis_parts]
        if int(np.prod(extents)) != shape[logical]:
            raise ValueError(f"shard_tensor: {tv.name} axis {logical} of extent {shape[logical]} does not split "
                             f"into its loop parts {extents} ({tv.loop})")
        local = 1
        for extent, parallel in axis_parts:
            split_shape.append(extent)
            if parallel in _MESH_TYPES:
                if extent != mesh.size_along(parallel):
                    raise ValueError(f"shard_tensor: {tv.name} axis {logical} has a part of extent {extent} on "
                                     f"{parallel.name}, whose mesh dimension has {mesh.size_along(parallel)} devices")
                c = mesh.coordinate(rank, parallel)
                index.append(slice(c, c + 1))
            else:
                index.append(slice(None))
                local *= extent
        local_shape.append(local)
    shard = full.reshape(split_shape)[tuple(index)].reshape(local_shape)
    if isinstance(shard, np.ndarray):
        return np.ascontiguousarray(shard)
    if _arrays.is_torch_tensor(shard):
        return shard.contiguous()
    return shard
