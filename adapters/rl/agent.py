"""Multi-turn GRPO: a TRL ``rollout_func`` that runs esbox's own agent loop (the ES runs' tool
protocol, turn and token limits, prefill and reward) and hands TRL each trajectory as one token
stream with a mask that keeps what the model did not write out of the loss.

A trajectory's stream is the first turn's prompt (template and prefill), then per turn the
model's text (mask 1) and the glue to the next turn's prompt: the end of the turn, the tool
results and the next turn's header and prefill (mask 0); an answer turn that the model ended
itself ends with the end-of-turn token (mask 1). Each later prompt the loop renders
must extend the stream as text, which holds for templates that render an assistant message as
it was written; a template that rewrites it is refused when the trainer is built.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from esbox.adapters.agents.evaluator import AgentEvaluator, summarize
from esbox.adapters.agents.loop import Trajectory, merge_system
from esbox.errors import ConfigError

from .data import EXAMPLE_COLUMN, TrainingInputs, validation_options
from .reward import TaskReward

REWARD_COLUMN = "agent_reward"  # the trajectory's reward, from the rollout to the reward


class TrajectoryReward(TaskReward):
    """TRL reward function of agent runs: the reward esbox's agent evaluator gave each
    trajectory (the task's reward of the final answer less the protocol penalties)."""

    __name__ = "agent_reward"

    def __call__(self, prompts: Sequence[Any], completions: Sequence[Any], **columns: Any) -> list:
        return self.record(columns[REWARD_COLUMN])


class AgentRollouts:
    """``rollout_func(prompts, trainer)``: one sampled trajectory per prompt row (TRL's sampler
    repeats each prompt ``num_generations`` times), seeded by the run seed and the step."""

    def __init__(self, evaluator: AgentEvaluator) -> None:
        self.evaluator, self.loop = evaluator, evaluator.loop
        self.tokenizer = self.loop.tokenizer
        self.index: dict[str, int] = {}  # a prompt row's text -> its train example
        self.figures: dict[str, float] = {}

    def __call__(self, prompts: Sequence[str], trainer: Any) -> dict[str, Any]:
        batch = [self.evaluator.task.train[self.index[p]] for p in prompts]
        model = trainer.model
        training = model.training
        model.eval()  # as ES rolls out: no dropout, and a checkpointed model keeps its cache
        try:
            trajectories = self.evaluator.run(batch, trainer.state.global_step, None)
        finally:
            model.train(training)
        streams = [self.stream(t) for t in trajectories]
        self.figures = summarize(trajectories)
        prompt_ids = [s[0] for s in streams]
        completion_ids = [s[1] for s in streams]
        return {
            "prompt_ids": prompt_ids,
            "completion_ids": completion_ids,
            "logprobs": completion_logprobs(
                trainer.model, prompt_ids, completion_ids, trainer.args.temperature
            ),
            "env_mask": [s[2] for s in streams],
            REWARD_COLUMN: [t.reward for t in trajectories],
        }

    def first_prompt(self, conversation: Sequence[Any]) -> str:
        """The text the first turn continues: the rendered conversation and the first prefill."""
        return str(self.loop.prompt(conversation, self.evaluator.tools)) + self.prefill(0)

    def prefill(self, turn: int) -> str:
        """The text turn ``turn`` starts with (``problem.agent.prefill``)."""
        prefills = self.loop.prefills
        return (prefills[turn] if turn < len(prefills) else "") or ""

    def _ids(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def stream(self, trajectory: Trajectory) -> tuple[list[int], list[int], list[int]]:
        """(prompt ids, completion ids, mask: 1 where the model wrote the token)."""
        messages = trajectory.messages
        turns = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
        text = self.first_prompt(messages[: turns[0]])
        prompt, completion, mask = self._ids(text), [], []
        for t, at in enumerate(turns):
            written = str(messages[at]["content"])[len(self.prefill(t)) :]
            ids = self._ids(written)
            completion, mask, text = completion + ids, mask + [1] * len(ids), text + written
            if t + 1 < len(turns):
                following = self.loop.prompt(messages[: turns[t + 1]], self.evaluator.tools)
                following = str(following) + self.prefill(t + 1)
                if not following.startswith(text):
                    raise ConfigError(
                        "problem.agent: the chat template renders an assistant turn otherwise "
                        "than the model wrote it, so a trajectory is not one token stream; set "
                        "problem.agent.native_template: text"
                    )
                glue = self._ids(following[len(text) :])
                completion, mask, text = completion + glue, mask + [0] * len(glue), following
        if self._ended_by_eos(trajectory, len(ids)):  # the model closed its answer turn
            completion, mask = [*completion, self.tokenizer.eos_token_id], [*mask, 1]
        return prompt, completion, mask

    def _ended_by_eos(self, trajectory: Trajectory, last: int) -> bool:
        """Whether the final turn (``last`` tokens) stopped at the end-of-turn token: it gave
        an answer with room left under the turn's and the trajectory's token limits."""
        limits = self.loop.limits
        room = min(limits.max_new_tokens, limits.max_tokens - (trajectory.tokens - last))
        return (
            trajectory.stop in ("answer", "done")
            and last < room
            and self.tokenizer.eos_token_id is not None
        )


def completion_logprobs(
    model: Any, prompts: Sequence[list[int]], completions: Sequence[list[int]], temperature: float
) -> list[list[float]]:
    """Each completion token's log-probability under ``model`` (logits over ``temperature``, as
    TRL scores them), one forward per trajectory."""
    import torch

    device = next(model.parameters()).device
    out = []
    with torch.no_grad():
        for prompt, completion in zip(prompts, completions, strict=True):
            ids = torch.tensor([prompt + completion], device=device)
            logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float() / temperature
            picked = torch.log_softmax(logits, -1).gather(-1, ids[0, len(prompt) :, None])
            out.append(picked[:, 0].tolist())
    return out


def started(evaluator: AgentEvaluator, example: Any) -> list[dict[str, Any]]:
    """The example's conversation with its environment's first observation, as a rollout starts
    it: the prompt row that tells one episode from another (a game's rows differ only there)."""
    from esbox.adapters.agents.episodes import Episode
    from esbox.adapters.agents.evaluator import episode_row
    from esbox.adapters.agents.loop import start_episode

    trajectory = Trajectory(merge_system(example.prompt))
    start_episode(trajectory, Episode(evaluator.environment(), episode_row(example)))
    return trajectory.messages


def check_template(rollouts: AgentRollouts, conversation: Sequence[Any]) -> None:
    """Refuse a template that re-renders an assistant turn (before any training), on a
    made-up trajectory of one call and one answer."""
    call = '<tool_call>{"name": "x", "arguments": {}}</tool_call>'
    messages = [
        *conversation,
        {"role": "assistant", "content": rollouts.prefill(0) + call},
        {"role": "tool", "name": "x", "content": "1"},
        {"role": "assistant", "content": rollouts.prefill(1) + "<answer>1</answer>"},
    ]
    rollouts.stream(Trajectory(messages))


def agent_inputs(
    task: Any, backend: Any, problem: dict[str, Any], *, seed: int, temperature: float
) -> TrainingInputs:
    """Sampled trajectories of esbox's agent loop (``problem.agent``) at ``temperature``, and
    held-out validation by the ES runs' agent validation (greedy unless ``problem.greedy`` is
    off)."""
    import datasets

    from esbox.adapters.agents.config import agent_options, build_agent

    options = agent_options(problem["agent"])
    common = {"seed": seed, "batch_size": problem["batch_size"]}
    training = build_agent(options, task, backend, greedy=False, validation=None, **common)
    training.evaluator.temperature = temperature
    rollouts = AgentRollouts(training.evaluator)
    conversations = [merge_system(e.prompt) for e in task.train]
    if training.evaluator.environment is not None:  # each row shows its episode's first turn
        conversations = [started(training.evaluator, e) for e in task.train]
    check_template(rollouts, conversations[0])
    prompts = [rollouts.first_prompt(c) for c in conversations]
    for i, text in enumerate(prompts):
        rollouts.index.setdefault(text, i)
    validation = None
    if problem["validation_every"]:
        checked = build_agent(options, task, backend, greedy=problem["greedy"],
                              validation=validation_options(problem), **common)  # fmt: skip
        validation = checked.validation
    dataset = datasets.Dataset.from_dict(
        {"prompt": prompts, EXAMPLE_COLUMN: list(range(len(prompts)))}
    )
    figures = lambda: {f"agent_{k}": v for k, v in rollouts.figures.items()}  # noqa: E731
    return TrainingInputs(dataset, TrajectoryReward(task), validation, rollouts, figures)
