"""Ray for one run: a private local Ray started for it and stopped after (also on Ctrl-C), or a
running cluster joined and left again, never shut down; and the pool of a config's ``scale``."""

from __future__ import annotations

import logging
import math
import re
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

from esbox.errors import ConfigError
from esbox.runconfig import ScaleConfig

from .errors import require_ray
from .pool import RayPool

ADDRESS_FORMS = "local, auto, ray://HOST:PORT or HOST:PORT"
_ADDRESS = re.compile(r"^(ray://)?[A-Za-z0-9_.\-]+:[0-9]+$")


def check_address(address: str) -> str:
    """``address`` if it is one of ``ADDRESS_FORMS``, else a ConfigError naming the key."""
    if address in ("local", "auto") or _ADDRESS.match(address):
        return address
    raise ConfigError(f"scale.address is {address!r}; allowed: {ADDRESS_FORMS}")


@contextmanager
def ray_session(
    address: str = "local", *, num_cpus: int | None = None, num_gpus: int | None = None
) -> Iterator[str]:
    """Ray for the block; yields what was done: ``"in use"`` (someone, e.g. a notebook or a
    test, started it: used as it is), ``"started"`` (``local``: a private Ray with ``num_cpus``
    CPUs, no dashboard, quiet logs, shut down when the block ends, whatever ends it) or
    ``"joined"`` (the cluster at ``address``: left when the block ends, never shut down)."""
    check_address(address)
    ray = require_ray()
    if ray.is_initialized():
        yield "in use"
        return
    main = threading.current_thread() is threading.main_thread()
    sigterm = signal.getsignal(signal.SIGTERM) if main else None  # ray.init replaces it
    quiet = {"log_to_driver": False, "logging_level": logging.ERROR}
    if address == "local":
        ray.init(
            address="local", num_cpus=num_cpus, num_gpus=num_gpus, include_dashboard=False, **quiet
        )
    else:
        ray.init(address=address, **quiet)
    try:
        yield "started" if address == "local" else "joined"
    finally:
        ray.shutdown()  # a joined cluster keeps running: this only disconnects the driver
        if main and sigterm is not None:
            signal.signal(signal.SIGTERM, sigterm)


def open_pool(
    scale: ScaleConfig, factory: Callable[[], Any], local_replica: Any, stack: ExitStack
) -> RayPool:
    """The pool of a run config's ``scale`` section, on Ray started or joined for it; the pool
    and Ray are closed with ``stack``."""
    cpus = math.ceil(scale.workers * scale.cpus) or 1
    gpus = None if scale.gpus else 0  # None: Ray counts the GPUs itself
    stack.enter_context(ray_session(scale.address, num_cpus=cpus, num_gpus=gpus))
    options: dict[str, Any] = {"num_cpus": scale.cpus, "num_gpus": scale.gpus}
    if scale.memory:
        options["memory"] = int(scale.memory * 2**30)
    if scale.placement == "spread":
        options["scheduling_strategy"] = "SPREAD"
    pool = RayPool(
        factory,
        scale.workers,
        actor_options=options,
        local_replica=local_replica,
        retries=scale.retries,
        replay_limit=scale.replay_limit,
    )
    return stack.enter_context(pool)
