"""Strategy registry: ``@register("name")`` in code, or the ``esbox.strategies`` entry points."""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points
from typing import Any

from esbox.errors import ConfigError, unknown_key_message
from esbox.strategy import Strategy

ENTRY_POINT_GROUP = "esbox.strategies"
_REGISTRY: dict[str, type[Strategy]] = {}
_discovered = False


def register(name: str):
    """Class decorator adding a strategy under ``name``; a name can be registered once."""

    def decorate(cls: type[Strategy]) -> type[Strategy]:
        if name in _REGISTRY and _REGISTRY[name] is not cls:
            raise ValueError(
                f"strategy '{name}' is already registered by "
                f"{_REGISTRY[name].__module__}.{_REGISTRY[name].__qualname__}"
            )
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return decorate


def _discover() -> None:
    global _discovered
    if _discovered:
        return
    _discovered = True
    importlib.import_module("esbox.strategies")
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        cls = ep.load()
        register(ep.name)(cls)


def available_strategies() -> dict[str, type[Strategy]]:
    """Every registered strategy, built-in and from installed plugins, by name."""
    _discover()
    return dict(sorted(_REGISTRY.items()))


def get_strategy(name: str) -> type[Strategy]:
    """The strategy class registered as ``name``; unknown names list the known ones."""
    strategies = available_strategies()
    if name not in strategies:
        raise ConfigError(unknown_key_message("strategy", name, strategies))
    return strategies[name]


def make_strategy(name: str, space_or_dimension: Any, *, seed: int = 0, **options: Any) -> Strategy:
    """Build strategy ``name`` for a space (or a dimension) with its options."""
    dimension = getattr(space_or_dimension, "dimension", space_or_dimension)
    return get_strategy(name)(int(dimension), seed=seed, **options)
