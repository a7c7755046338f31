"""One measurement of the scale suite in a fresh process: a shipped config run for a few steps
in one process on one core (``workers: 0``), or on a pool of Ray workers with one CPU each.

Both time the same steps after a warm-up step, then take one more step (on a pool, with worker
1 SIGKILLed: halfway through the step when a step is long enough, else just before it) and
return the checksum of the parameters. A pool also reports the traffic of its calls during the
timed steps and what replacing the killed worker cost. The parent is :mod:`benchmarks.scale`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from typing import Any

from benchmarks import measure

TASKS: dict[str, tuple[str, list[str]]] = {
    # the held-out validation runs on the driver: left out, it would time the driver alone
    "llm": ("examples/llm-arith.yaml",
            ["problem.validation_every=0", "problem.threads=1", "budget.max_seconds=null"]),
    "rastrigin": ("examples/rastrigin-copes.yaml", ["budget.max_evaluations=null"]),
}  # fmt: skip
MID_STEP_SECONDS = 1.0  # a step at least this long is killed halfway through, not before


class Timed:
    """An evaluator that adds the seconds it spends evaluating to ``seconds``; every other
    attribute is the wrapped evaluator's (e.g. ``best_value``)."""

    def __init__(self, evaluator: Any) -> None:
        self.evaluator, self.seconds = evaluator, 0.0

    def evaluate(self, space: Any, perturbations: Any) -> Any:
        elapsed = measure.stopwatch()
        try:
            return self.evaluator.evaluate(space, perturbations)
        finally:
            self.seconds += elapsed()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.evaluator, name)


def usage(pid: int) -> tuple[float, float]:
    """Seconds process ``pid`` has so far spent on a CPU (user + system) and runnable but
    waiting for one (its threads' run-queue time), from Linux ``/proc``."""
    with open(f"/proc/{pid}/stat") as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    waiting = 0
    for thread in os.listdir(f"/proc/{pid}/task"):
        with (
            contextlib.suppress(FileNotFoundError),
            open(f"/proc/{pid}/task/{thread}/schedstat") as handle,
        ):
            waiting += int(handle.read().split()[1])
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"), waiting / 1e9


def worker_pids(pool: Any) -> list[int]:
    """The process id of each worker of ``pool``."""
    import ray

    return [ray.get(actor.describe.remote())["pid"] for actor in pool.actors]


def kill_worker(pool: Any, index: int, delay: float) -> threading.Thread:
    """SIGKILL the process of worker ``index`` after ``delay`` seconds (as the OOM killer
    would); the thread that does it, started."""
    killer = threading.Timer(delay, os.kill, (worker_pids(pool)[index], signal.SIGKILL))
    killer.start()
    return killer


def child_scale(
    task: str, workers: int, warmup: int, steps: int, driver_replica: bool = True
) -> dict[str, Any]:
    """Run ``task`` for ``warmup + steps + 1`` steps on ``workers`` Ray workers (0: in this
    process, pinned to one core; ``driver_replica``: ``scale.driver_replica``); times,
    traffic, the replacement and the final checksum."""
    from benchmarks.quality_runs import init_worker

    init_worker()  # one thread in every numeric library, here and in the workers
    if not workers:
        os.sched_setaffinity(0, {max(os.sched_getaffinity(0))})
    from esbox.adapters.problems import load_run
    from esbox.adapters.scale import state_checksum

    config, overrides = TASKS[task]
    total = warmup + steps + 1
    started = measure.stopwatch()
    pool_sets = [f"scale.workers={workers}", "scale.cpus=1",
                 f"scale.driver_replica={str(driver_replica).lower()}"]  # fmt: skip
    session = load_run(measure.ROOT / config, [*overrides, f"budget.max_steps={total}", *pool_sets])
    result: dict[str, Any] = {"start_seconds": started()}
    try:
        runner = session.runner()
        runner.evaluator = timed = Timed(runner.evaluator)
        for _ in range(warmup):
            runner.step()
        pool = session.pool
        processes = [os.getpid(), *(worker_pids(pool) if pool is not None else [])]
        before = pool.traffic if pool is not None else None
        start = [usage(pid) for pid in processes]
        timed.seconds, elapsed = 0.0, measure.stopwatch()
        for _ in range(steps):
            runner.step()
        result.update(seconds=elapsed() / steps, evaluate_seconds=timed.seconds / steps)
        end = [usage(pid) for pid in processes]  # this process, then each worker
        result["cpu_seconds"] = [(e[0] - s[0]) / steps for s, e in zip(start, end, strict=True)]
        result["wait_seconds"] = [(e[1] - s[1]) / steps for s, e in zip(start, end, strict=True)]
        if pool is not None:
            after = pool.traffic
            result["traffic"] = {k: (getattr(after, k) - getattr(before, k)) / steps
                                 for k in ("calls", "sent", "received")}  # fmt: skip
            delay = result["seconds"] / 2 if result["seconds"] >= MID_STEP_SECONDS else 0.0
            killer = kill_worker(pool, 1, delay)
        elapsed = measure.stopwatch()
        runner.step()
        result["last_step_seconds"] = elapsed()
        if pool is not None:
            killer.join()
            result["replacements"] = [vars(r) for r in pool.replacements]
            result["checksum"] = pool.verify()  # every replica holds the driver's state
        else:
            result["checksum"] = state_checksum(session.problem.space)
            state = session.problem.space.state_dict()  # parameters, masters, optimizer state
            weights = [v for k, v in state.items() if k.startswith("param.")]
            result["weights_bytes"] = sum(t.numel() * t.element_size() for t in weights)
    finally:
        session.close()
    return result


def serve(spec: dict[str, Any]) -> dict[str, Any]:
    spec = dict(spec)
    spec.pop("kind", None)
    return child_scale(**spec)


if __name__ == "__main__":
    raise SystemExit(measure.serve_child(serve))
