"""``python -m benchmarks agent-memory`` with TRL's own GRPO steps beside the hand-written ones,
on a tiny model: both hold the same trainable parameters and optimizer state."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def importable(monkeypatch: pytest.MonkeyPatch) -> None:
    """``benchmarks`` is not installed: it imports from the repository root."""
    monkeypatch.syspath_prepend(str(ROOT))


def test_trls_steps_run_beside_the_hand_written_ones(tmp_path, capsys) -> None:
    pytest.importorskip("trl")
    pytest.importorskip("peft")
    from benchmarks import agent_memory
    from esbox.adapters.models.testing import save_tiny_lm

    model = save_tiny_lm(tmp_path / "tiny")
    argv = [
        "--model",
        str(model),
        "--tokens",
        "200",
        "--batch",
        "2",
        "--turns",
        "2",
        "--methods",
        "grpo,lora,trl_grpo,trl_lora",
        "--json",
        str(tmp_path / "raw.json"),
    ]
    assert agent_memory.main(argv) == 0
    text = capsys.readouterr().out
    assert "| 200 | GRPO step (full) |" in text and "| 200 | LoRA-GRPO step (r=16) |" in text
    runs = json.loads((tmp_path / "raw.json").read_text())["200"]
    assert runs["trl_lora"]["lora_parameters"] == runs["lora"]["lora_parameters"]  # same adapters
    for own, trl in (("grpo", "trl_grpo"), ("lora", "trl_lora")):
        assert runs[trl]["adam"] == pytest.approx(runs[own]["adam"])  # moments of the same weights
        assert runs[trl]["peak"] > runs[trl]["baseline"] and runs[trl]["reset"]
        assert runs[trl]["step"]["tokens"] == runs[own]["step"]["tokens"]
