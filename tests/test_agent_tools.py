"""The agent tools: the safe calculator, BM25 search, the python tool and ``@tool``."""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path
from typing import Any, ClassVar

import pytest
from hypothesis import given
from hypothesis import strategies as st

from esbox.adapters.agents.calculator import MAX_DIGITS, calculate, evaluate
from esbox.adapters.agents.retrieval import BM25Index, Corpus, Passage
from esbox.adapters.agents.tools import (
    Calculator,
    FunctionTool,
    PythonTool,
    Search,
    Tool,
    ToolError,
    tool,
)


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("37 * 412", "15244"),
        ("9876 * 5432", "53646432"),
        ("0.1 + 0.2", "0.3"),
        ("1 / 3", "0.333333333333333"),
        ("10 / 4", "2.5"),
        ("6 / 3", "2"),
        ("7 // 2", "3"),
        ("-7 % 3", "2"),
        ("2 ** 10", "1024"),
        ("2 ** -2", "0.25"),
        ("2 ** (7 // 2)", "8"),
        ("-(3 - 5) * +2", "4"),
        ("sqrt(16)", "4"),
        ("sqrt(2)", "1.4142135623731"),
        ("abs(-3.5) + round(2.567, 2)", "6.07"),
        ("min(4, 2, 9) + max(1, 5)", "7"),
        ("floor(2.7) + ceil(2.1)", "5"),
        ("log(8, 2)", "3"),
        ("round(pi, 4)", "3.1416"),
        ("1.5e20", "150000000000000000000"),
        ("1e-9", "1e-9"),
        ("2 ** 0.5 * 2 ** 0.5", "2"),
        ("10 ** 999", "1" + "0" * 999),
    ],
)
def test_calculator_values(expression: str, expected: str) -> None:
    assert calculate(expression) == expected
    assert Calculator()(expression=expression) == expected


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("1 / 0", "division by zero"),
        ("5 % 0", "division by zero"),
        ("0 ** -1", "division by zero"),
        ("__import__('os').system('ls')", "only these functions"),
        ("(1).real", "Attribute not allowed"),
        ("x + 1", "unknown name 'x'"),
        ("open('f')", "only these functions"),
        ("sqrt(x=4)", "positional arguments only"),
        ("'a' * 3", "only numbers"),
        ("True + 1", "only numbers"),
        ("1j * 2", "only numbers"),
        ("[1, 2]", "List not allowed"),
        ("lambda: 1", "Lambda not allowed"),
        ("1 < 2", "Compare not allowed"),
        ("2 ^ 3", "use ** for powers"),
        ("1 << 5", "LShift"),
        ("(-8) ** (1/3)", "not a real number"),
        ("sqrt(-1)", "cannot evaluate"),
        ("exp(1000)", "too large"),
        ("1e400", "too large"),
        ("10 ** 1000", "too large"),
        ("round(2.5, 0.5)", "must be an integer"),
        ("1 +", "not an arithmetic expression"),
        ("", "empty"),
        ("1" * 2000, "too long"),
        ("-" * 100 + "1", "nested too deeply"),
        ("(" * 300 + "1" + ")" * 300, "not an arithmetic expression"),
    ],
)
def test_calculator_rejects_with_a_clear_error(expression: str, message: str) -> None:
    with pytest.raises(ToolError, match=message.replace("(", r"\(").replace("*", r"\*")):
        evaluate(expression)


@pytest.mark.parametrize(
    "expression", ["9**9**9", "9**9**9**9", "2**10**10", "(10**500)**3", "(1/3)**5000", "7**4000"]
)
def test_huge_powers_are_rejected_before_they_are_computed(expression: str) -> None:
    start = time.perf_counter()
    with pytest.raises(ToolError, match="too large"):
        evaluate(expression)
    assert time.perf_counter() - start < 0.1


def test_products_of_large_results_stay_bounded() -> None:
    with pytest.raises(ToolError, match=f"more than {MAX_DIGITS} digits"):
        evaluate("10**600 * 10**600")
    assert calculate("1 ** (10 ** 100)") == "1"  # a trivial base is never too large


@given(st.text(alphabet="0123456789.+-*/%()e ,sqrtabminx^_'", max_size=60))
def test_calculator_raises_only_tool_errors(expression: str) -> None:
    with contextlib.suppress(ToolError):
        calculate(expression)


@given(st.text(max_size=80))
def test_calculator_raises_only_tool_errors_on_any_text(expression: str) -> None:
    with contextlib.suppress(ToolError):
        calculate(expression)


CORPUS = [
    Passage("p1", "Paris", "Paris is the capital and largest city of France."),
    Passage("p2", "Berlin", "Berlin is the capital of Germany, on the river Spree."),
    Passage("p3", "Lyon", "Lyon is a city in France, known for its cuisine."),
    Passage("p4", "Seven hills", "Rome was built on 7 hills."),
    Passage("p5", "Twin", "Identical text about tides."),
    Passage("p6", "Twin", "Identical text about tides."),
]


def test_bm25_ranks_the_best_passage_first() -> None:
    index = BM25Index(CORPUS)
    hits = index.search("capital of France", k=3)
    assert [h.passage.id for h in hits] == ["p1", "p2", "p3"]  # both words, then one each
    assert hits[0].score > hits[1].score > hits[2].score > 0
    assert index.search("Spree", k=3)[0].passage.id == "p2"
    assert index.search("7 hills", k=1)[0].passage.id == "p4"  # one-character words count


def test_bm25_ties_come_back_in_corpus_order_and_misses_are_empty() -> None:
    index = BM25Index(CORPUS)
    assert [h.passage.id for h in index.search("tides", k=5)] == ["p5", "p6"]
    assert index.search("the of and", k=3) == []  # stop words only
    assert index.search("zeppelin", k=3) == []
    assert index.search("", k=3) == []


def test_bm25_takes_an_optional_stemmer() -> None:
    def stem(words: list[str]) -> list[str]:
        return [w[:-1] if w.endswith("s") else w for w in words]

    hits = BM25Index(CORPUS, stemmer=stem).search("hill", k=1)
    assert hits[0].passage.id == "p4"
    assert BM25Index(CORPUS).search("hill", k=1) == []


def test_search_tool_formats_ids_titles_and_clipped_text() -> None:
    search = Search(CORPUS, k=2, max_chars=20)
    text = search(query="capital France")
    assert text == "[p1] Paris\nParis is the capita…\n\n[p2] Berlin\nBerlin is the capit…"
    with pytest.raises(ToolError, match="no passage matches"):
        search(query="zeppelin")


def test_corpus_from_jsonl(tmp_path: Path) -> None:
    path = tmp_path / "corpus.jsonl"
    rows = [{"id": 1, "title": "Ünïcode", "text": "naïve café"}, {"id": "b", "text": "no title"}]
    path.write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in rows) + "\n\n")
    corpus = Corpus.from_jsonl(path)
    assert list(corpus) == [Passage("1", "Ünïcode", "naïve café"), Passage("b", "", "no title")]
    assert Search(path, k=1)(query="café").startswith("[1] Ünïcode")
    path.write_text('{"title": "no id"}\n')
    with pytest.raises(ValueError, match=r"corpus.jsonl:1"):
        Corpus.from_jsonl(path)


def test_corpus_rejects_duplicates_and_emptiness() -> None:
    with pytest.raises(ValueError, match="duplicate passage id 'a'"):
        Corpus([Passage("a", "", "x"), Passage("a", "", "y")])
    with pytest.raises(ValueError, match="at least one"):
        Corpus([])


def test_tool_decorator_builds_the_schema_from_hints_and_docstring() -> None:
    @tool
    def lookup(word: str, limit: int = 3, exact: bool = False) -> str:
        """Look a word up in the glossary.

        Longer text is not part of the description.
        """
        return f"{word}:{limit}:{exact}"

    assert isinstance(lookup, FunctionTool)
    assert lookup.schema() == {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Look a word up in the glossary.",
            "parameters": {
                "type": "object",
                "properties": {
                    "word": {"type": "string"},
                    "limit": {"type": "integer"},
                    "exact": {"type": "boolean"},
                },
                "required": ["word"],
            },
        },
    }
    assert lookup(word="ES") == "ES:3:False"

    @tool(name="add", description="Add numbers.")
    def plus(xs: list[float]) -> float:
        return sum(xs)

    assert plus.name == "add" and plus.parameters["properties"] == {"xs": {"type": "array"}}
    assert plus(xs=[1, 2.5]) == "3.5"


def test_tool_decorator_rejects_what_has_no_schema() -> None:
    def undocumented(x: int) -> int:
        return x

    def untyped(x):  # type: ignore[no-untyped-def]
        """Untyped."""

    def star(*xs: int) -> int:
        """Variadic."""
        return 0

    with pytest.raises(ValueError, match="needs a docstring"):
        tool(undocumented)
    with pytest.raises(ValueError, match="has no JSON type"):
        tool(untyped)
    with pytest.raises(ValueError, match="plain named parameter"):
        tool(star)


def test_a_subclassed_tool_and_the_builtin_schemas() -> None:
    class Echo(Tool):
        name = "echo"
        description = "Repeat the text."
        parameters: ClassVar[dict[str, Any]] = {
            "type": "object",
            "properties": {"text": {"type": "string"}},
        }

        def __call__(self, text: str) -> str:
            return text

    assert Echo()(text="hi") == "hi"
    assert Echo().schema()["function"]["name"] == "echo"
    for builtin in (Calculator(), Search(CORPUS), PythonTool(sandbox=object())):
        function = builtin.schema()["function"]
        assert function["parameters"]["required"] == list(function["parameters"]["properties"])
        assert function["description"]


def test_python_tool_shows_what_the_program_printed() -> None:
    assert PythonTool()(code="print(6 * 7)") == "42"


def test_a_failing_program_is_a_tool_error_carrying_its_traceback() -> None:
    with pytest.raises(ToolError, match="ZeroDivisionError"):
        PythonTool()(code="1 / 0")
