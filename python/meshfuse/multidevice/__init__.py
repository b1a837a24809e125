"""Device meshes, the process's communicator (its world, and the nodes it spans: local_rank,
local_size, node_id, node_count, node_of, node_name), and helpers to cut global arrays into shards."""
from .._C import Communicator, DeviceMesh, ParallelType
from .sharding import shard_tensor

__all__ = ["Communicator", "DeviceMesh", "ParallelType", "shard_tensor"]
