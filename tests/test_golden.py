"""Golden-file regression: a short seeded run per strategy, compared with a recorded file.

Any change in seeds, noise, partitions, shaping or updates shows up here as a diff to review.
After an intended change, regenerate with ``ESBOX_UPDATE_GOLDEN=1 pytest tests/test_golden.py``
and commit the files under ``tests/golden/``.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import esbox
from esbox.adapters.functions import get_function
from esbox.space import VectorSpace

GOLDEN = Path(__file__).parent / "golden"
UPDATE = os.environ.get("ESBOX_UPDATE_GOLDEN") == "1"
RTOL = 1e-6  # tight, yet above last-bit fp32 differences between CPU SIMD paths of normal_
D, STEPS, SEED = 16, 6, 7
BASE = {"population": 8, "sigma": 0.1, "learning_rate": 0.05}
EXTRA = {"copes": {"subspaces": 2}}
VARIANTS = {"sgd": {}, "adam": {"optimizer": "adam", "weight_decay": 0.01}}
OWN_STEPS = {"cma": ("adam",)}  # pycma moves to its own mean: optimizer options are refused
NAMES = sorted(esbox.available_strategies())


def options(name: str, variant: str) -> dict[str, Any]:
    return {**BASE, **EXTRA.get(name, {}), **VARIANTS[variant]}


def record(name: str, variant: str) -> dict[str, Any]:
    """Run the seeded ask/tell loop on Rosenbrock and record what it did."""
    f = get_function("rosenbrock")
    opts = options(name, variant)
    space = VectorSpace(np.linspace(-1.5, 1.5, D), chunk_size=5)
    es = esbox.make_strategy(name, space, seed=SEED, **opts)
    steps = []
    for _ in range(STEPS):
        members = es.ask()
        rewards = np.array([-f(space.materialize(p)) for p in members])
        update = es.tell(rewards)
        norm = space.apply(update)
        steps.append(
            {
                "seeds": [p.seed for p in members],
                "scales": [p.scale for p in members],
                "subspaces": [p.subspace for p in members],
                "rewards": rewards.tolist(),
                "coefficients": [t.coefficient for t in update.terms],
                "learning_rate": update.learning_rate,
                "update_norm": norm,
            }
        )
    return {
        "strategy": name,
        "variant": variant,
        "options": opts,
        "dimension": D,
        "seed": SEED,
        "steps": steps,
        "x_head": space.vector[:8].tolist(),
        "f_final": float(f(space.vector)),
        "best_reward": es.best_reward,
    }


def compare(got: Any, want: Any, where: str = "") -> None:
    """Ints, strings and structure exactly; floats to ``RTOL``."""
    if isinstance(want, dict):
        assert isinstance(got, dict) and sorted(got) == sorted(want), where
        for key in want:
            compare(got[key], want[key], f"{where}.{key}")
    elif isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), where
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            compare(g, w, f"{where}[{i}]")
    elif isinstance(want, float):
        assert isinstance(got, (int, float)), where
        assert math.isclose(got, want, rel_tol=RTOL, abs_tol=1e-12), f"{where}: {got!r} != {want!r}"
    else:
        assert got == want, f"{where}: {got!r} != {want!r}"


@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("name", NAMES)
def test_seeded_run_matches_its_golden_file(name: str, variant: str) -> None:
    if variant in OWN_STEPS.get(name, ()):
        pytest.skip(f"{name} makes its own steps: no {variant} optimizer")
    path = GOLDEN / f"{name}-{variant}.json"
    got = json.loads(json.dumps(record(name, variant)))
    if UPDATE:
        GOLDEN.mkdir(exist_ok=True)
        path.write_text(json.dumps(got, indent=1) + "\n")
    assert path.is_file(), f"no golden file {path.name}: run with ESBOX_UPDATE_GOLDEN=1"
    compare(got, json.loads(path.read_text()), name)


def test_golden_run_is_deterministic() -> None:
    """The recording itself replays: two runs in one process agree bit for bit."""
    for name in NAMES:
        assert record(name, "sgd") == record(name, "sgd")


def test_golden_files_belong_to_registered_strategies() -> None:
    expected = {f"{n}-{v}.json" for n in NAMES for v in VARIANTS}
    assert {p.name for p in GOLDEN.glob("*.json")} <= expected


def test_compare_catches_small_drift() -> None:
    want = {"a": [1.0, 2.0], "b": 3}
    compare({"a": [1.0, 2.0], "b": 3}, want)
    with pytest.raises(AssertionError):
        compare({"a": [1.0, 2.0 * (1 + 1e-5)], "b": 3}, want)
    with pytest.raises(AssertionError):
        compare({"a": [1.0, 2.0], "b": 4}, want)
