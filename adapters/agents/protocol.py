"""The tool-call protocol: the prompt that teaches it, the parser of a model turn, the dispatcher.

The model calls a tool by writing ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``
(the Hermes/Qwen format) and reads ``<tool_response>...</tool_response>``. A turn without a tool
call is final; its answer is the last ``<answer>...</answer>`` or, without one, the whole turn.
Every call of a turn runs, in order (at most ``max_calls``). Nothing the model writes makes the
parser or the dispatcher raise: problems become error messages the model reads.
"""

from __future__ import annotations

import itertools
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from esbox.adapters.agents.tools import Tool, ToolError
from esbox.errors import unknown_key_message

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"
RESPONSE_OPEN, RESPONSE_CLOSE = "<tool_response>", "</tool_response>"
ANSWER_RULE = (
    "Tool results come back inside <tool_response></tool_response> tags. When you know the "
    "answer, reply without a tool call and put the final answer inside <answer></answer> tags."
)
MAX_CALLS = 8  # calls run in one turn; more are reported, not run
MAX_RESULT_CHARS = 4000  # of one tool result the model reads

Tools = Sequence[Tool] | Mapping[str, Tool]
_DECODER = json.JSONDecoder()
_SPACE = re.compile(r"\s*")
_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "array": (list,),
    "object": (dict,),
    "null": (type(None),),
}
_TYPE_NAMES = {
    "string": "a string",
    "integer": "an integer",
    "number": "a number",
    "boolean": "a boolean",
    "array": "an array",
    "object": "an object",
    "null": "null",
}


@dataclass(frozen=True)
class ToolCall:
    """One ``<tool_call>`` block; ``error`` says why it cannot run (None when it can)."""

    name: str
    arguments: dict[str, Any]
    error: str | None = None

    @property
    def valid(self) -> bool:
        return self.error is None


@dataclass
class Turn:
    """A parsed model turn: its calls in order, every problem found, and the final answer."""

    text: str  # the turn as generated
    content: str  # the text before the first <tool_call> or <answer>, stripped
    calls: list[ToolCall] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # malformed calls and protocol slips
    final: str | None = None  # the answer when the turn makes no call, else None
    end: int = 0  # where the turn's useful text ends: after its last call, or len(text)

    @property
    def n_valid(self) -> int:
        return sum(call.valid for call in self.calls)

    @property
    def n_invalid(self) -> int:
        return len(self.calls) - self.n_valid

    def message(self) -> dict[str, str]:
        """The assistant message for the history: the text up to its last call (what the model
        wrote after it, often an invented tool response, is dropped)."""
        return {"role": "assistant", "content": self.text[: self.end]}


@dataclass(frozen=True)
class ToolMessage:
    """What the model reads back for one call: the tool's result or the error text."""

    name: str
    content: str
    error: bool

    def message(self) -> dict[str, str]:
        return {"role": "tool", "name": self.name, "content": self.content}


def toolbox(tools: Tools) -> dict[str, Tool]:
    """Tools by name; two tools with the same name are a mistake."""
    if isinstance(tools, Mapping):
        return dict(tools)
    by_name: dict[str, Tool] = {}
    for item in tools:
        if item.name in by_name:
            raise ValueError(f"two tools are named {item.name!r}")
        by_name[item.name] = item
    return by_name


def system_prompt(tools: Tools, instructions: str = "") -> str:
    """Instructions, the tools' JSON schemas in a Hermes ``<tools>`` block and the format rules."""
    schemas = "\n".join(json.dumps(t.schema(), ensure_ascii=False) for t in toolbox(tools).values())
    parts = [instructions.strip()] if instructions.strip() else []
    parts.append(
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n"
        f"<tools>\n{schemas}\n</tools>\n\n"
        "For each function call, return a json object with function name and arguments within "
        "<tool_call></tool_call> XML tags:\n<tool_call>\n"
        '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>\n\n' + ANSWER_RULE
    )
    return "\n\n".join(parts)


def validate_arguments(arguments: Any, parameters: Mapping[str, Any]) -> list[str]:
    """What is wrong with ``arguments`` for a JSON schema: required keys, unknown keys, types and
    enums (the subset of JSON schema that tool signatures use)."""
    if not isinstance(arguments, dict):
        return [f"arguments must be a JSON object, not {_json_type(arguments)}"]
    properties = parameters.get("properties", {})
    problems = [
        f"missing required argument {key!r}"
        for key in parameters.get("required", [])
        if key not in arguments
    ]
    for key, value in arguments.items():
        spec = properties.get(key)
        if spec is None:
            if parameters.get("additionalProperties", False) is False:
                problems.append(unknown_key_message("argument", key, properties))
            continue
        wanted = spec.get("type")
        if wanted is not None and not _has_type(value, wanted):
            problems.append(f"argument {key!r} must be {_or(wanted)}, not {_json_type(value)}")
        elif "enum" in spec and value not in spec["enum"]:
            problems.append(f"argument {key!r} must be one of {spec['enum']}")
    return problems


def _has_type(value: Any, wanted: str | list[str]) -> bool:
    if isinstance(value, float) and not math.isfinite(value):
        return False
    for name in [wanted] if isinstance(wanted, str) else wanted:
        types = _JSON_TYPES.get(name, ())
        if isinstance(value, types) and (bool in types or not isinstance(value, bool)):
            return True
    return False


def _or(wanted: str | list[str]) -> str:
    names = [wanted] if isinstance(wanted, str) else wanted
    return " or ".join(_TYPE_NAMES.get(name, name) for name in names)


def _json_type(value: Any) -> str:
    if isinstance(value, float) and not math.isfinite(value):
        return "a non-finite number"
    name = next((n for n in _JSON_TYPES if _has_type(value, n)), None)
    return _TYPE_NAMES[name] if name else type(value).__name__


def parse_turn(text: str, tools: Tools, max_calls: int = MAX_CALLS) -> Turn:
    """Split a model turn into its tool calls (each validated) or its final answer; never raises."""
    by_name = toolbox(tools)
    calls: list[ToolCall] = []
    errors: list[str] = []
    outside: list[str] = []  # the text outside the call blocks, where an <answer> may be
    position, end, skipped = 0, len(text), 0
    while (start := text.find(CALL_OPEN, position)) >= 0:
        outside.append(text[position:start])
        call, position = _read_call(text, start + len(CALL_OPEN), by_name)
        if len(calls) == max_calls:
            skipped += 1
            continue
        calls.append(call)
        end = position
        if call.error:
            errors.append(call.error)
    outside.append(text[position:])
    if skipped:
        errors.append(f"{skipped} more tool call(s) not run (at most {max_calls} a turn)")
    answers, unclosed = _answers("".join(outside))
    if unclosed:
        errors.append(f"{ANSWER_OPEN} is never closed")
    first = min((i for i in (text.find(CALL_OPEN), text.find(ANSWER_OPEN)) if i >= 0), default=-1)
    content = (text if first < 0 else text[:first]).strip()
    final = None
    if calls and answers:
        errors.append("an answer in a turn with a tool call is ignored: answer after the results")
    elif not calls:
        if len(answers) > 1:
            errors.append(f"{len(answers)} answers in one turn: the last one counts")
        final = answers[-1] if answers else text.strip()
    return Turn(text, content, calls, errors, final, end if calls else len(text))


def _read_call(text: str, start: int, tools: Mapping[str, Tool]) -> tuple[ToolCall, int]:
    """The call whose JSON starts at ``start`` and the position after its ``</tool_call>``."""
    begin = _SPACE.match(text, start).end()
    close = text.find(CALL_CLOSE, begin)
    after = len(text) if close < 0 else close + len(CALL_CLOSE)
    if close == begin:
        return ToolCall("", {}, "empty <tool_call>"), after
    try:
        value, stop = _DECODER.raw_decode(text, begin)
    except (ValueError, RecursionError) as exc:
        if close < 0:
            reason = "<tool_call> is never closed and its JSON is incomplete (out of tokens?)"
            return ToolCall("", {}, reason), after
        reason = getattr(exc, "msg", None) or str(exc)[:200]
        return ToolCall("", {}, f"the tool call is not valid JSON ({reason})"), after
    stop = _SPACE.match(text, stop).end()
    if text.startswith(CALL_CLOSE, stop):
        after = stop + len(CALL_CLOSE)
    elif stop < len(text):  # complete JSON then nothing at all is a call cut at its stop string
        close = text.find(CALL_CLOSE, stop)
        after = len(text) if close < 0 else close + len(CALL_CLOSE)
        junk = text[stop : stop + 40]
        return ToolCall("", {}, f"unexpected text after the tool call's JSON: {junk!r}"), after
    return _call_from(value, tools), max(after, stop)


def _call_from(value: Any, tools: Mapping[str, Tool]) -> ToolCall:
    if not isinstance(value, dict):
        return ToolCall("", {}, 'a tool call is a JSON object {"name": ..., "arguments": {...}}')
    name = value.get("name")
    if not isinstance(name, str) or not name:
        return ToolCall("", {}, 'the tool call has no "name"')
    arguments = value.get("arguments", {})
    if isinstance(arguments, str):  # the OpenAI wire form: arguments as a JSON string
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except (ValueError, RecursionError):
            return ToolCall(name, {}, f"{name}: arguments are not valid JSON")
    if name not in tools:
        return ToolCall(name, {}, unknown_key_message("tool", name, tools))
    problems = validate_arguments(arguments, tools[name].parameters)
    if problems:
        return ToolCall(
            name, arguments if isinstance(arguments, dict) else {}, f"{name}: {'; '.join(problems)}"
        )
    return ToolCall(name, arguments)


def _answers(text: str) -> tuple[list[str], bool]:
    """The stripped contents of the ``<answer>`` blocks, and whether the last one is unclosed."""
    answers: list[str] = []
    position = 0
    while (start := text.find(ANSWER_OPEN, position)) >= 0:
        close = text.find(ANSWER_CLOSE, start)
        if close < 0:
            answers.append(text[start + len(ANSWER_OPEN) :].strip())
            return answers, True
        answers.append(text[start + len(ANSWER_OPEN) : close].strip())
        position = close + len(ANSWER_CLOSE)
    return answers, False


def execute(turn: Turn, tools: Tools, max_chars: int = MAX_RESULT_CHARS) -> list[ToolMessage]:
    """Run a turn's calls in order: one message each, the result or ``error: ...``; a tool that
    raises never stops the rollout."""
    by_name = toolbox(tools)
    messages = []
    for call in turn.calls:
        if call.error is not None:
            messages.append(ToolMessage(call.name, f"error: {call.error}", True))
            continue
        try:
            result, failed = by_name[call.name](**call.arguments), False
        except ToolError as exc:
            result, failed = f"error: {exc}", True
        except (Exception, SystemExit) as exc:  # a broken tool must not end the rollout
            result, failed = f"error: {call.name} failed ({type(exc).__name__}: {exc})", True
        result = result if isinstance(result, str) else str(result)
        if len(result) > max_chars:
            result = result[:max_chars] + f"\n... [{len(result) - max_chars} characters cut]"
        messages.append(ToolMessage(call.name, result, failed))
    return messages


def render_results(messages: Sequence[ToolMessage | Mapping[str, Any]]) -> str:
    """Tool results as ``<tool_response>`` blocks, one per call, for templates without tools."""
    texts = [m.content if isinstance(m, ToolMessage) else str(m["content"]) for m in messages]
    return "\n".join(f"{RESPONSE_OPEN}\n{text}\n{RESPONSE_CLOSE}" for text in texts)


_PROBE = "esbox_probe_tool"


def supports_tools(tokenizer: Any) -> bool:
    """Whether the tokenizer's chat template renders a ``tools=`` list (its own tool format)."""
    schema = {
        "type": "function",
        "function": {
            "name": _PROBE,
            "description": "probe",
            "parameters": {"type": "object", "properties": {}},
        },
    }
    rendered = _try_render(tokenizer, [{"role": "user", "content": "hi"}], tools=[schema])
    return rendered is not None and _PROBE in rendered


def supports_tool_role(tokenizer: Any) -> bool:
    """Whether the chat template renders a message of role ``tool``."""
    marker = "esbox_probe_result"
    messages = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "ok"},
        {"role": "tool", "name": _PROBE, "content": marker},
    ]
    rendered = _try_render(tokenizer, messages)
    return rendered is not None and marker in rendered


def _try_render(tokenizer: Any, messages: list[dict[str, Any]], **kwargs: Any) -> str | None:
    if not getattr(tokenizer, "chat_template", None):
        return None
    try:
        return tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True, **kwargs
        )
    except Exception:  # a template may raise on a role or argument it does not know
        return None


def system_text(messages: Sequence[Mapping[str, Any]], tools: Tools, native: bool) -> str:
    """The system message the model reads: the conversation's own system turn with the answer
    rule (``native``: the template adds the tools) or with our text protocol's tool prompt."""
    system = messages[0]["content"] if messages and messages[0]["role"] == "system" else ""
    if not toolbox(tools):  # an environment read from the replies, no tools: no tool protocol
        return system
    return f"{system}\n\n{ANSWER_RULE}".strip() if native else system_prompt(tools, system)


def render(
    tokenizer: Any,
    messages: Sequence[Mapping[str, Any]],
    tools: Tools,
    native: bool | None = None,
    tool_role: bool | None = None,
) -> str:
    """The prompt for the next assistant turn. With ``native`` (probed when None) the template's
    own tool format; else our system prompt and ``<tool_response>`` blocks in a ``tool`` message
    (a ``user`` one when the template has no tool role). ``native`` and ``tool_role`` are
    probed when None: a loop probes once and passes them."""
    by_name = toolbox(tools)
    if native is None:
        native = supports_tools(tokenizer)
    system = system_text(messages, by_name, native)
    head = [{"role": "system", "content": system}] if system else []
    messages = [dict(m) for m in messages if m["role"] != "system"]
    if native:
        return tokenizer.apply_chat_template(
            head + messages,
            tools=[t.schema() for t in by_name.values()],
            tokenize=False,
            add_generation_prompt=True,
        )
    if tool_role is None:
        tool_role = supports_tool_role(tokenizer)
    role = "tool" if tool_role else "user"
    out = head
    for is_result, group in itertools.groupby(messages, key=lambda m: m["role"] == "tool"):
        if is_result:
            out.append({"role": role, "content": render_results(list(group))})
        else:
            out.extend(group)
    return tokenizer.apply_chat_template(out, tokenize=False, add_generation_prompt=True)
