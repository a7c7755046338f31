"""Automatic heuristic design (AHD, the FunSearch / EoH family): the model writes one function, the
sandbox runs it on seeded problem instances, and the solution quality against a reference
heuristic is the reward.

Each example holds ``instances`` instances of one problem (train and held-out from separate seed
streams, never sharing an instance). A completion's code is the last fenced code block that
defines the function (else the text from its ``def``), read after the example's prefill when
``use_prefill`` starts the reply with a code fence; it runs only in esbox's sandbox
(:mod:`esbox.adapters.agents.sandbox`), inside a program made of :mod:`.ahd_runtime`, the code
and a call of ``main``, which prints the solutions it built. The host checks every solution and
measures its cost ``c`` (lower is better), summed over the example's instances, against the
reference's cost ``c_ref`` on the same instances:

    g = (c_ref - c) / c_ref                          (0 when c_ref = 0)
    reward = v + (1 - v) * min(g, 1)    if g >= 0
             v * max(1 + g, 0)          if g < 0

with ``v`` the ``valid_credit`` (0 by default: the reference heuristic and any heuristic no better
than it score 0, like a crash). With ``v > 0`` valid code scores above failing code, and worse
code less than better: a small model that writes only valid-but-worse code still gives ES
differences to follow. Code that
fails (no function, an exception, the wrong return type, a time, memory or output limit, an
invalid solution) scores 0 and is a counted error: ``errors`` and ``error_kinds`` on the task,
``metrics()`` as figures. The run goes on. ``is_correct`` means "beats the reference", so an
evaluation's accuracy is the fraction of examples on which the code beats it.

Two settings, as in Agentic ESOpt: generalisation (the default: train on one seed stream,
report on held-out instances never trained on) and ``test_time`` (the run optimizes for one
instance set, the ``train_size`` examples, and its held-out split *is* that set, so validation
reports the score on the instances being optimized; ``heldout_size`` is unused). Either way the
result is the best heuristic found: :mod:`esbox.adapters.problems.best_heuristics`.
"""

from __future__ import annotations

import inspect
import json
import re
from abc import abstractmethod
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from esbox.errors import ConfigError

from . import ahd_runtime
from .base import Example, Task, make_prompt
from .checks import check_fraction, check_int, check_positive

_FENCE = re.compile(r"```[ \t]*(?:python|py)?[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL)
CACHE_SIZE = 4096
EVIDENCE_CHARS = 1200  # longest code shown to a context proposer (cut with a marker)


def extract_code(text: str, function: str) -> str | None:
    """The last fenced block of ``text`` that defines ``function``, else the text from its def."""
    definition = re.compile(rf"^def[ \t]+{re.escape(function)}[ \t]*\(", re.MULTILINE)
    blocks = [b for b in _FENCE.findall(text) if definition.search(b)]
    if blocks:
        return blocks[-1]
    found = definition.search(text)
    return text[found.start() :] if found else None


@dataclass(frozen=True)
class Outcome:
    """How one completion did on one example: its reward, costs, and the error (None if none)."""

    reward: float
    cost: float | None
    reference: float
    error: str | None = None


class AHDTask(Task):
    """The shared AHD machinery; a subclass sets the problem (see the module docstring).

    ``sandbox`` runs the code: anything with ``run(code, stdin=...)`` answering like
    :class:`esbox.adapters.agents.sandbox.SandboxResult` (``stdout``, ``error``, ``truncated``).
    The tasks room may not import the agents room, so whoever builds the task from a run config
    builds it from :meth:`sandbox_options` and hands it over; scoring without one raises.

    It defines ``problem`` (the runtime's kind), ``function``, ``signature`` (the prompt's
    description), ``reference_code`` and ``reference`` (the same heuristic as a callable),
    ``_instance(rng)`` and ``_cost(instance, solution)`` (None for an invalid solution).
    """

    problem = ""
    function = ""
    signature = ""
    reference_name = ""
    reference_code = ""
    reference: Callable[..., Any]  # the reference heuristic as a callable (a staticmethod)
    max_new_tokens = 512

    def __init__(
        self,
        *,
        instances: int = 4,
        train_size: int = 64,
        heldout_size: int = 16,
        seed: int = 0,
        cpu_seconds: float = 4.0,
        sandbox_mode: str = "auto",
        chat: bool = True,
        system: str | None = None,
        use_prefill: bool = False,
        test_time: bool = False,
        valid_credit: float = 0.0,
        sandbox: Any = None,
    ) -> None:
        check_int("instances", instances, 1)
        self.valid_credit = check_fraction("valid_credit", valid_credit)
        check_int("train_size", train_size, 1)
        check_int("heldout_size", heldout_size, 0)
        check_int("seed", seed, 0)
        self.cpu_seconds = check_positive("cpu_seconds", cpu_seconds)
        if sandbox_mode not in ("auto", "bwrap", "rlimits"):
            raise ConfigError(
                f"problem.task.sandbox_mode must be auto, bwrap or rlimits, got {sandbox_mode!r}"
            )
        self.sandbox_mode = sandbox_mode
        if sandbox is not None and not callable(getattr(sandbox, "run", None)):
            raise ConfigError("problem.task.sandbox is built by esbox, not set in a config")
        self.sandbox = sandbox
        self._cache: OrderedDict[tuple, Outcome] = OrderedDict()
        self.errors, self.scored = 0, 0
        self.attempts: list[dict[str, Any]] | None = None  # a list: record each scored completion
        self.error_kinds: Counter[str] = Counter()
        prompt = make_prompt(self.prompt_text(), chat=chat, system=system)
        prefill = "```python\n" if use_prefill else None
        train = self._split(prompt, prefill, "train", 0, train_size, instances, seed, set())
        seen = {json.dumps(i) for e in train for i in e.meta["instances"]}
        if not isinstance(test_time, bool):
            raise ConfigError(f"problem.task.test_time must be true or false, got {test_time!r}")
        self.test_time = test_time
        if test_time:  # one instance set, optimized for and scored on: the held-out split is it
            held = train
        else:
            held = self._split(prompt, prefill, "heldout", 1, heldout_size, instances, seed, seen)
        super().__init__(train, held)

    @abstractmethod
    def _instance(self, rng: np.random.Generator) -> dict[str, Any]:
        """One seeded problem instance (JSON-ready)."""

    @abstractmethod
    def _cost(self, instance: dict[str, Any], solution: Any) -> float | None:
        """The cost of ``solution`` on ``instance``; None when it is not a valid solution."""

    def prompt_text(self) -> str:
        """The instruction: the function to write, the reference to improve on, the rules."""
        return (
            f"{self.signature}\n\nThe reference heuristic ({self.reference_name}) is:\n\n"
            f"```python\n{self.reference_code}```\n\nWrite an improved `{self.function}` that "
            f"gives better solutions. Reply with one ```python code block defining "
            f"`{self.function}`; only the Python standard library is available (no numpy)."
        )

    def _split(
        self, prompt: Any, prefill: str | None, split: str, stream: int, size: int,
        instances: int, seed: int, avoid: set[str],
    ) -> list[Example]:  # fmt: skip
        """``size`` examples from the seed stream ``(seed, stream)``, skipping any in ``avoid``."""
        rng = np.random.default_rng([seed, stream])
        examples = []
        for index in range(size):
            group = []
            while len(group) < instances:
                instance = self._instance(rng)
                if json.dumps(instance) not in avoid:
                    group.append(instance)
            meta = {"split": split, "index": index, "instances": group}
            examples.append(Example(prompt, "", prefill, meta))
        return examples

    def reference_cost(self, example: Example) -> float:
        """The reference heuristic's cost on the example's instances (computed once)."""
        if "reference_cost" not in example.meta:
            example.meta["reference_cost"] = sum(
                self._cost(i, ahd_runtime.solve(self.problem, self.reference, i))
                for i in example.meta["instances"]
            )
        return example.meta["reference_cost"]

    def sandbox_options(self) -> dict[str, Any]:
        """What the sandbox for this task needs: its ``mode`` and ``limits`` (SandboxLimits'
        keyword arguments), the output cap sized to hold one example's solutions."""
        limits = {
            "cpu_seconds": self.cpu_seconds,
            "wall_seconds": 2 * self.cpu_seconds + 2,
            "output_bytes": max(16_384, 4 * self._output_size()),
        }
        return {"mode": self.sandbox_mode, "limits": limits}

    def _output_size(self) -> int:
        """An upper bound on the bytes of one example's printed solutions."""
        example = self.train[0]
        return 64 + sum(8 * len(json.dumps(i)) // 4 for i in example.meta["instances"])

    def program(self, code: str) -> str:
        """The sandboxed program: the runtime's source, then ``main`` on ``code``."""
        runtime = inspect.getsource(ahd_runtime)
        call = f"main({self.problem!r}, {code!r}, {self.function!r})\n"
        return f"{runtime}\n\n{call}"

    def outcome(self, completion: str, example: Example, count: bool = True) -> Outcome:
        """Run the completion's code on the example's instances and score it (cached); with
        ``count`` it adds to the counters."""
        code = extract_code((example.prefill or "") + completion, self.function)
        result = self.score_code(code, example)
        if not count:
            return result
        self.scored += 1
        if self.attempts is not None:
            split, index = example.meta["split"], example.meta["index"]
            record = {"split": split, "index": index, "code": code, **vars(result)}
            self.attempts.append(record)
        if result.error is not None:
            self.errors += 1
            self.error_kinds[result.error] += 1
        return result

    def score_code(self, code: str | None, example: Example) -> Outcome:
        """Run ``code`` (None: no code found) on the example's instances, once per code and
        example (cached); not counted."""
        key = (code, example.meta["split"], example.meta["index"])
        result = self._cache.get(key)
        if result is None:
            result = self._run(code, example)
            self._cache[key] = result
            if len(self._cache) > CACHE_SIZE:
                self._cache.popitem(last=False)
        return result

    def _run(self, code: str | None, example: Example) -> Outcome:
        if self.sandbox is None:  # checked first, so that a run wired without one fails at once
            raise RuntimeError(
                f"{self.name} runs model-written code only in a sandbox: pass sandbox= (an "
                f"esbox.adapters.agents.sandbox.Sandbox built from task.sandbox_options())"
            )
        reference = float(self.reference_cost(example))
        if code is None:
            return Outcome(0.0, None, reference, "no code")
        instances = example.meta["instances"]
        ran = self.sandbox.run(self.program(code), stdin=json.dumps(instances))
        if ran.truncated:
            return Outcome(0.0, None, reference, "output limit")
        if ran.error is not None:
            failed = "error" if ran.error.startswith("exit") else ran.error
            return Outcome(0.0, None, reference, failed)
        lines = [s for s in ran.stdout.splitlines() if s.startswith(ahd_runtime.MARKER)]
        try:
            solutions = json.loads(lines[-1][len(ahd_runtime.MARKER) :])
        except (IndexError, ValueError):
            return Outcome(0.0, None, reference, "no result")
        if not isinstance(solutions, list) or len(solutions) != len(instances):
            return Outcome(0.0, None, reference, "no result")
        costs = [self._cost(i, s) for i, s in zip(instances, solutions, strict=True)]
        if any(c is None for c in costs):
            return Outcome(0.0, None, reference, "invalid solution")
        cost = float(sum(costs))
        return Outcome(self.reward_of(cost, reference), cost, reference)

    def reward_of(self, cost: float, reference: float) -> float:
        """A valid solution's reward from its cost against the reference's (module doc)."""
        gain = (reference - cost) / reference if reference > 0 else 0.0
        credit = self.valid_credit
        if gain >= 0.0:
            return credit + (1.0 - credit) * min(gain, 1.0)
        return credit * max(1.0 + gain, 0.0)

    def score(self, completion: str, example: Example) -> float:
        return self.outcome(completion, example).reward

    def is_correct(self, completion: str, example: Example) -> bool:
        """The code beats the reference on the example's instances (not counted: an
        evaluation asks this and the reward of the same completion)."""
        result = self.outcome(completion, example, count=False)
        return result.cost is not None and result.cost < result.reference

    def evidence(self, top: int) -> str:
        """The ``top`` best distinct codes scored on train examples since the attempts were last
        emptied (a step's, for ESOpt's context proposer), with their mean reward and errors.

        Each (code, example) counts once, so the text does not depend on how many members wrote
        a code, nor on a scoring repeated after a resume; ties keep the first code written.
        """
        if not self.attempts:
            return ""
        per_code: dict[str | None, dict[int, dict[str, Any]]] = {}
        for attempt in self.attempts:
            if attempt["split"] == "train":
                per_code.setdefault(attempt["code"], {}).setdefault(attempt["index"], attempt)
        if not per_code:
            return ""
        scored = [a for c in per_code.values() for a in c.values()]
        errors = Counter(a["error"] for a in scored if a["error"])
        ranked = sorted(
            (code for code in per_code if code is not None),
            key=lambda code: -float(np.mean([a["reward"] for a in per_code[code].values()])),
        )
        kinds = ", ".join(
            f"{k} {n}" for k, n in sorted(errors.items(), key=lambda e: (-e[1], e[0]))
        )
        examples = len({a["index"] for a in scored})
        lines = [
            f"The assistant's code this step, on {examples} train examples: {len(ranked)} "
            f"distinct codes; the reward is the gain over the reference heuristic, 0 for no gain "
            f"or failing code; failures, once per code and example: {kinds or 'none'}."
        ]
        if not ranked:
            lines.append(f"No reply defined `{self.function}`.")
        for rank, code in enumerate(ranked[:top], 1):
            runs = list(per_code[code].values())
            rewards = [a["reward"] for a in runs]
            failed = sorted({a["error"] for a in runs if a["error"]})
            wins = sum(r > 0 for r in rewards)
            shown = code if len(code) <= EVIDENCE_CHARS else code[:EVIDENCE_CHARS] + "\n# ...cut"
            lines.append(
                f"Code {rank}: mean reward {float(np.mean(rewards)):.3f} on {len(runs)} "
                f"examples, beats the reference on {wins}, errors: {', '.join(failed) or 'none'}"
                f"\n```python\n{shown.rstrip()}\n```"
            )
        return "\n\n".join(lines)

    def metrics(self, reset: bool = False) -> dict[str, float]:
        """The counters as figures: completions scored, errors, and errors of each kind; with
        ``reset`` they start again from 0."""
        kinds = {f"ahd_errors_{k.replace(' ', '_')}": float(v) for k, v in self.error_kinds.items()}
        figures = {"ahd_scored": float(self.scored), "ahd_errors": float(self.errors), **kinds}
        if reset:
            self.errors, self.scored = 0, 0
            self.error_kinds.clear()
        return figures
