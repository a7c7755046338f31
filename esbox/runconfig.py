"""The run configuration of the ``esbox`` command: typed sections, dotted overrides, YAML I/O.

A run config names the strategy and its options, the problem, the budget, the seed, the
checkpoint cadence and the output directory. Every key has a default, a type and a help text
(``esbox.config.option``). The problem section is open: ``problem.kind`` picks an options
class supplied by the caller (the CLI's problem registry), so this module knows no adapter.
"""

from __future__ import annotations

import copy
import dataclasses
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from esbox.config import build_options, describe_options, option
from esbox.defaults import black_box_defaults
from esbox.errors import ConfigError, unknown_key_message
from esbox.registry import available_strategies, get_strategy
from esbox.restarts import RestartOptions
from esbox.schedules import Constant, Cosine, Linear, schedule_to_config
from esbox.trackers import TrackingConfig

DEFAULT_PROBLEM_KIND = "function"


def section(cls: type, help: str) -> Any:
    """A dataclass field holding a nested config section."""
    return dataclasses.field(default_factory=cls, metadata={"help": help, "section": True})


@dataclass
class BudgetConfig:
    """When to stop; the first limit reached wins."""

    max_evaluations: int | None = option(
        20000, "stop before exceeding this many evaluations", minimum=1
    )
    max_steps: int | None = option(None, "stop after this many steps", minimum=1)
    max_seconds: float | None = option(
        None, "stop after this much wall time (not reproducible)", minimum=0, exclusive_minimum=True
    )
    max_cpu_seconds: float | None = option(
        None,
        "stop after this much CPU time of the run's process, all threads (not reproducible; "
        "equal-compute comparisons: esbox optimize --budget-from)",
        minimum=0,
        exclusive_minimum=True,
    )
    max_nonfinite_steps: int = option(
        1,
        "stop the run as failed (exit 3) after this many steps in a row without a finite reward "
        "(1: at the first)",
        minimum=1,
    )

    def limits(self) -> dict[str, Any]:
        """The evaluation, step and time limits (the keyword arguments of ``esbox.Budget``)."""
        return {
            "max_evaluations": self.max_evaluations,
            "max_steps": self.max_steps,
            "max_seconds": self.max_seconds,
            "max_cpu_seconds": self.max_cpu_seconds,
        }


@dataclass
class CheckpointConfig:
    """How often the full run state is written (atomically) to RUN_DIR/checkpoints."""

    every: int = option(10, "steps between checkpoints (0: only on Ctrl-C)", minimum=0)
    keep: int | None = option(3, "newest checkpoints to keep (null: keep all)", minimum=1)


@dataclass
class OutputConfig:
    """Where the run directory goes."""

    dir: str = option(
        "runs/{strategy}-{time}",
        "run directory; {strategy}, {problem}, {seed} and {time} are filled in",
    )


@dataclass
class ScaleConfig:
    """Where the population is scored: in this process, or on a pool of Ray workers (each a
    replica of the problem); the trajectory is the same either way (docs/scale-out.md)."""

    workers: int = option(0, "Ray workers, one replica each (0: score in this process)", minimum=0)
    address: str = option(
        "local",
        "local: start a private Ray for the run and stop it after; auto: join the running "
        "cluster; ray://HOST:PORT or HOST:PORT: join that cluster (never shut down)",
    )
    cpus: float = option(1.0, "CPUs Ray reserves for each worker", minimum=0)
    gpus: float = option(0.0, "GPUs Ray reserves for each worker (1: a GPU each)", minimum=0)
    memory: float | None = option(
        None, "GiB of memory Ray reserves for each worker (null: none)", minimum=0
    )
    placement: str = option(
        "default", "how Ray places workers on nodes", choices=("default", "spread")
    )
    driver_replica: bool = option(
        True,
        "keep a replica in this process that follows every update (checkpoints, validation and "
        "the saved result read it); false when the workers use another device type",
    )
    verify_every: int = option(
        0, "steps between drift checks of every replica's parameters (0: never)", minimum=0
    )
    retries: int = option(
        3, "dead workers replaced in one step before the run stops with an error", minimum=0
    )
    replay_limit: int = option(
        50,
        "a replacement replays at most this many update specs to catch up; beyond, it copies "
        "the parameters from a live replica",
        minimum=0,
    )


@dataclass
class RunConfig:
    """A whole run: re-running a resolved config reproduces the run."""

    strategy: str = option("copes", "registered strategy name (see `esbox strategies`)")
    seed: int = option(0, "run seed: noise, partitions and the default start point", minimum=0)
    options: dict = option({}, "strategy options (see `esbox strategies NAME`)")
    problem: dict = option(
        {"kind": DEFAULT_PROBLEM_KIND}, "what to optimize; problem.kind selects its keys"
    )
    budget: BudgetConfig = section(BudgetConfig, "when to stop")
    checkpoint: CheckpointConfig = section(CheckpointConfig, "checkpoint cadence")
    output: OutputConfig = section(OutputConfig, "the run directory")
    tracking: TrackingConfig = section(TrackingConfig, "TensorBoard and wandb beside the JSONL")
    scale: ScaleConfig = section(ScaleConfig, "scale-out on Ray")
    restarts: RestartOptions = section(
        RestartOptions, "termination criteria and restarts on vectors (docs/strategies.md)"
    )


def _sections(cls: type) -> dict[str, type]:
    return {f.name: f.default_factory for f in dataclasses.fields(cls) if f.metadata.get("section")}


# -- resolution -------------------------------------------------------------------------------
def resolve(data: Mapping[str, Any] | None, problem_kinds: Mapping[str, type]) -> RunConfig:
    """Validate a raw config mapping and fill every default; ConfigError names a bad key.

    ``problem_kinds`` maps each ``problem.kind`` to the options dataclass of that kind.
    """
    data = dict(data or {})
    fields = [f.name for f in dataclasses.fields(RunConfig)]
    for key in data:
        if key not in fields:
            raise ConfigError(unknown_key_message("config key", str(key), fields))
    values: dict[str, Any] = {}
    for key, cls in _sections(RunConfig).items():
        raw = data.pop(key, None)
        if raw is None:
            raw = {}
        if not isinstance(raw, Mapping):
            raise ConfigError(f"config key '{key}' must be a mapping, got {raw!r}")
        values[key] = build_options(cls, dict(raw), where=f"{key} key")
    for key in ("options", "problem"):
        if data.get(key) is None:
            data.pop(key, None)
    config = build_options(RunConfig, {**data, **values}, where="config key")
    get_strategy(config.strategy)  # an unknown strategy is reported before the problem
    config.problem = resolve_problem(config.problem, problem_kinds)
    dimension = vector_dimension(config.problem, problem_kinds)
    config.options = resolve_options(config.strategy, config.options, dimension)
    _check_budget(config.budget)
    return config


def resolve_options(
    strategy: str, options: Mapping[str, Any], vector_dimension: int | None = None
) -> dict[str, Any]:
    """All options of ``strategy`` with defaults filled in, checked by its Options class.

    On a vector problem of ``vector_dimension`` the black-box defaults come first
    (``esbox.defaults``), as ``make_strategy`` gives them on a ``VectorSpace``.
    """
    cls = get_strategy(strategy)
    if vector_dimension is not None:
        options = {**black_box_defaults(cls, vector_dimension, options), **options}
    try:
        built = build_options(cls.Options, dict(options), where=f"{strategy} option")
    except ConfigError as exc:
        raise ConfigError(f"{exc}{_elsewhere(strategy, options)}") from None
    resolved = {}
    for f in dataclasses.fields(built):
        value = getattr(built, f.name)
        if isinstance(value, (Constant, Linear, Cosine)):
            value = schedule_to_config(value)
        resolved[f.name] = copy.deepcopy(value)
    return resolved


def split_options(strategy: str, options: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """``options`` split into those ``strategy`` takes and the names of those it does not
    (used when a run switches strategy: the old strategy's own options are dropped)."""
    own = {f.name for f in dataclasses.fields(get_strategy(strategy).Options)}
    kept = {k: v for k, v in options.items() if k in own}
    return kept, [k for k in options if k not in own]


def _elsewhere(strategy: str, options: Mapping[str, Any]) -> str:
    """Which other strategies have the options ``strategy`` lacks (e.g. esopt's contexts)."""
    hints = []
    for key in split_options(strategy, options)[1]:
        names = [
            name
            for name, cls in available_strategies().items()
            if key in {f.name for f in dataclasses.fields(cls.Options)}
        ]
        if names:
            hints.append(f"options.{key} is an option of strategy {', '.join(names)}")
    return "; " + "; ".join(hints) if hints else ""


def resolve_problem(problem: Mapping[str, Any], problem_kinds: Mapping[str, type]) -> dict:
    """The problem section with ``kind`` and every default of that kind filled in."""
    values = dict(problem)
    kind = values.pop("kind", DEFAULT_PROBLEM_KIND)
    if kind not in problem_kinds:
        raise ConfigError(unknown_key_message("problem.kind", str(kind), problem_kinds))
    built = build_options(problem_kinds[kind], values, where=f"{kind} problem key")
    return {"kind": kind, **dataclasses.asdict(built)}


def vector_dimension(problem: Mapping[str, Any], problem_kinds: Mapping[str, type]) -> int | None:
    """d of a resolved problem whose kind optimizes a plain vector (its options class has a
    ``vector_dimension()``), else None."""
    values = {k: v for k, v in problem.items() if k != "kind"}
    built = problem_kinds[problem["kind"]](**values)
    method = getattr(built, "vector_dimension", None)
    return method() if method is not None else None


def _check_budget(budget: BudgetConfig) -> None:
    if all(v is None for v in budget.limits().values()):
        raise ConfigError(
            "budget needs at least one of budget.max_evaluations, budget.max_steps, "
            "budget.max_seconds, budget.max_cpu_seconds"
        )


def to_dict(config: RunConfig) -> dict[str, Any]:
    """The plain-data form of a resolved config (what ``config.yaml`` holds)."""
    return _plain(dataclasses.asdict(config))


def _plain(value: Any) -> Any:
    """Tuples become lists, so ``yaml.safe_dump`` can write every value."""
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    return value


# -- overrides ----------------------------------------------------------------------------------
_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


def parse_override(text: str) -> tuple[list[str], Any]:
    """``a.b=value`` -> (["a", "b"], value parsed as YAML: numbers, lists, mappings, null)."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not _KEY.match(key):
        raise ConfigError(
            f"--set expects KEY=VALUE with a dotted KEY like budget.max_steps=50, got {text!r}"
        )
    try:
        value = yaml.load(raw, Loader=_Loader) if raw.strip() else None
    except yaml.YAMLError as exc:
        raise ConfigError(f"--set {key}: malformed value {raw!r} ({_yaml_problem(exc)})") from None
    return key.split("."), value


def apply_overrides(data: Mapping[str, Any] | None, overrides: Iterable[str]) -> dict[str, Any]:
    """A copy of ``data`` with every ``a.b=value`` override set (missing sections are created)."""
    result = copy.deepcopy(dict(data or {}))
    for text in overrides:
        path, value = parse_override(text)
        node = result
        for depth, part in enumerate(path[:-1]):
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            elif not isinstance(child, dict):
                where = ".".join(path[: depth + 1])
                raise ConfigError(f"--set {'.'.join(path)}: '{where}' is {child!r}, not a section")
            node = child
        node[path[-1]] = value
    return result


# -- YAML ---------------------------------------------------------------------------------------
class _Loader(yaml.SafeLoader):
    """SafeLoader that also reads ``1e-3`` as a float (YAML 1.2), not as a string."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def _yaml_problem(exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc)
    if mark is None:
        return problem
    return f"line {mark.line + 1}, column {mark.column + 1}: {problem}"


def loads_yaml(text: str, source: str = "<config>") -> dict[str, Any]:
    """Parse a YAML config; malformed YAML is a ConfigError giving its line."""
    try:
        data = yaml.load(text, Loader=_Loader)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: malformed YAML at {_yaml_problem(exc)}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"{source}: a config must be a mapping of keys, got {type(data).__name__}"
        )
    return data


def load_yaml(path: str | Path) -> dict[str, Any]:
    """Read a YAML config file (ConfigError when missing or malformed)."""
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from None
    return loads_yaml(text, str(path))


def dumps_yaml(config: RunConfig | Mapping[str, Any], header: str = "") -> str:
    """YAML text of a config, keys in schema order, optionally after a comment header."""
    data = to_dict(config) if isinstance(config, RunConfig) else _plain(dict(config))
    text = yaml.safe_dump(data, sort_keys=False, default_flow_style=False, allow_unicode=True)
    comment = "".join(f"# {line}\n" if line else "#\n" for line in header.splitlines())
    return comment + text


# -- reference ----------------------------------------------------------------------------------
def config_reference(problem_kinds: Mapping[str, type]) -> list[dict[str, Any]]:
    """Every config key as a row: dotted key, type, default, help (and the problem kind)."""
    rows: list[dict[str, Any]] = []
    sections = _sections(RunConfig)
    for row in describe_options(RunConfig):
        if row["name"] in sections:
            for sub in describe_options(sections[row["name"]]):
                rows.append({**sub, "key": f"{row['name']}.{sub['name']}", "kind": None})
            continue
        rows.append({**row, "key": row["name"], "kind": None})
        if row["name"] == "problem":
            rows.append(
                {
                    "key": "problem.kind",
                    "name": "kind",
                    "type": "str",
                    "default": DEFAULT_PROBLEM_KIND,
                    "help": "problem kind: " + ", ".join(problem_kinds),
                    "choices": tuple(problem_kinds),
                    "kind": None,
                }
            )
            for kind, cls in problem_kinds.items():
                for sub in describe_options(cls):
                    rows.append({**sub, "key": f"problem.{sub['name']}", "kind": kind})
    return rows
