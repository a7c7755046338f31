"""Scale-out on Ray: the driver-side pool, the replica inside each actor, how members are dealt
out, and Ray itself for a run (started or joined); may import the core only (a replica's
factory brings any model or task itself)."""

from .actors import Replacement, Traffic
from .balance import work_units
from .cluster import check_address, ray_session
from .errors import PoolError
from .pool import PoolSpace, RayPool
from .replica import VectorReplica, state_checksum
from .verify import VerifyReplicas

__all__ = [
    "PoolError",
    "PoolSpace",
    "RayPool",
    "Replacement",
    "Traffic",
    "VectorReplica",
    "VerifyReplicas",
    "check_address",
    "ray_session",
    "state_checksum",
    "work_units",
]
