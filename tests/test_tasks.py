"""Tasks, rewards and metrics: arithmetic, math (math-verify and fallback), QA, pass@k."""

from __future__ import annotations

import itertools
import json
import math
import re
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from esbox.adapters.tasks import (
    ArithmeticTask,
    Example,
    MathTask,
    QATask,
    Task,
    answers,
    load_task,
)
from esbox.adapters.tasks.answers import (
    exact_match,
    fallback_match,
    first_integer,
    gsm8k_final_answer,
    last_boxed,
    token_f1,
)
from esbox.adapters.tasks.base import read_rows
from esbox.adapters.tasks.metrics import (
    accuracy,
    evaluate,
    mean_pass_at_k,
    mean_reward,
    pass_at_k,
    summarize,
)

needs_math_verify = pytest.mark.skipif(
    not answers.math_verify_available(), reason="math-verify not installed"
)

MATH_ROWS = [
    {"question": "Janet has 16 eggs and eats 3. How many are left?", "answer": "16-3=13\n#### 13"},
    {"question": "What is half of 1?", "answer": "\\frac{1}{2}"},
    {"question": "How many cents in 10 dollars?", "answer": "#### 1,000"},
    {"question": "What is 2 + 2?", "answer": "#### 4"},
]


# --------------------------------------------------------------------------- arithmetic


def test_arithmetic_defaults_and_disjoint_splits():
    task = ArithmeticTask()
    assert len(task.heldout) >= 200
    key = lambda e: (e.meta["a"], e.meta["op"], e.meta["b"])  # noqa: E731
    train, held = {key(e) for e in task.train}, {key(e) for e in task.heldout}
    assert len(train) == len(task.train) and len(held) == len(task.heldout)
    assert not train & held
    ex = task.heldout[0]
    a, b = ex.meta["a"], ex.meta["b"]
    assert 10 <= a <= 99 and 10 <= b <= 99
    assert ex.prompt == [{"role": "user", "content": f"What is {a} + {b}?"}]
    assert ex.prefill == f"{a} + {b} = "
    assert ex.answer == str(a + b)


def test_arithmetic_is_seeded():
    assert ArithmeticTask(seed=3).heldout == ArithmeticTask(seed=3).heldout
    assert ArithmeticTask(seed=3).heldout != ArithmeticTask(seed=4).heldout
    # The held-out split does not depend on the train size.
    assert ArithmeticTask(train_size=10).heldout == ArithmeticTask(train_size=500).heldout


def test_arithmetic_reward_first_integer():
    task = ArithmeticTask(train_size=5, heldout_size=5)
    ex = Example("q", "85")
    assert task.reward("85", ex) == 1.0
    assert task.reward(" 85.\n\nSo 47 + 38 = 85", ex) == 1.0
    assert task.reward("84, no wait, 85", ex) == 0.0
    assert task.reward("8 5", ex) == 0.0
    assert task.reward("eighty-five", ex) == 0.0
    assert first_integer("x -12 y") == -12


def test_arithmetic_options():
    task = ArithmeticTask(digits=1, ops=["-", "*"], train_size=50, heldout_size=20, chat=False)
    for e in task.train + task.heldout:
        a, op, b = e.meta["a"], e.meta["op"], e.meta["b"]
        assert op in "-*" and 0 <= a <= 9 and 0 <= b <= 9
        assert int(e.answer) == (a - b if op == "-" else a * b)
        assert isinstance(e.prompt, str)
        assert task.reward(e.answer, e) == 1.0
    with pytest.raises(ValueError, match="distinct"):
        ArithmeticTask(digits=1, train_size=90, heldout_size=20)
    with pytest.raises(ValueError):
        ArithmeticTask(ops=["/"])
    assert ArithmeticTask(train_size=1, heldout_size=1, use_prefill=False).train[0].prefill is None


# --------------------------------------------------------------------------- minibatches


def test_sample_batch_is_a_function_of_seed_and_step():
    task = ArithmeticTask(train_size=100, heldout_size=10)
    a = task.sample_batch(step=7, size=16, seed=1)
    assert a == task.sample_batch(step=7, size=16, seed=1)
    assert a == ArithmeticTask(train_size=100, heldout_size=10).sample_batch(7, 16, seed=1)
    assert a != task.sample_batch(step=8, size=16, seed=1)
    assert a != task.sample_batch(step=7, size=16, seed=2)
    with pytest.raises(ValueError):
        task.sample_batch(step=-1, size=4)


class ExactTask(Task):
    """The smallest concrete task: the completion must equal the answer."""

    def score(self, completion: str, example: Example) -> float:
        return float(completion == example.answer)


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 30), size=st.integers(1, 40), seed=st.integers(0, 2**32 - 1))
def test_sample_batch_covers_each_example_once_per_epoch(n, size, seed):
    task = ExactTask([Example(str(i), str(i)) for i in range(n)], [])
    steps = n * 2  # enough batches for at least two epochs
    drawn = [e.answer for s in range(steps) for e in task.sample_batch(s, size, seed)]
    assert all(len(task.sample_batch(s, size, seed)) == size for s in range(3))
    for epoch in range(len(drawn) // n):
        assert sorted(drawn[epoch * n : (epoch + 1) * n], key=int) == [str(i) for i in range(n)]


# --------------------------------------------------------------------------- math


def test_answer_helpers():
    assert gsm8k_final_answer("reasoning\n#### 1,234") == "1234"
    assert gsm8k_final_answer("  42 ") == "42"
    assert last_boxed("a \\boxed{1} b \\boxed{\\frac{1}{2}} c") == "\\frac{1}{2}"
    assert last_boxed("\\boxed{unclosed") is None
    assert last_boxed("none") is None


@pytest.mark.parametrize(
    ("completion", "gold", "ok"),
    [
        ("so the answer is \\boxed{13}.", "13", True),
        ("16 - 3 = 13 eggs", "13", True),
        ("\\boxed{12} hmm, 13", "13", False),  # the boxed answer wins
        ("The total is 1,000 cents", "1000", True),
        ("answer: 4.0", "4", True),
        ("no number here", "4", False),
        ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}", True),
    ],
)
def test_fallback_match(completion, gold, ok):
    assert fallback_match(completion, gold) is ok


@needs_math_verify
@pytest.mark.parametrize(
    ("completion", "gold", "ok"),
    [
        ("so the answer is \\boxed{13}.", "13", True),
        ("\\boxed{0.5}", "\\frac{1}{2}", True),
        ("$\\frac{2}{4}$", "\\frac{1}{2}", True),
        ("\\boxed{1,000}", "1000", True),
        ("\\boxed{12}", "13", False),
        ("nothing", "13", False),
    ],
)
def test_math_verify_match(completion, gold, ok):
    assert answers.math_verify_match(completion, gold) is ok


@pytest.mark.parametrize("use_mv", [False, pytest.param(True, marks=needs_math_verify)])
def test_math_task_rewards_with_format_bonus(use_mv):
    task = MathTask(MATH_ROWS, MATH_ROWS[:2], use_math_verify=use_mv, format_weight=0.1)
    eggs, half = task.heldout
    assert eggs.answer == "13" and half.answer == "\\frac{1}{2}"
    assert eggs.prompt[-1]["content"].endswith("\\boxed{}.")
    assert task.reward("\\boxed{13}", eggs) == pytest.approx(1.1)
    assert task.reward("it is 13", eggs) == 1.0
    assert task.reward("\\boxed{12}", eggs) == pytest.approx(0.1)
    assert task.is_correct("\\boxed{13}", eggs)
    assert not task.is_correct("\\boxed{12}", eggs)
    assert task.reward("\\boxed{\\frac{1}{2}}", half) == pytest.approx(1.1)


@needs_math_verify
def test_math_verify_reward_works_in_threads():
    task = MathTask(MATH_ROWS, MATH_ROWS, use_math_verify=True)
    jobs = [("\\boxed{13}", task.heldout[0]), ("\\boxed{0.5}", task.heldout[1])] * 4
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda job: task.reward(*job), jobs))
    assert results == [1.0] * len(jobs)


def test_math_task_files_and_split(tmp_path: Path):
    path = tmp_path / "rows.jsonl"
    rows = [{"q": f"What is {i} + 1?", "a": f"#### {i + 1}"} for i in range(20)]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    assert read_rows(path, limit=3) == rows[:3]
    task = MathTask.from_files(
        path, question_key="q", answer_key="a", heldout_size=5, seed=1, chat=False
    )
    assert len(task.train) == 15 and len(task.heldout) == 5
    assert not {e.prompt for e in task.train} & {e.prompt for e in task.heldout}
    spec = {"kind": "math", "path": str(path), "question_key": "q", "answer_key": "a"}
    again = load_task({**spec, "heldout_size": 5, "seed": 1, "chat": False})
    assert [e.prompt for e in again.heldout] == [e.prompt for e in task.heldout]


def test_parquet_rows(tmp_path: Path):
    pq = pytest.importorskip("pyarrow.parquet")
    pa = pytest.importorskip("pyarrow")
    path = tmp_path / "rows.parquet"
    pq.write_table(pa.Table.from_pylist(MATH_ROWS), path)
    assert read_rows(path) == MATH_ROWS
    task = load_task({"kind": "math", "path": str(path), "heldout_size": 1})
    assert len(task.train) == 3


# --------------------------------------------------------------------------- QA


def test_qa_normalisation_em_f1():
    assert exact_match("The Cat!", "cat") == 1.0
    assert exact_match("a cat", "dog") == 0.0
    # articles dropped: "big red dog" vs "red dog", precision 2/3, recall 1
    assert token_f1("the big red dog", "red dog") == pytest.approx(0.8)
    assert token_f1("", "") == 1.0
    assert token_f1("x", "") == 0.0
    assert token_f1("blue", "red") == 0.0


def test_qa_task_metrics(tmp_path: Path):
    rows = [
        {"question": "Capital of France?", "answers": ["Paris", "paris city"], "context": "..."},
        {"question": "Color of the sky?", "answers": "blue"},
    ]
    path = tmp_path / "qa.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    f1 = load_task({"kind": "qa", "path": str(path), "heldout_path": str(path)})
    em = QATask(rows, rows, metric="em")
    paris, sky = f1.heldout
    assert "Capital of France?" in paris.prompt[-1]["content"]
    assert paris.meta["answers"] == ["Paris", "paris city"] and sky.answer == "blue"
    assert f1.reward("Paris city\nmore text", paris) == 1.0
    assert f1.reward("the city of Paris", paris) == pytest.approx(0.8)
    assert em.reward("the city of Paris", em.heldout[0]) == 0.0
    assert f1.is_correct("The sky is blue", sky) is False
    assert f1.is_correct("Blue.", sky) is True
    with pytest.raises(ValueError):
        QATask(rows, rows, metric="bleu")


# --------------------------------------------------------------------------- factory


def test_load_task_kinds():
    task = load_task({"kind": "arithmetic", "train_size": 20, "heldout_size": 10, "seed": 5})
    assert isinstance(task, ArithmeticTask) and len(task.heldout) == 10
    with pytest.raises(ValueError, match="unknown task kind"):
        load_task({"kind": "nope"})


def test_datasets_kind_names_the_missing_package(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # as if it were not installed
    with pytest.raises(ImportError, match="pip install datasets"):
        load_task({"kind": "datasets", "name": "openai/gsm8k", "config": "main"})


# --------------------------------------------------------------------------- metrics


def brute_force_pass_at_k(n: int, c: int, k: int) -> float:
    """Fraction of the k-subsets of n samples (c correct) that hold a correct one."""
    samples = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(samples[i] for i in s) for s in subsets) / len(subsets)


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_pass_at_k_matches_combinatorial_count(data):
    n = data.draw(st.integers(1, 10))
    c = data.draw(st.integers(0, n))
    k = data.draw(st.integers(1, n))
    expected = brute_force_pass_at_k(n, c, k)
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)
    assert pass_at_k(n, c, k) == pytest.approx(1 - math.comb(n - c, k) / math.comb(n, k))


def test_pass_at_k_edges_and_large_n():
    assert pass_at_k(10, 0, 5) == 0.0
    assert pass_at_k(10, 10, 1) == 1.0
    assert pass_at_k(5, 2, 1) == pytest.approx(0.4)
    # Large n: the product form stays finite where C(n, k) overflows floats.
    value = pass_at_k(2000, 3, 100)
    assert 0 < value < 1 and math.isfinite(value)
    with pytest.raises(ValueError):
        pass_at_k(3, 4, 1)
    with pytest.raises(ValueError):
        pass_at_k(3, 1, 4)


def test_accuracy_mean_reward_summarize():
    assert accuracy([True, False, True, True]) == 0.75
    assert accuracy([1.1, 0.1, 1.0]) == pytest.approx(2 / 3)
    assert mean_reward([1.0, 0.0, 0.5]) == 0.5
    assert math.isnan(mean_reward([1.0, float("nan")]))
    correct = [[True, False], [False, False], [False, True]]
    out = summarize(correct, [[1, 0], [0, 0], [0, 1]], ks=(1, 2, 3))
    assert out["accuracy"] == pytest.approx(1 / 3)
    assert out["mean_reward"] == pytest.approx(1 / 3)
    assert out["pass@1"] == pytest.approx(1 / 3)
    assert out["pass@2"] == pytest.approx(2 / 3)
    assert "pass@3" not in out
    assert mean_pass_at_k(correct, 2) == out["pass@2"]


class AnswerBackend:
    """A fake backend: answers arithmetic right when a < 50, else says 0."""

    def __init__(self):
        self.calls = []

    def generate(self, prompts, *, prefills=None, num_samples=1, **kwargs):
        self.calls.append(dict(kwargs, n=len(prompts), num_samples=num_samples))
        out = []
        for prompt in prompts:
            a, b = map(int, re.findall(r"\d+", prompt[-1]["content"]))
            out += [str(a + b) if a < 50 else "0"] * num_samples
        return out


def test_evaluate_with_fake_backend():
    task = ArithmeticTask(train_size=10, heldout_size=200)
    backend = AnswerBackend()
    done: list[int] = []
    result = evaluate(task, backend, batch_size=64, progress=done.append)
    assert done == [64, 64, 64, 8]  # one progress call per generated batch
    expected = sum(e.meta["a"] < 50 for e in task.heldout) / 200
    assert result["accuracy"] == pytest.approx(expected)
    assert result["mean_reward"] == pytest.approx(expected)
    assert result["n"] == 200
    assert [c["n"] for c in backend.calls] == [64, 64, 64, 8]
    assert backend.calls[0]["max_new_tokens"] == task.max_new_tokens
    assert backend.calls[0]["greedy"] is True
    sampled = evaluate(task, backend, limit=10, num_samples=4)
    assert {"pass@1", "pass@2", "pass@4"} <= set(sampled)
    assert backend.calls[-1]["greedy"] is False


def test_load_task_names_a_bad_option_instead_of_a_type_error():
    with pytest.raises(ValueError, match="digts"):
        load_task({"kind": "arithmetic", "digts": 2})
    with pytest.raises(ValueError, match="needs the option 'path'"):
        load_task({"kind": "math"})
