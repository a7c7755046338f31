"""The tool-call protocol: parsing model turns, dispatching calls, and the chat-template path."""

from __future__ import annotations

import json
from typing import Any, ClassVar

import pytest
from hypothesis import given
from hypothesis import strategies as st

from esbox.adapters.agents.protocol import (
    ANSWER_RULE,
    ToolMessage,
    execute,
    parse_turn,
    render,
    render_results,
    supports_tool_role,
    supports_tools,
    system_prompt,
    toolbox,
    validate_arguments,
)
from esbox.adapters.agents.tools import Calculator, Tool, ToolError, tool


@tool
def echo(text: str, times: int = 1) -> str:
    """Repeat a text."""
    return text * times


@tool
def scale(x: float, unit: str = "m") -> str:
    """Scale a length."""
    return f"{2 * x}{unit}"


class Broken(Tool):
    name = "broken"
    description = "Always fails."
    parameters: ClassVar[dict[str, Any]] = {"type": "object", "properties": {}}

    def __call__(self) -> str:
        raise RuntimeError("disk on fire")


class Refuses(Tool):
    name = "refuses"
    description = "Fails politely."
    parameters: ClassVar[dict[str, Any]] = {"type": "object", "properties": {}}

    def __call__(self) -> str:
        raise ToolError("nothing to see")


TOOLS = [Calculator(), echo, scale, Broken(), Refuses()]


def call(name: str, arguments: object) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def test_a_valid_call_with_text_before_it() -> None:
    turn = parse_turn("I will compute.\n" + call("calculator", {"expression": "37*412"}), TOOLS)
    assert turn.content == "I will compute."
    assert [(c.name, c.arguments, c.valid) for c in turn.calls] == [
        ("calculator", {"expression": "37*412"}, True)
    ]
    assert turn.errors == [] and turn.final is None
    assert (turn.n_valid, turn.n_invalid) == (1, 0)
    assert execute(turn, TOOLS) == [ToolMessage("calculator", "15244", False)]


def test_a_turn_without_a_call_is_final() -> None:
    assert parse_turn("  It is 42.  ", TOOLS).final == "It is 42."
    turn = parse_turn("Thinking done. <answer> 42 </answer>", TOOLS)
    assert (turn.final, turn.content, turn.errors) == ("42", "Thinking done.", [])
    assert parse_turn("", TOOLS).final == ""
    assert execute(parse_turn("42", TOOLS), TOOLS) == []


def test_several_answers_the_last_counts() -> None:
    turn = parse_turn("<answer>1</answer> no, <answer>2</answer>", TOOLS)
    assert turn.final == "2"
    assert turn.errors == ["2 answers in one turn: the last one counts"]


def test_an_unclosed_answer_still_counts() -> None:
    turn = parse_turn("<answer>12", TOOLS)
    assert turn.final == "12" and turn.errors == ["<answer> is never closed"]


def test_a_call_and_an_answer_in_one_turn_the_call_runs() -> None:
    turn = parse_turn(call("echo", {"text": "a"}) + "<answer>guess</answer>", TOOLS)
    assert turn.final is None and turn.n_valid == 1
    assert "answer after the results" in turn.errors[0]


def test_several_calls_all_run_in_order_up_to_the_limit() -> None:
    text = call("echo", {"text": "a"}) + "and" + call("calculator", {"expression": "2**5"})
    turn = parse_turn(text, TOOLS)
    assert [m.content for m in execute(turn, TOOLS)] == ["a", "32"]
    many = parse_turn(call("echo", {"text": "x"}) * 5, TOOLS, max_calls=3)
    assert len(many.calls) == 3
    assert many.errors == ["2 more tool call(s) not run (at most 3 a turn)"]
    assert many.message()["content"] == call("echo", {"text": "x"}) * 3


def test_text_after_the_last_call_is_dropped_from_the_history() -> None:
    text = "ok " + call("echo", {"text": "a"}) + "<tool_response>invented</tool_response>"
    assert parse_turn(text, TOOLS).message() == {
        "role": "assistant",
        "content": "ok " + call("echo", {"text": "a"}),
    }
    assert parse_turn("final", TOOLS).message() == {"role": "assistant", "content": "final"}


def test_truncated_json_is_reported() -> None:
    turn = parse_turn('<tool_call>{"name": "calculator", "arguments": {"expre', TOOLS)
    assert turn.n_invalid == 1 and turn.final is None
    assert "never closed" in turn.errors[0]
    [message] = execute(turn, TOOLS)
    assert message.error and message.content.startswith("error: <tool_call> is never closed")


def test_complete_json_cut_at_the_stop_string_is_accepted() -> None:
    turn = parse_turn('<tool_call>{"name": "echo", "arguments": {"text": "hi"}}\n', TOOLS)
    assert turn.n_valid == 1 and turn.errors == []


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("<tool_call>{name: echo}</tool_call>", "not valid JSON"),
        ("<tool_call></tool_call>", "empty <tool_call>"),
        ("<tool_call>[1, 2]</tool_call>", "is a JSON object"),
        ('<tool_call>{"arguments": {}}</tool_call>', 'has no "name"'),
        ('<tool_call>{"name": "echo", "arguments": {"text": "a"}}}</tool_call>', "unexpected text"),
        ('<tool_call>{"name": "echo", "arguments": "{bad"}</tool_call>', "not valid JSON"),
        ('<tool_call>{"name": "ech", "arguments": {}}</tool_call>', "did you mean 'echo'"),
        ('<tool_call>{"name": "echo", "arguments": []}</tool_call>', "must be a JSON object"),
        ('<tool_call>{"name": "echo", "arguments": {}}</tool_call>', "missing required"),
        (
            '<tool_call>{"name": "echo", "arguments": {"text": "a", "tims": 2}}</tool_call>',
            "unknown argument 'tims'; did you mean 'times'",
        ),
        ('<tool_call>{"name": "echo", "arguments": {"text": 5}}</tool_call>', "must be a string"),
        (
            '<tool_call>{"name": "echo", "arguments": {"text": "a", "times": true}}</tool_call>',
            "must be an integer, not a boolean",
        ),
        (
            '<tool_call>{"name": "echo", "arguments": {"text": "a", "times": 1.5}}</tool_call>',
            "must be an integer, not a number",
        ),
        ('<tool_call>{"name": "scale", "arguments": {"x": 1e400}}</tool_call>', "non-finite"),
        ('<tool_call>{"name": "scale", "arguments": {"x": NaN}}</tool_call>', "non-finite"),
        (
            '<tool_call>{"name": "scale", "arguments": {"x": 1' + "0" * 5000 + "}}</tool_call>",
            "not valid JSON",
        ),
        ("<tool_call>" + "[" * 100_000 + "</tool_call>", "not valid JSON"),
    ],
)
def test_malformed_calls_become_error_messages(text: str, message: str) -> None:
    turn = parse_turn(text, TOOLS)
    assert turn.n_invalid == 1 and turn.n_valid == 0 and turn.final is None
    assert message in turn.errors[0]
    [result] = execute(turn, TOOLS)
    assert result.error and message in result.content and result.content.startswith("error: ")


def test_a_bad_call_does_not_hide_the_next_one() -> None:
    turn = parse_turn("<tool_call>{oops}</tool_call>" + call("echo", {"text": "b"}), TOOLS)
    assert [m.error for m in execute(turn, TOOLS)] == [True, False]


def test_closing_tags_and_braces_inside_json_strings() -> None:
    code = 'print("</tool_call>"); d = {"a": {"b": "}"}}'
    turn = parse_turn(call("echo", {"text": code}) + " tail", TOOLS)
    assert turn.errors == [] and turn.calls[0].arguments == {"text": code}
    assert execute(turn, TOOLS)[0].content == code


def test_unicode_and_huge_numbers() -> None:
    text = '<tool_call>{"name": "echo", "arguments": {"text": "héllo → 世界 🎲"}}</tool_call>'
    assert execute(parse_turn(text, TOOLS), TOOLS)[0].content == "héllo → 世界 🎲"
    huge = f'<tool_call>{{"name": "scale", "arguments": {{"x": {10**400}}}}}</tool_call>'
    turn = parse_turn(huge, TOOLS)
    assert turn.calls[0].arguments == {"x": 10**400} and turn.n_valid == 1
    assert execute(turn, TOOLS)[0].content == f"{2 * 10**400}m"


def test_arguments_as_a_json_string_are_accepted() -> None:
    text = '<tool_call>{"name": "echo", "arguments": "{\\"text\\": \\"z\\"}"}</tool_call>'
    assert parse_turn(text, TOOLS).calls[0].arguments == {"text": "z"}


def test_tool_failures_become_error_messages() -> None:
    turn = parse_turn(
        call("broken", {}) + call("refuses", {}) + call("calculator", {"expression": "1/0"}), TOOLS
    )
    messages = execute(turn, TOOLS)
    assert [m.content for m in messages] == [
        "error: broken failed (RuntimeError: disk on fire)",
        "error: nothing to see",
        "error: division by zero",
    ]
    assert all(m.error for m in messages) and turn.n_valid == 3
    assert messages[0].message() == {
        "role": "tool",
        "name": "broken",
        "content": messages[0].content,
    }


def test_long_results_are_cut() -> None:
    [message] = execute(parse_turn(call("echo", {"text": "ab", "times": 100}), TOOLS), TOOLS, 50)
    assert message.content == "ab" * 25 + "\n... [150 characters cut]"


FRAGMENTS = st.sampled_from(
    ["<tool_call>", "</tool_call>", "<answer>", "</answer>", "{", "}", "[", '"', ":", ",",
     '"name"', '"arguments"', '"echo"', '"calculator"', '"text"', "1e999", "-", "\\", " ", "\n"]
)  # fmt: skip


@given(st.lists(st.one_of(FRAGMENTS, st.text(max_size=5)), max_size=40).map("".join))
def test_parser_and_dispatcher_never_raise(text: str) -> None:
    turn = parse_turn(text, TOOLS)
    messages = execute(turn, TOOLS)
    assert len(messages) == len(turn.calls)
    assert (turn.final is None) == bool(turn.calls)
    assert all(m.error for c, m in zip(turn.calls, messages, strict=True) if not c.valid)
    assert len(turn.errors) >= turn.n_invalid


def test_validate_arguments_schema_subset() -> None:
    schema = {
        "type": "object",
        "properties": {
            "mode": {"type": "string", "enum": ["a", "b"]},
            "n": {"type": ["integer", "null"]},
        },
        "required": ["mode"],
        "additionalProperties": True,
    }
    assert validate_arguments({"mode": "a", "n": None, "extra": 1}, schema) == []
    assert validate_arguments({"mode": "c", "n": "x"}, schema) == [
        "argument 'mode' must be one of ['a', 'b']",
        "argument 'n' must be an integer or null, not a string",
    ]


def test_toolbox_rejects_duplicate_names() -> None:
    with pytest.raises(ValueError, match="two tools are named 'echo'"):
        toolbox([echo, echo])


def test_system_prompt_lists_every_schema_and_the_rules() -> None:
    prompt = system_prompt(TOOLS, instructions="Solve the problem.")
    assert prompt.startswith("Solve the problem.\n\n# Tools")
    block = prompt.split("<tools>\n")[1].split("\n</tools>")[0]
    assert [json.loads(line) for line in block.splitlines()] == [t.schema() for t in TOOLS]
    assert "<tool_call>" in prompt and prompt.endswith(ANSWER_RULE)


# Chat templates: a tiny word-level tokenizer built here, no hub.
TOOL_TEMPLATE = (
    "{% if tools %}<|im_start|>system\n{{ messages[0]['content'] if messages[0]['role'] == "
    "'system' else '' }}\n<tools>{% for t in tools %}\n{{ t | tojson }}{% endfor %}\n</tools>"
    "<|im_end|>\n{% endif %}"
    "{% for m in messages %}{% if m['role'] == 'tool' %}<|im_start|>user\n<tool_response>\n"
    "{{ m['content'] }}\n</tool_response><|im_end|>\n"
    "{% elif not (tools and m['role'] == 'system') %}<|im_start|>{{ m['role'] }}\n"
    "{{ m['content'] }}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
PLAIN_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
STRICT_TEMPLATE = (
    "{% for m in messages %}{% if m['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('unknown role ' + m['role']) }}{% endif %}"
    "[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}[assistant] {% endif %}"
)


def tiny_tokenizer(template: str | None) -> object:
    transformers = pytest.importorskip("transformers")
    from tokenizers import Tokenizer, models, pre_tokenizers

    backend = Tokenizer(models.WordLevel({"<unk>": 0, "hi": 1}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>")
    tokenizer.chat_template = template
    return tokenizer


HISTORY = [
    {"role": "system", "content": "Be exact."},
    {"role": "user", "content": "What is 37*412?"},
    {"role": "assistant", "content": call("calculator", {"expression": "37*412"})},
    {"role": "tool", "name": "calculator", "content": "15244"},
    {"role": "tool", "name": "echo", "content": "again"},
]


def test_probes_tell_the_templates_apart() -> None:
    native, plain, strict = (
        tiny_tokenizer(t) for t in (TOOL_TEMPLATE, PLAIN_TEMPLATE, STRICT_TEMPLATE)
    )
    assert supports_tools(native) and supports_tool_role(native)
    assert not supports_tools(plain) and supports_tool_role(plain)
    assert not supports_tools(strict) and not supports_tool_role(strict)
    assert not supports_tools(tiny_tokenizer(None)) and not supports_tools(object())


def test_render_uses_the_templates_own_tool_format() -> None:
    prompt = render(tiny_tokenizer(TOOL_TEMPLATE), HISTORY, TOOLS)
    assert prompt.startswith(f"<|im_start|>system\nBe exact.\n\n{ANSWER_RULE}\n<tools>")
    assert json.dumps(Calculator().schema()) in prompt
    assert "<tool_response>\n15244\n</tool_response>" in prompt
    assert prompt.endswith("<|im_start|>assistant\n")


def test_render_falls_back_to_our_prompt_and_a_tool_message() -> None:
    prompt = render(tiny_tokenizer(PLAIN_TEMPLATE), HISTORY, TOOLS)
    assert prompt.startswith("<|im_start|>system\n" + system_prompt(TOOLS, "Be exact."))
    results = render_results([ToolMessage("calculator", "15244", False), HISTORY[4]])
    assert (
        results
        == "<tool_response>\n15244\n</tool_response>\n<tool_response>\nagain\n</tool_response>"
    )
    assert f"<|im_start|>tool\n{results}<|im_end|>\n<|im_start|>assistant\n" in prompt


def test_render_falls_back_to_a_user_message_without_a_tool_role() -> None:
    prompt = render(tiny_tokenizer(STRICT_TEMPLATE), HISTORY[1:], TOOLS)
    assert prompt.startswith("[system] " + system_prompt(TOOLS))
    assert prompt.endswith("[user] " + render_results(HISTORY[3:]) + "\n[assistant] ")
    forced = render(tiny_tokenizer(TOOL_TEMPLATE), HISTORY, TOOLS, native=False)
    assert system_prompt(TOOLS, "Be exact.") in forced
