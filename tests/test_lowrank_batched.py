"""One batched forward for a low-rank population: hooks, the grouped backend, the evaluator.

Member i's rows of a batched forward give the logits of ``W + s_i A_i B_i^T / sqrt(r)``
written explicitly (fp32 tolerance), tied and untied heads alike; no parameter is written (not
even restored) during a batched sweep; greedy completions and rewards equal the sweep's.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from click.testing import CliRunner  # noqa: E402

import esbox  # noqa: E402
from esbox.adapters.agents.evaluator import AgentEvaluator  # noqa: E402
from esbox.adapters.agents.loop import AgentLimits, AgentLoop  # noqa: E402
from esbox.adapters.agents.tools import Calculator  # noqa: E402
from esbox.adapters.generation.hf import HFBackend  # noqa: E402
from esbox.adapters.models.batched import LowRankPopulation  # noqa: E402
from esbox.adapters.models.space import TorchModuleSpace  # noqa: E402
from esbox.adapters.models.testing import char_tokenizer, save_tiny_lm, tiny_causal_lm  # noqa: E402
from esbox.adapters.tasks import ArithmeticTask, ToolMathTask  # noqa: E402
from esbox.adapters.tasks.batched_rollouts import BatchedRolloutEvaluator  # noqa: E402
from esbox.adapters.tasks.rollouts import RolloutEvaluator  # noqa: E402
from esbox.cli.main import cli  # noqa: E402
from esbox.lowrank import factors  # noqa: E402
from esbox.specs import Perturbation  # noqa: E402

OPENED = '<tool_call>{"name": "calculator", "arguments": {"expression": "'


@pytest.fixture(scope="module")
def tokenizer():
    return char_tokenizer()


def tiny(tokenizer, arch="llama", tie=True):
    model = tiny_causal_lm(arch, len(tokenizer), tie_word_embeddings=tie)
    return model.requires_grad_(False)


def members(space, count=4, rank=2, sigma=0.3, subspaces=1):
    es = esbox.make_strategy(
        "copes" if subspaces > 1 else "openai_es", space, seed=1, population=count,
        sigma=sigma, perturbation="lowrank", rank=rank,
        **({"subspaces": subspaces, "antithetic": False} if subspaces > 1 else {}),
    )  # fmt: skip
    return es.ask()


def written_logits(model, space, p, ids):
    """Logits with ``W + s A B^T / sqrt(r)`` written by hand into a copy of the weights."""
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        for i in space.lowrank_tensors(p, p.run_seed, p.step):
            a, b = factors(p.run_seed, p.step, p.seed, i, space.shapes[i], p.rank)
            space._flat[i].view(space.shapes[i]).add_(a @ b.T, alpha=p.scale / math.sqrt(p.rank))
        logits = model(input_ids=ids).logits
    model.load_state_dict(saved)
    return logits


@pytest.mark.parametrize(
    "arch,tie,subspaces", [("llama", True, 1), ("qwen2", True, 1), ("llama", False, 1),
                           ("llama", True, 3)],
)  # fmt: skip
def test_each_members_batched_logits_equal_its_explicit_weights(tokenizer, arch, tie, subspaces):
    model = tiny(tokenizer, arch, tie)
    space = TorchModuleSpace(model)
    population = members(space, count=6, subspaces=subspaces)
    ids = torch.randint(0, len(tokenizer), (3, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), LowRankPopulation(space, population):
        batched = model(input_ids=ids.repeat(len(population), 1)).logits
    unperturbed = model(input_ids=ids).logits
    for j, p in enumerate(population):
        rows = batched[3 * j : 3 * j + 3]
        expected = written_logits(model, space, p, ids)
        torch.testing.assert_close(rows, expected, atol=1e-4, rtol=1e-4)  # fp32 rounding
        shift = float((expected - unperturbed).abs().max())
        assert shift > 100 * float((rows - expected).abs().max()), "the noise must show"


def test_nothing_in_the_model_is_written_during_a_batched_sweep(tokenizer):
    model = tiny(tokenizer)
    space = TorchModuleSpace(model)
    backend = HFBackend(model, tokenizer)
    before = {k: (v.clone(), v._version) for k, v in model.named_parameters()}
    population = members(space)
    with LowRankPopulation(space, population):
        backend.generate(["1+2=", "3+4="] * len(population), max_new_tokens=6, groups=4)
    for name, param in model.named_parameters():
        value, version = before[name]
        assert torch.equal(param, value) and param._version == version, name
    assert not model._forward_hooks and all(not m._forward_hooks for m in model.modules())


@pytest.mark.parametrize("share_prefix", [True, False])
def test_grouped_greedy_generation_equals_each_members_sweep(tokenizer, share_prefix):
    model = tiny(tokenizer)
    space = TorchModuleSpace(model)
    backend = HFBackend(model, tokenizer, share_prefix=share_prefix, min_shared_prefix=1)
    prompts = [[{"role": "user", "content": f"What is {a} + {b}?"}] for a, b in [(1, 2), (30, 4)]]
    population = members(space, count=4, sigma=0.5)
    with LowRankPopulation(space, population):
        grouped = backend.generate(prompts * 4, max_new_tokens=8, groups=4)
    one_by_one = []
    with space.sweep(population) as each:
        for _ in each:
            one_by_one += backend.generate(prompts, max_new_tokens=8)
    assert grouped == one_by_one
    assert len(set(grouped)) > 2, "members should answer differently"


def test_batched_evaluator_rewards_equal_the_sweep_and_split_by_max_rows(tokenizer):
    model = tiny(tokenizer)
    space = TorchModuleSpace(model)
    task = ArithmeticTask(train_size=40, heldout_size=4)
    backend = HFBackend(model, tokenizer)
    population = members(space, count=4, sigma=2.0)
    kwargs = dict(batch_size=5, max_new_tokens=4)
    sweep = RolloutEvaluator(task, backend, **kwargs).evaluate(space, population)
    for max_rows in (0, 8):  # all rows at once; 2 prompts x 4 members per call
        batched = BatchedRolloutEvaluator(task, backend, max_rows=max_rows, **kwargs)
        assert batched.batches(space, population)
        np.testing.assert_array_equal(batched.evaluate(space, population), sweep)
    full = esbox.make_strategy("openai_es", space, population=4).ask()
    assert not BatchedRolloutEvaluator(task, backend).batches(space, full)


def test_batched_agent_rollouts_equal_each_members_sweep(tokenizer):
    model = tiny_causal_lm("llama", len(tokenizer), max_position_embeddings=4096)
    space = TorchModuleSpace(model.requires_grad_(False))
    task = ToolMathTask(families=["product"], train_size=8, heldout_size=2, seed=1)
    limits = AgentLimits(max_turns=2, max_tokens=24, max_new_tokens=12)
    loop = AgentLoop(HFBackend(model, tokenizer), [Calculator()], limits=limits, prefill=OPENED)
    # max_rows 8: 2 questions x 4 members in the first call, the third question in a second
    evaluator = AgentEvaluator(task, loop, batch_size=3, log_per_member=3, max_rows=8)
    population = members(space, count=4, sigma=2.0)
    assert evaluator.batches(space, population)
    batched = evaluator.evaluate(space, population)
    batched_records = evaluator._records
    batch = task.sample_batch(0, 3, 0)
    with space.sweep(population) as each:
        swept = [evaluator.run(batch, 0, None) for _ in each]
    np.testing.assert_array_equal(batched, [np.mean([t.reward for t in ts]) for ts in swept])
    assert [r["messages"] for r in batched_records] == [t.messages for ts in swept for t in ts]
    assert len({json.dumps(r["messages"]) for r in batched_records}) > 3, "members must differ"


def test_refusals_name_the_problem(tokenizer):
    model = tiny(tokenizer)
    space = TorchModuleSpace(model)
    population = members(space)
    with LowRankPopulation(space, population), pytest.raises(RuntimeError, match="multiple"):
        model(input_ids=torch.zeros(3, 2, dtype=torch.long))
    with pytest.raises(ValueError, match="one run seed, step and rank"):
        LowRankPopulation(space, [population[0], Perturbation(1, 0, 5, 0.1, rank=3)])
    with pytest.raises(ValueError, match="rank >= 1"):
        LowRankPopulation(space, [Perturbation(1, 0, 5, 0.1)])

    class Scaled(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.ones(3, 3))

    holder = torch.nn.Sequential(torch.nn.Linear(3, 3), Scaled())
    other = TorchModuleSpace(holder, include=["*weight"])
    with pytest.raises(TypeError, match=r"1 \(Scaled\).*nn.Linear and nn.Embedding"):
        LowRankPopulation(other, members(other)).__enter__()
    assert not holder[0]._forward_hooks, "a refused population leaves no hook behind"


def test_optimize_llm_with_low_rank_perturbations_end_to_end(tmp_path):
    model = save_tiny_lm(tmp_path / "tiny")
    sets = {
        "problem.kind": "llm",
        "problem.model": str(model),
        "problem.batch_size": 2,
        "problem.task": "{kind: arithmetic, train_size: 20, heldout_size: 4}",
        "problem.validation_every": 0,
        "options.population": 4,
        "options.subspaces": 2,
        "options.perturbation": "lowrank",
        "options.rank": 2,
        "budget.max_steps": 2,
        "budget.max_evaluations": "null",
    }
    args = ["optimize", "-q", "--strategy", "copes", "--out", str(tmp_path / "run")]
    for key, value in sets.items():
        args += ["--set", f"{key}={value}"]
    result = CliRunner().invoke(cli, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    metrics = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in metrics]
    assert len(rows) == 2


def test_ignore_eos_generates_every_token(tokenizer):
    model = tiny(tokenizer)
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")

    def prefer_eos(module, args, output):
        output[..., eos] += 100.0  # the model would stop at once
        return output

    handle = model.lm_head.register_forward_hook(prefer_eos)
    try:
        stopping = HFBackend(model, tokenizer)
        stopping.generate(["1+2=", "3+4="], max_new_tokens=5)
        assert stopping.last_stats["new_tokens"] == 0
        fixed = HFBackend(model, tokenizer, ignore_eos=True)
        fixed.generate(["1+2=", "3+4="], max_new_tokens=5)
        assert fixed.last_stats["new_tokens"] == 10
    finally:
        handle.remove()


def test_benchmark_children_measure_every_mode(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1]))
    from benchmarks import lowrank_children

    spec = {"model": str(save_tiny_lm(tmp_path / "tiny")), "dtype": "float32",
            "threads": torch.get_num_threads(), "population": 2, "prompts": 2,
            "new_tokens": 2, "rank": 2}  # fmt: skip
    for mode in lowrank_children.MODES:
        out = lowrank_children.serve({**spec, "kind": mode})
        assert out["seconds"] > 0 and out["peak"] > 0 and out["rows"] == 4
        assert out.get("batched", mode == "lowrank") == (mode == "lowrank")
