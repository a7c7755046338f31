"""A user's own tool named in a config as ``module:name``: imported before the model loads,
offered to the model beside the built-in ones, and refused with the key named when it is wrong."""

from __future__ import annotations

import json
import sys
import textwrap

import pytest

pytest.importorskip("transformers")

from click.testing import CliRunner

from esbox.adapters.agents.config import agent_options, import_tool, make_tools
from esbox.adapters.agents.tools import Tool
from esbox.adapters.tasks import ToolMathTask
from esbox.cli.main import cli
from esbox.errors import ConfigError

MODULE = '''
from esbox.adapters.agents.tools import Tool, ToolError


def shout(text: str) -> str:
    """Upper-case a text."""
    return text.upper()


class Echo(Tool):
    name = "echo"
    description = "Repeat a text."
    parameters = {"type": "object", "properties": {"text": {"type": "string"}},
                  "required": ["text"]}

    def __call__(self, text: str) -> str:
        return text


echo = Echo()
not_a_tool = 42


def untyped(text):
    """No type hints: no schema."""
    return text
'''


@pytest.fixture
def user_tools(tmp_path, monkeypatch):
    (tmp_path / "my_agent_tools.py").write_text(textwrap.dedent(MODULE))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "my_agent_tools"
    sys.modules.pop("my_agent_tools", None)


def test_a_function_a_class_and_an_instance_become_tools(user_tools):
    for name, expected in (("shout", "shout"), ("Echo", "echo"), ("echo", "echo")):
        made = import_tool(f"{user_tools}:{name}")
        assert isinstance(made, Tool) and made.name == expected
    assert import_tool(f"{user_tools}:shout")(text="hi") == "HI"
    options = agent_options({"tools": ["calculator", f"{user_tools}:shout"]})
    tools = make_tools(options, ToolMathTask(train_size=2, heldout_size=1))
    assert [t.name for t in tools] == ["calculator", "shout"]


@pytest.mark.parametrize(
    ("path", "words"),
    [
        ("my_agent_tools:missing", "cannot be imported"),
        ("no_such_module_anywhere:tool", "cannot be imported"),
        ("my_agent_tools:not_a_tool", "not a Tool"),
        ("my_agent_tools:untyped", "not a usable tool"),
    ],
)
def test_a_wrong_tool_path_is_a_config_error_naming_it(user_tools, path, words):
    with pytest.raises(ConfigError) as info:
        agent_options({"tools": [path]})
    assert "problem.agent.tools" in str(info.value) and path in str(info.value)
    assert words in str(info.value)


def test_a_run_offers_the_users_tool_to_the_model(user_tools, tmp_path):
    from esbox.adapters.models.testing import save_tiny_lm

    model = save_tiny_lm(tmp_path / "tiny")
    args = ["optimize", "-q", "--strategy", "openai_es", "--out", str(tmp_path / "run")]
    for key, value in {
        "problem.kind": "llm",
        "problem.model": str(model),
        "problem.batch_size": 2,
        "problem.task": "{kind: tool_math, train_size: 8, heldout_size: 2}",
        "problem.agent": f"{{tools: [calculator, '{user_tools}:Echo'], max_turns: 2, "
        "max_tokens: 16, max_new_tokens: 8}",
        "problem.validation_every": 0,
        "options.population": 2,
        "budget.max_steps": 1,
    }.items():
        args += ["--set", f"{key}={value}"]
    result = CliRunner().invoke(cli, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    record = json.loads((tmp_path / "run" / "trajectories.jsonl").read_text().splitlines()[0])
    assert '"name": "echo"' in record["system"] and '"name": "calculator"' in record["system"]
