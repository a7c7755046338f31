"""Black-box defaults: what a strategy on a vector space gets for the options left out.

Model spaces keep each strategy's own defaults (small fixed sigma, tuned for fine-tuning).
On a vector of unknown scale esbox follows the peers (CMA-ES, NES): a population of
4 + floor(3 ln d) rounded up to a size the strategy accepts, sigma adapted by the success rule
from sigma_0 = 1 (nevergrad's default for an unbounded array), and a "natural" learning rate
lr = eta sigma_0^p, whose step sigma sum r eps / N (p = 2: canonical; p = 1: reward-weighted)
keeps pace with sigma. eta undoes the scale of the shaping: 1 for z-scores, sqrt(12) for
centered ranks (whose standard deviation is about 1/sqrt(12)).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from esbox.adaptation import SuccessRule, is_adaptive
from esbox.errors import ConfigError
from esbox.schedules import make_schedule
from esbox.strategy import Strategy

DEFAULT_SIGMA = SuccessRule().initial
SHAPING_SCALE = {"centered_ranks": math.sqrt(12.0)}


def default_population(strategy: type[Strategy], dimension: int, given: Mapping[str, Any]) -> int:
    """4 + floor(3 ln d), rounded up to a multiple the strategy accepts under ``given``."""
    multiple = strategy.population_multiple(dict(given))
    wanted = 4 + int(3 * math.log(dimension))
    return max(multiple, math.ceil(wanted / multiple) * multiple)


def _initial_sigma(spec: Any) -> float | None:
    try:
        if is_adaptive(spec):
            return SuccessRule.from_config(spec).initial
        return make_schedule(spec, "sigma", positive=True)(0)
    except ConfigError:
        return None  # the strategy reports the bad sigma itself


def black_box_defaults(
    strategy: type[Strategy], dimension: int, given: Mapping[str, Any]
) -> dict[str, Any]:
    """The options ``strategy`` gets on a ``dimension``-d vector for the keys not in ``given``."""
    fields = {f.name: f for f in dataclasses.fields(strategy.Options)}
    defaults = {k: v for k, v in strategy.vector_defaults(dimension).items() if k not in given}
    given = {**defaults, **given}
    if "population" in fields and "population" not in given:
        defaults["population"] = default_population(strategy, dimension, given)
    if strategy.adapts_sigma:  # its own sigma and rate are its defaults
        return defaults
    if "sigma" in fields and "sigma" not in given:
        defaults["sigma"] = {"kind": "adaptive", "initial": DEFAULT_SIGMA}
    if "learning_rate" in fields and "learning_rate" not in given:
        sigma = _initial_sigma(given.get("sigma", defaults.get("sigma")))
        shaping = given.get("shaping", fields["shaping"].default if "shaping" in fields else "")
        if sigma is not None:
            eta = SHAPING_SCALE.get(shaping, 1.0) if isinstance(shaping, str) else 1.0
            defaults["learning_rate"] = eta * sigma**strategy.adaptive_rate_power
    return defaults
