"""The drift check of a pooled run: every few steps, every replica's parameters against the
driver's, so a replica that drifted (another device type, a bug) is named early."""

from __future__ import annotations

from typing import Any

from .pool import RayPool


class VerifyReplicas:
    """Runner callback: every ``every`` steps, ``pool.verify()``; a ``PoolError`` naming the
    replica that differs stops the run (the metrics stay those of a one-process run)."""

    def __init__(self, pool: RayPool, every: int) -> None:
        if every < 1:
            raise ValueError(f"every must be >= 1, got {every}")
        self.pool, self.every = pool, every

    def __call__(self, runner: Any, metrics: dict[str, Any]) -> None:
        if runner.strategy.step % self.every == 0:
            self.pool.verify()
