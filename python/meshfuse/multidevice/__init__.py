"""Device meshes, the process's communicator, and helpers to cut global arrays into shards."""
from .._C import Communicator, DeviceMesh, ParallelType
from .sharding import shard_tensor

__all__ = ["Communicator", "DeviceMesh", "ParallelType", "shard_tensor"]
