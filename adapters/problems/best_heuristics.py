"""The best heuristics an AHD run found: the distinct codes of its ``trajectories.jsonl``, ranked
by the reward logged for them, and the top ones scored again, in the sandbox, on every example
of one split, so that codes logged on different examples compare on the same instances.

In the generalisation setting the split is the held-out one (instances no step trained on); in
the test-time setting (``problem.task.test_time``) it is the instance set the run optimized.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from esbox.errors import ConfigError


@dataclass(frozen=True)
class Candidate:
    """One distinct code of a run's log: the mean reward logged for it (weighted by how many
    completions wrote it), those completions, and the first step that scored it."""

    code: str
    logged_reward: float
    times: int
    first_step: int


@dataclass(frozen=True)
class Rescored:
    """A candidate scored on every example of a split: rewards and errors, one per example,
    the examples on which it beats the reference, and the summed cost against the reference's
    (cost None when any solution was invalid)."""

    candidate: Candidate
    rewards: list[float]
    errors: list[str | None]
    beats: int
    cost: float | None
    reference: float

    @property
    def mean_reward(self) -> float:
        return sum(self.rewards) / len(self.rewards) if self.rewards else 0.0


def candidates(records: Iterable[dict[str, Any]]) -> list[Candidate]:
    """The distinct codes of heuristic records (records without code left out), best logged
    reward first, then the most written, then the earliest."""
    sums: dict[str, list[float]] = {}
    for record in records:
        code = record.get("code")
        if not code:
            continue
        times = int(record.get("times", 1))
        entry = sums.setdefault(code, [0.0, 0, float(record["step"])])
        entry[0] += float(record["reward"]) * times
        entry[1] += times
        entry[2] = min(entry[2], float(record["step"]))
    found = [Candidate(c, total / n, int(n), int(step)) for c, (total, n, step) in sums.items()]
    return sorted(found, key=lambda c: (-c.logged_reward, -c.times, c.first_step))


def rescore(task: Any, chosen: Sequence[Candidate], examples: Sequence[Any]) -> list[Rescored]:
    """Each candidate scored on every example (``task.score_code``, not counted), best mean
    reward first (ties keep the logged order)."""
    results = []
    for candidate in chosen:
        outcomes = [task.score_code(candidate.code, example) for example in examples]
        costs = [o.cost for o in outcomes]
        results.append(
            Rescored(
                candidate,
                [o.reward for o in outcomes],
                [o.error for o in outcomes],
                sum(o.cost is not None and o.cost < o.reference for o in outcomes),
                None if any(c is None for c in costs) else float(sum(costs)),  # type: ignore[arg-type]
                float(sum(o.reference for o in outcomes)),
            )
        )
    return sorted(results, key=lambda r: -r.mean_reward)


def best_heuristics(run_dir: str | Path, top: int = 5, limit: int | None = None) -> list[Rescored]:
    """The ``top`` logged codes of an AHD run rescored on its evaluation split (see the module
    doc), the first ``limit`` examples of it (None: all); ConfigError for a run without AHD
    records."""
    from esbox.adapters.agents.config import TRAJECTORIES_FILE
    from esbox.adapters.agents.transcript import is_heuristic, read_trajectories
    from esbox.adapters.problems.llm import load_scored_task
    from esbox.runconfig import load_yaml

    run_dir = Path(run_dir)
    path = run_dir / TRAJECTORIES_FILE
    records = read_trajectories(path) if path.is_file() else []
    if not records or not all(is_heuristic(r) for r in records):
        raise ConfigError(f"{run_dir} is not an AHD run with logged heuristics ({path})")
    task = load_scored_task(load_yaml(run_dir / "config.yaml")["problem"]["task"])
    examples = list(task.heldout)[:limit]
    if not examples:
        raise ConfigError(
            "problem.task.heldout_size is 0: no instances to rescore on (set test_time: true "
            "to score on the optimized instance set)"
        )
    return rescore(task, candidates(records)[:top], examples)
