"""shard_tensor: the part of a global array that one rank holds under a TensorView's sharding; and
gather_tensor, its inverse, which assembles the global array from every rank's part."""
from collections import OrderedDict

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
                    devices = mesh.size_along(parallel)
                    if len(axis_parts) == 1:  # a whole axis: worded as execute words it
                        raise ValueError(f"shard_tensor: {tv.name} axis {logical} (extent {extent}) is parallelized "
                                         f"whole on {parallel.name}, which puts one element on each device: its "
                                         f"extent must be the {devices} devices of the mesh along {parallel.name}; to "
                                         f"shard it in blocks, outer_split({logical}, {devices}) it first")
                    raise ValueError(f"shard_tensor: {tv.name} axis {logical} has a part of extent {extent} on "
                                     f"{parallel.name}, whose mesh dimension has {devices} devices")
                c = mesh.coordinate(rank, parallel)
                index.append(slice(c, c + 1))
            else:
                index.append(slice(None))
                local *= extent
        local_shape.append(local)
    # (A 0-d array has nothing to index: indexing it with () would give a numpy scalar, not an array.)
    shard = full.reshape(split_shape)[tuple(index)].reshape(local_shape) if index else full.reshape(local_shape)
    if isinstance(shard, np.ndarray):  # (not np.ascontiguousarray, which makes a 0-d array 1-d)
        return shard if shard.flags.c_contiguous else shard.copy(order="C")
    if _arrays.is_torch_tensor(shard):
        return shard.contiguous()
    return shard


_GATHERS = OrderedDict()  # the allgather definitions of gather_tensor, by sharding (least recently used first)
_MAX_GATHERS = 64


def gather_tensor(local, tv, backend=None):
    """The global array of which `local` is this rank's shard under tv's sharding: `tv` is a TensorView
    of a definition or one of `fd.output_shardings()` (where execute put each output). A collective
    over tv's mesh, run by a meshfuse allgather program on `backend` (default: the definition's
    default, auto): every rank of the mesh calls it and gets the whole array, numpy or torch as `local`
    is; ranks outside the mesh pass None and get None. A tensor without a mesh, or replicated on it,
    is returned as it is."""
    if not isinstance(tv, _C.TensorView):
        raise TypeError(f"gather_tensor: tv must be a TensorView, got {type(tv).__name__}")
    mesh = tv.device_mesh
    if mesh is None or not tv.is_sharded:
        return local
    key = (tuple(tv.shape), tv.dtype.name, tuple(mesh.devices), tuple(mesh.shape), tv.loop, backend)
    fd = _GATHERS.pop(key, None)
    if fd is None:
        fd = _gather_definition(tv, backend)
    _GATHERS[key] = fd
    if len(_GATHERS) > _MAX_GATHERS:
        _GATHERS.popitem(last=False)
    return fd.execute([local])[0]


def _gather_definition(tv, backend):
    from ..fusion_definition import FusionDefinition
    with FusionDefinition(**({} if backend is None else {"backend_type": backend})) as fd:
        x = fd.define_tensor(list(tv.shape), tv.dtype)
        y = fd.ops.set(x)
        fd.add_output(y)
        x.shard_like(tv)
        for i in range(x.num_loop_axes):  # an output's stream chunks are a schedule detail, not a placement
            if x.axis(i).parallel_type == ParallelType.stream:
                x.axis(i).parallelize(ParallelType.serial)
        y.set_device_mesh(tv.device_mesh)
    return fd
