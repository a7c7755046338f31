"""Multi-turn GRPO: esbox's agent loop as TRL's rollout_func; tool results are out of the loss."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

pytest.importorskip("trl")
pytest.importorskip("peft")

import torch
from click.testing import CliRunner

from esbox.adapters.agents.loop import Trajectory
from esbox.adapters.models.testing import save_tiny_lm
from esbox.adapters.rl import load_grpo_config
from esbox.adapters.rl.training import GRPOTraining
from esbox.adapters.tasks.tool_math import ToolMathTask
from esbox.cli.main import cli
from esbox.errors import ConfigError

os.environ["HF_HUB_OFFLINE"] = "1"  # nothing may be downloaded
PREFILL = '<tool_call>{"name": "calculator", "arguments": {"expression": "'


@pytest.fixture(scope="module")
def tiny_lm(tmp_path_factory) -> Path:
    return save_tiny_lm(tmp_path_factory.mktemp("models") / "tiny", max_position_embeddings=4096)


@pytest.fixture
def digit_reward(monkeypatch):
    """A reward with spread on a random model: the share of digits in the final answer."""
    monkeypatch.setattr(
        ToolMathTask, "reward", lambda self, c, e: sum(ch.isdigit() for ch in c) / max(len(c), 1)
    )


def agent_config(model: Path, out: Path, **sections) -> dict:
    return {
        "seed": 0,
        "problem": {
            "kind": "llm",
            "model": str(model),
            "task": {"kind": "tool_math", "train_size": 8, "heldout_size": 2},
            "agent": {
                "tools": ["calculator"],
                "max_turns": 2,
                "max_tokens": 16,
                "max_new_tokens": 8,
                "prefill": PREFILL,
            },
            "batch_size": 2,
            "validation_every": 1,
        },
        "grpo": {"num_generations": 2, "learning_rate": 0.01, "gradient_checkpointing": False},
        "budget": {"max_steps": 1, "max_evaluations": None},
        "checkpoint": {"every": 1},
        "output": {"dir": str(out)},
        **sections,
    }


def training(model: Path, out: Path, **sections) -> GRPOTraining:
    out.mkdir(parents=True)
    return GRPOTraining(load_grpo_config(agent_config(model, out, **sections)), out)


def test_a_trajectory_is_one_stream_with_tool_results_masked(tiny_lm, tmp_path):
    limits = {"tools": ["calculator"], "max_new_tokens": 64, "max_tokens": 256, "prefill": PREFILL}
    problem = {**agent_config(tiny_lm, tmp_path)["problem"], "agent": limits}
    rollouts = training(tiny_lm, tmp_path / "run", problem=problem).parts.inputs.rollout_func
    tokenizer = rollouts.tokenizer
    question = [{"role": "user", "content": "What is 6 times 7?"}]
    call = PREFILL + '6 * 7"}}</tool_call>'
    messages = [*question, {"role": "assistant", "content": call},
                {"role": "tool", "name": "calculator", "content": "42"},
                {"role": "assistant", "content": "<answer>42</answer>"}]  # fmt: skip
    prompt, completion, mask = rollouts.stream(Trajectory(messages, stop="answer", tokens=40))
    assert tokenizer.decode(prompt).endswith("<|im_start|>assistant\n" + PREFILL)
    assert completion[-1] == tokenizer.eos_token_id and mask[-1] == 1  # it ended its answer
    written = tokenizer.decode([t for t, m in zip(completion[:-1], mask, strict=False) if m])
    assert written == '6 * 7"}}</tool_call><answer>42</answer>'  # the model's own text only
    inserted = tokenizer.decode([t for t, m in zip(completion, mask, strict=True) if not m])
    assert "42" in inserted and "<tool_response>" in inserted and PREFILL not in inserted
    assert inserted.startswith("<|im_end|>")  # the turn's end, the result, the next header
    cut = rollouts.stream(Trajectory(messages, stop="max_tokens", tokens=256))
    assert cut[1] == completion[:-1]  # no end-of-turn token where a limit ended it


def test_a_template_that_rewrites_assistant_turns_is_refused(tmp_path):
    model = save_tiny_lm(tmp_path / "trim", max_position_embeddings=4096)
    template = model / "chat_template.jinja"
    trimmed = template.read_text().replace("{{ m['content'] }}", "{{ m['content'] | trim }}")
    assert trimmed != template.read_text()
    template.write_text(trimmed)
    agent = {"tools": ["calculator"], "prefill": " " + PREFILL}  # a space the template drops
    sections = {"problem": {**agent_config(model, tmp_path)["problem"], "agent": agent}}
    with pytest.raises(ConfigError, match="native_template: text"):
        training(model, tmp_path / "run", **sections)


def test_tool_result_tokens_get_no_gradient_and_tool_use_is_logged(tiny_lm, tmp_path, digit_reward):
    built = training(tiny_lm, tmp_path / "run")
    trainer = built.parts.trainer
    seen: dict = {}
    compute_loss = trainer.compute_loss

    def capture_inputs(model, inputs, *args, **kwargs):
        seen["inputs"] = inputs
        return compute_loss(model, inputs, *args, **kwargs)

    def keep_grad(module, args, output):
        if output.requires_grad:  # the training forward, not generation
            output.retain_grad()
            seen["hidden"] = output

    trainer.compute_loss = capture_inputs
    hook = trainer.model.model.norm.register_forward_hook(keep_grad)
    try:
        built.run(resume=False)
    finally:
        hook.remove()
    inputs, grad = seen["inputs"], seen["hidden"].grad
    tool, kept = inputs["tool_mask"], inputs["completion_mask"]
    prompt_length = inputs["prompt_ids"].shape[1]
    # hidden state p predicts token p + 1: completion token j is predicted at prompt_length + j - 1
    per_token = grad[:, prompt_length - 1 : prompt_length - 1 + tool.shape[1]].abs().sum(-1)
    assert ((tool == 0) & (kept == 1)).any()  # tool results were in the streams
    assert (per_token[(tool == 0)] == 0).all()  # ... and none of them is learned
    assert (per_token[(tool == 1) & (kept == 1)] > 0).any()  # the model's own tokens are
    assert torch.isfinite(per_token).all()
    run = tmp_path / "run"
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert rows[0]["agent_tool_call_rate"] == 1.0  # the prefill opens a call every time
    assert rows[0]["agent_turns"] == 2.0 and "val_tool_call_rate" in rows[0]
    extra = rows[0]["completion_tokens"] - rows[0]["agent_trajectory_tokens"]  # mask-1 tokens:
    assert 0 <= extra <= 1  # the model's own, with the end-of-turn token of closed answers
    report = CliRunner().invoke(cli, ["report", str(run), "-o", str(tmp_path / "r")])
    assert report.exit_code == 0 and (tmp_path / "r" / "agent.png").is_file()


def test_rollouts_generate_with_gradient_checkpointing_on(tiny_lm, tmp_path):
    """A checkpointed model in training mode returns no cache; the rollouts generate in eval
    mode, and training mode is back for the loss."""
    grpo = {"num_generations": 2, "learning_rate": 0.01, "gradient_checkpointing": True}
    built = training(tiny_lm, tmp_path / "run", grpo=grpo)
    trainer = built.parts.trainer
    modes = []
    compute_loss = trainer.compute_loss

    def capture_mode(model, inputs, *args, **kwargs):
        modes.append(model.training)
        return compute_loss(model, inputs, *args, **kwargs)

    trainer.compute_loss = capture_mode
    built.run(resume=False)
    rows = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert len(rows) == 1 and modes and all(modes)
    assert trainer.model.is_gradient_checkpointing
