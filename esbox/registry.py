"""Strategy registry: ``@register("name")`` in code, or the ``esbox.strategies`` entry points.

A family registers a prefix instead (``register_family``): ``ng:NGOpt`` names nevergrad's
NGOpt, built on demand, since nevergrad holds hundreds of names.
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable
from importlib.metadata import entry_points
from typing import Any

from esbox.defaults import black_box_defaults
from esbox.errors import ConfigError, ConfigWarning, unknown_key_message
from esbox.lowrank import refuse_low_rank, spec_rank
from esbox.space import VectorSpace
from esbox.strategy import Strategy

ENTRY_POINT_GROUP = "esbox.strategies"
_REGISTRY: dict[str, type[Strategy]] = {}
_FAMILIES: dict[str, tuple[Callable[[str], type[Strategy]], str]] = {}
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


def register_family(prefix: str, resolve: Callable[[str], type[Strategy]], summary: str) -> None:
    """Strategies named ``prefix:NAME``, built by ``resolve(NAME)`` (which names the allowed
    ones when NAME is unknown); ``summary`` is the family's line in ``esbox strategies``."""
    _FAMILIES[prefix] = (resolve, summary)


def strategy_families() -> dict[str, str]:
    """``{"ng:NAME": summary}``: the prefixed families, listed as a pattern each."""
    _discover()
    return {f"{prefix}:NAME": summary for prefix, (_, summary) in sorted(_FAMILIES.items())}


def _discover() -> None:
    global _discovered
    if _discovered:
        return
    _discovered = True
    importlib.import_module("esbox.strategies")
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        where = f"the {ENTRY_POINT_GROUP} entry point {ep.name!r} ({ep.value}"
        where += f", package {ep.dist.name})" if ep.dist is not None else ")"
        try:
            cls = ep.load()
        except Exception as exc:  # a broken plugin must not take the other strategies down
            problem = f"failed to import ({type(exc).__name__}: {exc})"
        else:
            if isinstance(cls, type) and issubclass(cls, Strategy):
                register(ep.name)(cls)
                continue
            problem = f"is not a Strategy subclass ({cls!r})"
        warnings.warn(f"{where} {problem}: skipped; fix or uninstall it", ConfigWarning, 2)


def available_strategies() -> dict[str, type[Strategy]]:
    """Every registered strategy, built-in and from installed plugins, by name."""
    _discover()
    return dict(sorted(_REGISTRY.items()))


def get_strategy(name: str) -> type[Strategy]:
    """The strategy class registered as ``name``; unknown names list the known ones."""
    strategies = available_strategies()
    if name in strategies:
        return strategies[name]
    prefix, colon, member = name.partition(":")
    if colon and prefix in _FAMILIES:
        return _FAMILIES[prefix][0](member)
    raise ConfigError(unknown_key_message("strategy", name, [*strategies, *strategy_families()]))


def make_strategy(name: str, space_or_dimension: Any, *, seed: int = 0, **options: Any) -> Strategy:
    """Build strategy ``name`` for a space (or a dimension) with its options.

    On a ``VectorSpace`` the options left out get the black-box defaults (``esbox.defaults``);
    a dimension or a model space keeps the strategy's own defaults.
    """
    cls = get_strategy(name)
    check_space = getattr(cls, "check_space", None)  # a strategy for one kind of space only
    if check_space is not None:
        check_space(space_or_dimension)
    dimension = int(getattr(space_or_dimension, "dimension", space_or_dimension))
    if isinstance(space_or_dimension, VectorSpace):
        options = {**black_box_defaults(cls, dimension, options), **options}
    strategy = cls(dimension, seed=seed, **options)
    if not getattr(space_or_dimension, "supports_low_rank", True):  # a dimension: not known yet
        refuse_low_rank(spec_rank(strategy.options))
    return strategy
