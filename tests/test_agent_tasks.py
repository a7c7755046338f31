"""The agent tasks: tool_math's generator and answer checking, the synthetic 2-hop knowledge base,
multihop_qa from HotpotQA-style files, and EM/F1 as HotpotQA's evaluation computes them."""

from __future__ import annotations

import json
import re
import time
from fractions import Fraction
from pathlib import Path

import pytest

from esbox.adapters.tasks import MultiHopQATask, ToolMathTask
from esbox.adapters.tasks.base import Example
from esbox.adapters.tasks.loading import load_task
from esbox.adapters.tasks.multihop import hotpot_em, hotpot_f1, row_documents, row_supporting
from esbox.adapters.tasks.synthetic_kb import synthetic_kb
from esbox.adapters.tasks.tool_math import FAMILIES, problem_key


def question(example: Example) -> str:
    return example.prompt[-1]["content"]


# -- tool_math: the generator ------------------------------------------------------------------
def test_tool_math_is_seeded_and_reproducible():
    a = ToolMathTask(train_size=50, heldout_size=10)
    b = ToolMathTask(train_size=50, heldout_size=10)
    assert [(question(e), e.answer, e.meta) for e in a.train + a.heldout] == [
        (question(e), e.answer, e.meta) for e in b.train + b.heldout
    ]
    other = ToolMathTask(train_size=50, heldout_size=10, seed=1)
    assert [question(e) for e in other.heldout] != [question(e) for e in a.heldout]
    bigger = ToolMathTask(train_size=500, heldout_size=10)  # held-out is drawn first
    assert [question(e) for e in bigger.heldout] == [question(e) for e in a.heldout]


def test_tool_math_splits_are_disjoint_problems_not_only_distinct_questions():
    task = ToolMathTask(train_size=2000, heldout_size=200)
    assert (len(task.train), len(task.heldout)) == (2000, 200)
    keys = [problem_key(e.meta["family"], e.meta) for e in task.train + task.heldout]
    assert len(set(keys)) == len(keys)  # b x a is the same problem as a x b
    held = {question(e) for e in task.heldout}
    assert not held & {question(e) for e in task.train}
    assert {e.meta["family"] for e in task.train} == set(FAMILIES)
    assert problem_key("product", {"a": 2, "b": 3}) == problem_key("product", {"a": 3, "b": 2})
    assert problem_key("sum", {"terms": [1, 2, 3]}) == problem_key("sum", {"terms": [3, 1, 2]})


def gold_from_meta(meta: dict) -> Fraction:
    """Each family's answer, recomputed exactly from the numbers the question was made of."""
    family = meta["family"]
    if family == "product":
        return Fraction(meta["a"] * meta["b"])
    if family == "sum":
        return Fraction(sum(meta["terms"]))
    if family == "percentage":
        return Fraction(meta["p"] * meta["n"], 100)
    return Fraction(meta["per"] * meta["count"] - meta["sold"])


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_family_s_gold_answer_is_exactly_right(family):
    task = ToolMathTask(families=[family], train_size=1500, heldout_size=100, seed=3)
    for example in task.train + task.heldout:
        meta, text = example.meta, question(example)
        assert meta["family"] == family
        value = gold_from_meta(meta)
        assert value.denominator == 1, f"{text} has no whole-number answer ({value})"
        assert example.answer == str(value.numerator) and value > 0
        numbers = [int(n) for n in re.findall(r"\d+", text)]  # the question shows its numbers
        shown = {k: v for k, v in meta.items() if k != "family"}
        flat = [x for v in shown.values() for x in (v if isinstance(v, list) else [v])]
        assert numbers == flat, text
        assert task.score(example.answer, example) == 1.0


def test_tool_math_options_and_mistakes():
    task = ToolMathTask(
        families=["sum"], train_size=3, heldout_size=1, system="Use a tool.", instruction=" Go!"
    )
    prompt = task.train[0].prompt
    assert prompt[0] == {"role": "system", "content": "Use a tool."}
    assert prompt[1]["content"].endswith("? Go!")
    assert isinstance(ToolMathTask(train_size=2, heldout_size=1, chat=False).train[0].prompt, str)
    with pytest.raises(ValueError, match="families"):
        ToolMathTask(families=["division"])
    with pytest.raises(ValueError, match="families"):
        ToolMathTask(families=[])
    with pytest.raises(ValueError, match="distinct problems"):  # ~3900 percentages exist
        ToolMathTask(families=["percentage"], train_size=5000, heldout_size=0)
    assert load_task({"kind": "tool_math", "train_size": 4, "heldout_size": 2}).name == "tool_math"


# -- tool_math: scoring the final answer -------------------------------------------------------
GOLD = "15244"
SCORED = [
    ("15244", 1.0),
    ("<answer>15244</answer>", 1.0),
    ("I called the tool. <answer> 15244 </answer>", 1.0),
    ("<answer>15,244</answer>", 1.0),
    ("<answer>15 244</answer>", 1.0),
    ("<answer>15244.</answer>", 1.0),
    ("<answer>15244.0</answer>", 1.0),
    ("<answer>$15244$</answer>", 1.0),
    ("<answer>\\boxed{15244}</answer>", 1.0),
    ("<answer>15244", 1.0),  # unclosed: it runs to the end
    ("The answer is 15244.", 1.0),
    ("<answer>15245</answer>", 0.0),
    ("<answer>152440</answer>", 0.0),
    # several answers: the last one counts, as in the agent protocol
    ("<answer>15245</answer> no, <answer>15244</answer>", 1.0),
    ("<answer>15244</answer> no, <answer>15245</answer>", 0.0),
    # no answer at all
    ("", 0.0),
    ("<answer></answer>", 0.0),
    ("I do not know.", 0.0),
    ("<tool_call>{}</tool_call>", 0.0),
    # unicode
    ("<answer>１５２４４</answer>", 1.0),  # full-width digits
    ("<answer>15\u202f244</answer>", 1.0),  # narrow no-break space as thousands separator
    ("<answer>15\u00a0244</answer>", 1.0),  # no-break space
    ("<answer>15244 ✓</answer>", 1.0),
    ("<answer>résultat : 15244</answer>", 1.0),
    ("<answer>一万五千</answer>", 0.0),
    # huge numbers and expressions that would take sympy hours
    ("<answer>" + "1" + "0" * 5000 + "</answer>", 0.0),
    ("<answer>" + "15244" + "0" * 5000 + "</answer>", 0.0),
    ("<answer>1e400</answer>", 0.0),
    ("<answer>9**9**9</answer>", 0.0),
    ("<answer>9^9^9^9</answer>", 0.0),
    ("<answer>2**(2**40)</answer>", 0.0),
    ("<answer>\\boxed{9^{9^{9}}}</answer>", 0.0),
    ("<answer>" + "7" * 200_000 + "</answer>", 0.0),
]


@pytest.mark.parametrize("math_verify", [True, False], ids=["math-verify", "fallback"])
@pytest.mark.parametrize(("completion", "expected"), SCORED, ids=range(len(SCORED)))
def test_tool_math_scores_the_final_answer(completion, expected, math_verify):
    task = ToolMathTask(train_size=2, heldout_size=1)
    if math_verify and not task.use_math_verify:
        pytest.skip("math-verify is not installed")
    task.use_math_verify = math_verify
    example = Example([{"role": "user", "content": "What is 37 times 412?"}], GOLD)
    start = time.perf_counter()
    assert task.score(completion, example) == expected
    assert task.reward(completion, example) == expected
    assert task.is_correct(completion, example) is (expected == 1.0)
    assert time.perf_counter() - start < 5


def test_huge_gold_answers_compare_exactly():
    task = ToolMathTask(train_size=2, heldout_size=1)
    gold = str(10**60 + 1)  # beyond float precision: 10**60 would pass a float comparison
    example = Example("q", gold)
    assert task.score(f"<answer>{gold}</answer>", example) == 1.0
    assert task.score(f"<answer>{10**60}</answer>", example) == 0.0
    assert task.score("<answer>−5</answer>", Example("q", "-5")) == 1.0  # the Unicode minus


# -- the synthetic knowledge base --------------------------------------------------------------
def test_the_knowledge_base_is_seeded():
    assert synthetic_kb(seed=0) == synthetic_kb(seed=0)
    assert synthetic_kb(seed=0)["documents"] != synthetic_kb(seed=1)["documents"]
    small = synthetic_kb(people=10, companies=6, cities=5, universities=3, seed=2)
    assert len(small["documents"]) == 10 + 6 + 3
    assert len(small["records"]) == 2 * 6 + 10
    with pytest.raises(ValueError, match="2 cities"):
        synthetic_kb(cities=1)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_every_question_is_answerable_in_exactly_two_hops(seed):
    kb = synthetic_kb(seed=seed)
    by_title = {d["title"]: d for d in kb["documents"]}
    assert len(by_title) == len(kb["documents"])  # titles are unique, and so are ids
    assert len({d["id"] for d in kb["documents"]}) == len(kb["documents"])
    assert len({r["question"] for r in kb["records"]}) == len(kb["records"])
    for record in kb["records"]:
        entity, bridge = record["supporting"]
        assert entity in record["question"]
        first, second = by_title[entity]["text"], by_title[bridge]["text"]
        assert bridge in first, record  # the first document names the bridge entity
        assert record["answer"] in second, record  # whose document holds the answer
        word = re.compile(rf"\b{re.escape(record['answer'])}\b")
        assert not word.search(first), record  # one hop is not enough
    assert not any(re.search(r"\ba [aeio]", d["text"]) for d in kb["documents"])  # "an engineer"


def test_bm25_search_for_the_question_s_entity_finds_the_first_hop_document():
    pytest.importorskip("bm25s")
    from esbox.adapters.agents.config import AgentOptions, make_tools

    task = MultiHopQATask.synthetic(kb_seed=0)
    (search,) = make_tools(AgentOptions(tools=["search"], search_k=2), task)  # as a run builds it
    title = {d["id"]: d["title"] for d in task.documents}
    kb = synthetic_kb(seed=0)
    for record in kb["records"]:
        entity, bridge = record["supporting"]
        for name in (entity, bridge):
            best = search.index.search(name, k=1)[0].passage
            assert best.title == name == title[best.id]
        assert search(entity).startswith(f"[{next(i for i, t in title.items() if t == entity)}]")


def test_the_synthetic_task_holds_the_base_and_its_questions():
    task = MultiHopQATask.synthetic(kb_seed=0, heldout_size=40, system="Search first.")
    kb = synthetic_kb(seed=0)
    assert task.name == "synthetic_2hop" and len(task.documents) == len(kb["documents"])
    assert [d["id"] for d in task.documents] == [f"d{i}" for i in range(len(task.documents))]
    assert (len(task.train), len(task.heldout)) == (len(kb["records"]) - 40, 40)
    assert not {question(e) for e in task.train} & {question(e) for e in task.heldout}
    example = task.heldout[0]
    assert example.prompt[0] == {"role": "system", "content": "Search first."}
    assert question(example).endswith("? Answer with a few words only.")
    assert example.meta["answers"] == [example.answer] and len(example.meta["supporting"]) == 2
    assert task.score(f"<answer>{example.answer}</answer>", example) == 1.0
    spec = {"kind": "multihop_qa", "kb_seed": 0, "size": {"people": 20, "companies": 10},
            "heldout_size": 5}  # fmt: skip
    assert len(load_task(spec).train) == 2 * 10 + 20 - 5


# -- multihop_qa from HotpotQA-style files -----------------------------------------------------
HOTPOT_CONTEXT = {  # the original HotpotQA layout: sentences keep their leading spaces
    "_id": "a1",
    "question": "Which city is the birthplace of the author of Mirrors?",
    "answer": "Oslo",
    "supporting_facts": [["Mirrors (novel)", 0], ["Kari Lund", 1], ["Kari Lund", 0]],
    "context": [
        ["Mirrors (novel)", ["Mirrors is a 1990 novel by Kari Lund.", " It is set at sea."]],
        ["Kari Lund", ["Kari Lund is a writer.", " She was born in Oslo."]],
    ],
}
HOTPOT_HF = {  # the Hugging Face datasets layout: columns of titles and sentences
    "question": "Is Oslo a capital?",
    "answer": "yes",
    "supporting_facts": {"title": ["Oslo"], "sent_id": [0]},
    "context": {"title": ["Oslo", "Kari Lund"], "sentences": [["Oslo is a capital."], ["Old."]]},
}
DOCUMENTS_ROW = {
    "question": "Who founded Acme?",
    "answer": ["Ann Bell", "Ann B. Bell"],
    "supporting": ["Acme"],
    "documents": [{"title": "Acme", "text": "Acme was founded by Ann Bell."}],
}


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_hotpotqa_rows_in_every_layout_give_documents_and_supporting_titles():
    mirrors, lund = row_documents(HOTPOT_CONTEXT)
    assert mirrors == {"title": "Mirrors (novel)", "text": "Mirrors is a 1990 novel by Kari Lund. "
                       "It is set at sea."}  # fmt: skip
    assert lund == {"title": "Kari Lund", "text": "Kari Lund is a writer. She was born in Oslo."}
    assert row_supporting(HOTPOT_CONTEXT) == ["Mirrors (novel)", "Kari Lund"]
    assert row_documents(HOTPOT_HF)[0] == {"title": "Oslo", "text": "Oslo is a capital."}
    assert row_supporting(HOTPOT_HF) == ["Oslo"]
    assert row_documents(DOCUMENTS_ROW) == DOCUMENTS_ROW["documents"]
    assert row_supporting(DOCUMENTS_ROW) == ["Acme"]
    as_text = {"question": "q", "answer": "a", "context": [["T", "One whole paragraph."]]}
    assert row_documents(as_text) == [{"title": "T", "text": "One whole paragraph."}]


def test_multihop_qa_from_hotpotqa_jsonl_files(tmp_path):
    train = write_jsonl(tmp_path / "train.jsonl", [HOTPOT_CONTEXT, DOCUMENTS_ROW])
    held = write_jsonl(tmp_path / "dev.jsonl", [HOTPOT_HF])
    corpus = write_jsonl(
        tmp_path / "corpus.jsonl",
        [{"id": "x9", "title": "Oslo", "text": "Oslo is the capital of Norway."},
         {"id": "x10", "title": "Bergen", "text": "Bergen is a city."}],
    )  # fmt: skip
    spec = {"kind": "multihop_qa", "path": str(train), "heldout_path": str(held),
            "corpus_path": str(corpus), "metric": "em"}  # fmt: skip
    task = load_task(spec)
    assert (len(task.train), len(task.heldout)) == (2, 1)
    titles = [d["title"] for d in task.documents]
    assert titles == ["Oslo", "Bergen", "Mirrors (novel)", "Kari Lund", "Acme"]  # one per title
    assert task.documents[0]["text"] == "Oslo is the capital of Norway."  # the corpus comes first
    assert [d["id"] for d in task.documents] == ["d0", "d1", "d2", "d3", "d4"]
    first, second = task.train
    assert question(first) == HOTPOT_CONTEXT["question"] + " Answer with a few words only."
    assert first.meta["supporting"] == ["Mirrors (novel)", "Kari Lund"]
    assert second.meta["answers"] == ["Ann Bell", "Ann B. Bell"] and second.answer == "Ann Bell"
    assert task.score("<answer>ann b. bell</answer>", second) == 1.0
    assert task.score("Ann", second) == 0.0  # exact match
    assert task.is_correct("Yes.", task.heldout[0])
    single = MultiHopQATask.from_files(train, heldout_size=1, seed=0)  # no held-out file: a split
    assert len(single.train) == len(single.heldout) == 1
    with pytest.raises(ValueError, match="metric"):
        MultiHopQATask([HOTPOT_CONTEXT], heldout=[], metric="bleu")


# -- EM and F1 as HotpotQA computes them -------------------------------------------------------
@pytest.mark.parametrize(
    ("prediction", "gold", "em", "f1"),
    [
        ("Oslo", "Oslo", 1.0, 1.0),
        ("  the OSLO. ", "Oslo", 1.0, 1.0),  # case, articles, punctuation, spaces
        ("An Eiffel-Tower", "the eiffeltower", 1.0, 1.0),  # punctuation is removed, not spaced
        ("Eiffel Tower in Paris", "the Eiffel Tower", 0.0, 2 / 3),  # p 2/4, r 2/2
        ("Oslo Oslo", "Oslo", 0.0, 2 / 3),  # tokens count with multiplicity: p 1/2, r 1
        ("Bergen", "Oslo", 0.0, 0.0),
        ("", "Oslo", 0.0, 0.0),
        ("the", "Oslo", 0.0, 0.0),
        ("yes", "yes", 1.0, 1.0),
        ("Yes!", "yes", 1.0, 1.0),
        ("yes it is", "yes", 0.0, 0.0),  # yes/no gold: no partial credit (SQuAD F1 gives 0.5)
        ("no", "no way out", 0.0, 0.0),  # a yes/no prediction: no partial credit either
        ("noanswer", "Oslo", 0.0, 0.0),
        ("Café Münch", "café münch", 1.0, 1.0),  # non-ASCII letters stay
        ("«Oslo»", "Oslo", 0.0, 0.0),  # only ASCII punctuation is removed, as in HotpotQA
    ],
)
def test_em_and_f1_normalise_as_hotpotqa(prediction, gold, em, f1):
    assert hotpot_em(prediction, gold) == em
    assert hotpot_f1(prediction, gold) == pytest.approx(f1)


def test_the_task_takes_the_best_gold_and_the_first_line_of_the_answer():
    rows = [{"question": "q?", "answer": ["Eiffel Tower", "Tour Eiffel"]}]
    task = MultiHopQATask(rows, heldout=rows, metric="f1")
    (example,) = task.train
    assert task.score("Tour Eiffel\nor maybe the Eiffel Tower", example) == 1.0
    assert task.score("Eiffel", example) == pytest.approx(2 / 3)
    assert task.score("<answer>x</answer> <answer>the Eiffel Tower</answer>", example) == 1.0
    assert task.score("", example) == 0.0
    assert not task.is_correct("Eiffel", example) and task.is_correct("TOUR EIFFEL", example)
