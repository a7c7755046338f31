"""Bad input that used to pass silently (issue 19): an objective that never gives a number, a
budget smaller than one step, a dry run that missed errors, messages that leaked internals.

Each test here failed before the fix: optimize ran the whole budget on ``None`` rewards and
returned ``best_value=inf``; the CLI exited 0 on a 10-evaluation budget and on a bad
``problem.shift`` with ``--dry-run``; the schedule errors named ``Constant.__init__``.
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import numpy as np
import pytest
import yaml
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

import esbox
from esbox import ConfigError, RewardError, RewardTypeError
from esbox.adapters.functions import get_function
from esbox.cli.main import cli
from esbox.config import describe_options
from esbox.errors import ConfigWarning
from esbox.registry import get_strategy

X0 = np.ones(6)
OPTIONS = dict(population=8, subspaces=2, sigma=0.1, learning_rate=0.05)
COPES = dict(strategy="copes", **OPTIONS)  # esbox.optimize picks its own strategy otherwise
INTERNAL = ("__init__", "Traceback", "<class", "esbox.", "typing.")


def invoke(*args: str, cwd: Path | None = None):
    old = os.getcwd()
    if cwd is not None:
        os.chdir(cwd)
    try:
        return CliRunner().invoke(cli, list(args))
    finally:
        os.chdir(old)


# -- 1. an objective that never yields a usable number ----------------------------------------
@pytest.mark.parametrize(
    ("fn", "words"),
    [
        (lambda x: None, ["NoneType", "not a number"]),
        (lambda x: "1.0", ["str", "'1.0'", "not a number"]),
        (lambda x: [None], ["NoneType"]),
        (lambda x: 1 + 2j, ["complex"]),
    ],
)
def test_a_non_number_is_a_type_error_at_the_first_call(fn, words) -> None:
    calls = []

    def objective(x):
        calls.append(1)
        return fn(x)

    with pytest.raises(RewardTypeError) as info:
        esbox.optimize(objective, X0, budget=320, **COPES)
    assert isinstance(info.value, TypeError)
    assert len(calls) == 1
    for word in words:
        assert word in str(info.value)


def test_a_batched_function_returning_strings_is_refused() -> None:
    with pytest.raises(RewardTypeError, match="str"):
        esbox.optimize(lambda b: ["1.0"] * len(b), X0, budget=320, batched=True, **COPES)


def test_tell_refuses_strings_instead_of_converting_them() -> None:
    es = esbox.make_strategy("openai_es", 4, population=2, sigma=0.1)
    es.ask()
    with pytest.raises(RewardTypeError, match="str"):
        es.tell(["1.0", "2.0"])


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
def test_a_step_without_a_finite_reward_stops_the_run(value: float) -> None:
    with pytest.raises(RewardError, match="no finite reward"):
        esbox.optimize(lambda x: value, X0, budget=320, **COPES)


def test_max_nonfinite_steps_tolerates_that_many_steps_in_a_row() -> None:
    calls = []

    def objective(x):
        calls.append(1)
        return np.nan

    with pytest.raises(RewardError, match="3 step"):
        esbox.optimize(objective, X0, budget=320, max_nonfinite_steps=3, **COPES)
    assert len(calls) == 3 * OPTIONS["population"]
    with pytest.raises(ConfigError, match="max_nonfinite_steps"):
        esbox.optimize(objective, X0, budget=320, max_nonfinite_steps=0, **COPES)


def test_some_nonfinite_rewards_still_count_as_the_worst() -> None:
    """The documented rule is kept: a NaN among finite rewards is a failure, not a stop."""
    rng = np.random.default_rng(0)

    def flaky(x):
        return np.nan if rng.random() < 0.3 else float(np.sum(x**2))

    result = esbox.optimize(flaky, X0, budget=400, **COPES)
    assert result.steps == 50
    assert sum(h["nonfinite_rewards"] for h in result.history) > 0


def test_a_streak_is_reset_by_a_step_with_a_finite_reward() -> None:
    steps = iter(range(10**6))

    def every_other_step(x):
        return np.nan if (next(steps) // OPTIONS["population"]) % 2 == 0 else 1.0

    result = esbox.optimize(every_other_step, X0, max_steps=6, max_nonfinite_steps=2, **COPES)
    assert result.steps == 6


def test_any_evaluator_gets_the_same_rule_through_the_runner() -> None:
    """The LLM path: a task whose reward is never finite stops the Runner, whatever evaluates."""

    class NeverFinite:
        def evaluate(self, space, perturbations):
            return np.full(len(perturbations), np.nan)

    space = esbox.VectorSpace(X0)
    es = esbox.make_strategy("copes", space, **OPTIONS)
    runner = esbox.Runner(space, es, NeverFinite(), esbox.Budget(max_steps=5))
    with pytest.raises(RewardError, match="no finite reward"):
        runner.run()
    assert es.step == 0


def _objective_file(tmp_path: Path) -> None:
    (tmp_path / "obj.py").write_text(
        "def none(x):\n    return None\n\ndef nan(x):\n    return float('nan')\n"
    )


@pytest.mark.parametrize(("target", "words"), [("none", ["NoneType"]), ("nan", ["no finite"])])
def test_cli_exits_3_with_a_message_when_the_objective_gives_no_number(
    tmp_path, target, words
) -> None:
    _objective_file(tmp_path)
    problem = f"problem={{kind: callable, target: obj.py:{target}, x0: [1.0, 2.0]}}"
    result = invoke("optimize", "-q", "--set", problem, "--out", "run", cwd=tmp_path)
    assert result.exit_code == 3, result.output
    assert "Error:" in result.output and "Traceback" not in result.output
    for word in words:
        assert word in result.output
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["stop_reason"] == "bad_rewards"


@pytest.mark.parametrize(("setting", "steps"), [([], 0), (["budget.max_nonfinite_steps=3"], 2)])
def test_budget_max_nonfinite_steps_sets_how_many_nan_steps_a_cli_run_takes(
    tmp_path, setting, steps
) -> None:
    """The config key of ``max_nonfinite_steps``: an always-NaN objective stops after that many
    steps (the last one raising), with exit 3, and the key is saved in config.yaml."""
    _objective_file(tmp_path)
    problem = "problem={kind: callable, target: obj.py:nan, x0: [1.0, 2.0]}"
    args = [arg for s in setting for arg in ("--set", s)]
    result = invoke("optimize", "-q", "--set", problem, *args, "--out", "run", cwd=tmp_path)
    assert result.exit_code == 3, result.output
    assert f"no finite reward in {steps + 1} step(s) in a row (last: step {steps}" in result.output
    run = tmp_path / "run"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["stop_reason"] == "bad_rewards" and summary["steps"] == steps
    metrics = run / "metrics.jsonl"  # written from the first finished step on
    assert len(metrics.read_text().splitlines() if metrics.exists() else []) == steps
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert saved["budget"]["max_nonfinite_steps"] == steps + 1
    again = invoke("optimize", "--config", "run/config.yaml", "--dry-run", cwd=tmp_path)
    assert again.exit_code == 0, again.output
    assert yaml.safe_load(again.stdout)["budget"] == saved["budget"]  # the YAML round trip


@pytest.mark.parametrize("value", ["0", "1.5", "true", "many"])
def test_budget_max_nonfinite_steps_refuses_a_bad_value(value: str) -> None:
    result = invoke("optimize", "--dry-run", "--set", f"budget.max_nonfinite_steps={value}")
    assert result.exit_code == 2, result.output
    assert "max_nonfinite_steps" in result.output


# -- 2. a budget smaller than one step ----------------------------------------------------------
def test_optimize_refuses_a_budget_smaller_than_one_step() -> None:
    with pytest.raises(ConfigError, match="smallest budget that runs one step is 8"):
        esbox.optimize(lambda x: 1.0, X0, budget=5, **COPES)


@pytest.mark.parametrize("dry", [[], ["--dry-run"]])
def test_cli_refuses_a_budget_smaller_than_one_step(tmp_path, dry) -> None:
    result = invoke(
        "optimize", "-q", "--set", "budget.max_evaluations=10", "--out", "run", *dry, cwd=tmp_path
    )
    assert result.exit_code == 2, result.output
    assert "smallest budget that runs one step is 24" in result.output  # default N at d = 100
    assert not (tmp_path / "run").exists()


# -- 3. --dry-run validates what the real run validates ------------------------------------------
@pytest.mark.parametrize(
    ("setting", "word"),
    [
        ("problem.shift=[1, 2]", "shift"),
        ("problem.x0=[1, 2]", "x0"),
        ("problem={kind: callable, target: nowhere_module:f}", "nowhere_module"),
        ("problem={kind: callable, target: 'obj.py:missing'}", "missing"),
    ],
)
def test_dry_run_fails_where_the_real_run_fails(tmp_path, setting, word) -> None:
    _objective_file(tmp_path)
    for dry in (["--dry-run"], []):
        result = invoke("optimize", "-q", "--set", setting, "--out", "run", *dry, cwd=tmp_path)
        assert result.exit_code == 2, (dry, result.output)
        assert word in result.output
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("setting", "word"),
    [("problem.task.families=[division]", "families"), ("problem.task.kind=nosuch", "nosuch")],
)
def test_dry_run_builds_the_task_of_an_llm_run(tmp_path, setting, word) -> None:
    config = str(Path(__file__).resolve().parents[1] / "examples" / "agent-math.yaml")
    result = invoke("optimize", "--config", config, "--set", setting, "--dry-run", cwd=tmp_path)
    assert result.exit_code == 2, result.output
    assert "problem.task" in result.output and word in result.output
    assert invoke("optimize", "--config", config, "--dry-run", cwd=tmp_path).exit_code == 0


def test_dry_run_evaluates_nothing(tmp_path) -> None:
    (tmp_path / "obj.py").write_text("def f(x):\n    raise SystemExit('evaluated')\n")
    problem = "problem={kind: callable, target: obj.py:f, x0: [1.0]}"
    result = invoke("optimize", "--set", problem, "--dry-run", cwd=tmp_path)
    assert result.exit_code == 0, result.output
    assert "target:" in result.output


# -- 4. messages that contradict or leak internals -----------------------------------------------
@pytest.mark.parametrize("value", ["-0.1", "0", "{kind: cosine, start: 0, end: 0.1, steps: 5}"])
def test_sigma_must_be_positive_says_the_same_thing_everywhere(value: str) -> None:
    result = invoke("optimize", "--dry-run", "--set", f"options.sigma={value}")
    assert result.exit_code == 2
    assert "sigma" in result.output and "> 0" in result.output and ">= 0" not in result.output


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("{kind:cosine}", ["'kind:cosine'", "space after each colon"]),
        ("{kind: cosine}", ["missing start, end, steps"]),
        ("{kind: cosin, start: 1, end: 0.1, steps: 5}", ["did you mean 'cosine'"]),
        ("{kind: linear, start: 1, end: 0.1, steps: x}", ["sigma.steps", "integer"]),
        ("{kind: linear, start: 1, end: 0.1, step: 5}", ["did you mean 'steps'"]),
        ("[1]", ["a number, or a mapping"]),
    ],
)
def test_schedule_errors_name_the_key_and_the_form(value: str, words: list[str]) -> None:
    result = invoke("optimize", "--dry-run", "--set", f"options.sigma={value}")
    assert result.exit_code == 2
    for word in [*words, "sigma"]:
        assert word in result.output
    assert not any(name in result.output for name in INTERNAL), result.output


def _strategy_options() -> list[tuple[str, str]]:
    names = sorted(esbox.available_strategies())
    return [(s, row["name"]) for s in names for row in describe_options(get_strategy(s).Options)]


_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**20), 10**20),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
    st.sampled_from(["cosine", "linear", "constant", "kind", "zscore", "sgd", "adam"]),
)
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(
            st.one_of(
                st.sampled_from(["kind", "start", "end", "steps", "value"]),
                st.text(min_size=1, max_size=5),
            ),
            inner,
            max_size=4,
        ),
    ),
    max_leaves=6,
)


@settings(max_examples=40, derandomize=True, deadline=None)
@given(
    key=st.sampled_from(_strategy_options())
    | st.tuples(st.just("copes"), st.text(min_size=1, max_size=6)),
    value=_VALUES,
)
def test_fuzz_every_strategy_option_exits_0_or_2_without_internals(key, value) -> None:
    strategy, option = key
    text = yaml.safe_dump(value, default_flow_style=True, width=10**6).strip()
    text = text.removesuffix("\n...").strip()
    result = invoke(
        "optimize",
        "--dry-run",
        "--strategy",
        strategy,
        "--set",
        "problem.dimension=4",
        "--set",
        f"options.{option}={text}",
    )
    assert result.exit_code in (0, 2), (key, text, result.output, result.exception)
    if result.exit_code == 2:
        assert "Error:" in result.output
        assert not any(name in result.output for name in INTERNAL), (key, text, result.output)


# -- 5. hints --------------------------------------------------------------------------------------
def test_function_names_get_a_did_you_mean() -> None:
    with pytest.raises(ValueError, match="did you mean 'rastrigin'"):
        get_function("rastrign")
    result = invoke("optimize", "--dry-run", "--set", "problem.name=rastrign")
    assert result.exit_code == 2 and "did you mean 'rastrigin'" in result.output


@pytest.mark.parametrize(
    ("strategy", "settings_", "nearest"),
    [
        ("copes", ["options.population=18"], "16 or 24"),
        ("copes", ["options.population=12"], "8 or 16"),
        ("copes", ["options.population=18", "options.antithetic=false"], "16 or 20"),
        ("openai_es", ["options.population=15"], "14 or 16"),
    ],
)
def test_a_population_that_does_not_fit_names_the_nearest_valid_sizes(
    strategy, settings_, nearest
) -> None:
    args = [arg for s in settings_ for arg in ("--set", s)]
    result = invoke("optimize", "--dry-run", "--strategy", strategy, *args)
    assert result.exit_code == 2
    assert f"nearest valid populations: {nearest}" in result.output


def test_more_subspaces_than_weights_warns() -> None:
    with pytest.warns(ConfigWarning, match="subspaces"):
        esbox.make_strategy("copes", 3, population=8, subspaces=4)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConfigWarning)
        esbox.make_strategy("copes", 4, population=8, subspaces=4)
    result = invoke(
        "optimize", "--dry-run", "--set", "problem.dimension=3", "--set", "options.subspaces=4"
    )
    assert result.exit_code == 0
    assert "warning: copes option subspaces (4) exceeds the dimension (3)" in result.output


def test_resume_without_a_checkpoint_says_how_to_rerun(tmp_path) -> None:
    run = tmp_path / "run"
    args = ["--set", "problem.dimension=4", "--set", "options.population=8"]
    result = invoke(
        "optimize",
        "-q",
        *args,
        "--set",
        "budget.max_steps=3",
        "--set",
        "checkpoint.every=0",
        "--out",
        str(run),
    )
    assert result.exit_code == 0, result.output
    result = invoke("resume", str(run))
    assert result.exit_code == 2
    assert "checkpoint.every is 0" in result.output
    assert f"esbox optimize --config {run / 'config.yaml'} --out {run} --overwrite" in (
        " ".join(result.output.split())
    )
