"""Device meshes, the process's communicator (its world, and the nodes it spans: local_rank,
local_size, node_id, node_count, node_of, node_name), and helpers to cut global arrays into shards
(shard_tensor) and to assemble them again (gather_tensor)."""
from .._C import Communicator, DeviceMesh, ParallelType
from .sharding import gather_tensor, shard_tensor

__all__ = ["Communicator", "DeviceMesh", "ParallelType", "gather_tensor", "shard_tensor"]
