"""Scale-out on Ray: the driver-side pool and the replica inside each actor; may import the core
only (a replica's factory brings any model or task itself)."""

from .pool import PoolError, PoolSpace, RayPool, split_members
from .replica import VectorReplica, state_checksum

__all__ = ["PoolError", "PoolSpace", "RayPool", "VectorReplica", "split_members", "state_checksum"]
