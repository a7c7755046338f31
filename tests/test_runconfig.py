"""The run-config schema: defaults, validation messages, dotted overrides, YAML round-trip."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from esbox.adapters.problems import problem_options
from esbox.errors import ConfigError
from esbox.runconfig import (
    BudgetConfig,
    RunConfig,
    apply_overrides,
    config_reference,
    dumps_yaml,
    loads_yaml,
    parse_override,
    resolve,
    to_dict,
)

KINDS = problem_options()


def run_config(data: dict | None = None) -> RunConfig:
    return resolve(data, KINDS)


def test_defaults_fill_every_key():
    config = run_config({})
    assert config.strategy == "copes"
    assert config.problem["kind"] == "function"
    assert config.problem["name"] == "rastrigin" and config.problem["dimension"] == 100
    assert config.budget == BudgetConfig()
    # every option of the strategy is spelled out, so the saved config survives default changes
    assert {"population", "sigma", "subspaces", "standardization"} <= set(config.options)


def test_empty_sections_mean_defaults():
    config = run_config({"options": None, "problem": None, "budget": None})
    assert config == run_config({})


def test_problem_kind_switch_uses_that_kinds_defaults():
    config = run_config({"problem": {"kind": "callable", "target": "numpy.linalg:norm"}})
    assert config.problem["minimize"] is True
    assert "name" not in config.problem


@pytest.mark.parametrize(
    ("data", "words"),
    [
        ({"budjet": {}}, ["config key 'budjet'", "did you mean 'budget'"]),
        ({"budget": {"max_evals": 3}}, ["budget key 'max_evals'", "max_evaluations"]),
        ({"options": {"populaton": 8}}, ["copes option 'populaton'", "'population'"]),
        ({"problem": {"dimensoin": 3}}, ["problem key 'dimensoin'", "'dimension'"]),
        ({"problem": {"kind": "functoin"}}, ["problem.kind 'functoin'", "'function'"]),
        ({"strategy": "cope"}, ["strategy 'cope'", "did you mean 'copes'"]),
        ({"seed": "zero"}, ["'seed'", "int"]),
        ({"seed": -1}, ["'seed'", ">= 0"]),
        ({"budget": {"max_steps": 0}}, ["'max_steps'", ">= 1"]),
        ({"budget": {"max_seconds": 0}}, ["'max_seconds'", "> 0"]),
        ({"budget": {"max_evaluations": None}}, ["budget.max_evaluations"]),
        ({"budget": 5}, ["'budget'", "mapping"]),
        ({"options": {"shaping": "ranks"}}, ["'shaping'", "centered_ranks"]),
        ({"problem": {"name": "rastrign"}}, ["'name'", "rastrigin"]),
        ({"checkpoint": {"every": -1}}, ["'every'", ">= 0"]),
    ],
)
def test_bad_values_name_the_key(data, words):
    with pytest.raises(ConfigError) as info:
        run_config(data)
    for word in words:
        assert word in str(info.value)


@pytest.mark.parametrize(
    ("text", "path", "value"),
    [
        ("budget.max_steps=50", ["budget", "max_steps"], 50),
        ("options.learning_rate=1e-3", ["options", "learning_rate"], 1e-3),
        ("options.sigma=2.5E+2", ["options", "sigma"], 250.0),
        (
            "options.sigma={kind: cosine, start: 0.1}",
            ["options", "sigma"],
            {"kind": "cosine", "start": 0.1},
        ),
        ("problem.x0=[1, 2.5]", ["problem", "x0"], [1, 2.5]),
        ("problem.shift=null", ["problem", "shift"], None),
        ("problem.shift=", ["problem", "shift"], None),
        ("strategy=openai_es", ["strategy"], "openai_es"),
        ("options.antithetic=false", ["options", "antithetic"], False),
        ("output.dir=runs/a=b", ["output", "dir"], "runs/a=b"),
    ],
)
def test_parse_override(text, path, value):
    assert parse_override(text) == (path, value)


@pytest.mark.parametrize("text", ["budget", "=3", "a..b=1", ".a=1", "a b=1", "1a=2"])
def test_malformed_override_is_rejected(text):
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        parse_override(text)


def test_malformed_override_value():
    with pytest.raises(ConfigError, match=r"--set options.sigma: malformed value"):
        parse_override("options.sigma=[1, 2")


def test_apply_overrides_creates_sections_and_keeps_the_input():
    data = {"budget": {"max_steps": 3}}
    out = apply_overrides(data, ["budget.max_evaluations=10", "problem.dimension=7"])
    assert out == {"budget": {"max_steps": 3, "max_evaluations": 10}, "problem": {"dimension": 7}}
    assert data == {"budget": {"max_steps": 3}}


def test_override_into_a_value_is_rejected():
    with pytest.raises(ConfigError, match="'seed' is 3, not a section"):
        apply_overrides({"seed": 3}, ["seed.x=1"])


def test_overrides_apply_in_order():
    assert apply_overrides({}, ["seed=1", "seed=2"]) == {"seed": 2}


def test_malformed_yaml_reports_its_line():
    text = "strategy: copes\noptions:\n  population: 8\n  sigma: [0.1\nbudget: {}\n"
    with pytest.raises(ConfigError, match=r"run.yaml: malformed YAML at line \d+, column \d+"):
        loads_yaml(text, "run.yaml")
    with pytest.raises(ConfigError, match="line 3"):
        loads_yaml("a: 1\nb: 2\n  c: 3\n", "x.yaml")


def test_yaml_must_be_a_mapping():
    with pytest.raises(ConfigError, match="mapping"):
        loads_yaml("- a\n- b\n")
    assert loads_yaml("") == {}
    assert loads_yaml("# only a comment\n") == {}


def test_yaml_reads_exponent_floats():
    assert loads_yaml("lr: 1e-3\nn: 10\ns: 1.5e2\nname: e10\n") == {
        "lr": 0.001,
        "n": 10,
        "s": 150.0,
        "name": "e10",
    }


def test_round_trip_of_a_resolved_config():
    config = run_config(
        {
            "strategy": "esopt",
            "seed": 3,
            "options": {"sigma": {"kind": "cosine", "start": 0.1, "end": 1e-3, "steps": 50}},
            "problem": {"name": "ellipsoid", "params": {"condition": 1e4}, "shift": 5},
            "budget": {"max_steps": 20, "max_seconds": 1.5},
            "checkpoint": {"every": 0, "keep": None},
            "output": {"dir": "runs/x"},
        }
    )
    text = dumps_yaml(config, "header line\nsecond")
    assert text.startswith("# header line\n# second\n")
    again = run_config(loads_yaml(text))
    assert again == config
    assert to_dict(again) == to_dict(config)


@given(
    seed=st.integers(0, 2**31),
    population=st.sampled_from([4, 8, 16, 64]),
    sigma=st.floats(1e-6, 10, allow_nan=False),
    dimension=st.integers(1, 10_000),
    steps=st.one_of(st.none(), st.integers(1, 10**6)),
    x0=st.one_of(st.none(), st.floats(-5, 5, allow_nan=False)),
)
def test_round_trip_property(seed, population, sigma, dimension, steps, x0):
    data = {
        "seed": seed,
        "options": {"population": population, "sigma": sigma, "subspaces": 2},
        "problem": {"dimension": dimension, "x0": x0},
        "budget": {"max_steps": steps},
    }
    config = run_config(data)
    assert run_config(loads_yaml(dumps_yaml(config))) == config


def test_reference_lists_every_key_once():
    rows = config_reference(KINDS)
    keys = [row["key"] for row in rows if row["kind"] is None]
    assert len(keys) == len(set(keys))
    for f in dataclasses.fields(RunConfig):
        assert any(key == f.name or key.startswith(f.name + ".") for key in keys)
    for kind, cls in KINDS.items():
        names = {row["name"] for row in rows if row["kind"] == kind}
        assert names == {f.name for f in dataclasses.fields(cls)}
    assert all(row["help"] for row in rows)


def test_tuple_options_of_a_plugin_strategy_round_trip(monkeypatch):
    """YAML has no tuples: a tuple-typed plugin option is written as a list and read back as
    a tuple, and its items are still checked."""
    from esbox import registry
    from esbox.strategies.openai_es import OpenAIES

    @dataclasses.dataclass
    class Options(OpenAIES.Options):
        widths: tuple[int, ...] = (4, 2)
        pair: tuple[float, str] | None = None

    class Widths(OpenAIES):
        pass

    Widths.Options = Options
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    registry.register("widths_es")(Widths)
    config = run_config(
        {"strategy": "widths_es", "options": {"widths": [8, 4, 2], "pair": [0.5, "a"]}}
    )
    assert config.options["widths"] == (8, 4, 2) and config.options["pair"] == (0.5, "a")
    text = dumps_yaml(config)
    assert "- 8" in text and "!!python" not in text
    assert run_config(loads_yaml(text)) == config
    with pytest.raises(ConfigError, match=r"'widths' must be of type tuple\[int, \.\.\.\]"):
        run_config({"strategy": "widths_es", "options": {"widths": [8, "four"]}})
    with pytest.raises(ConfigError, match="'pair'"):
        run_config({"strategy": "widths_es", "options": {"pair": [1.0, 2.0, "x"]}})
