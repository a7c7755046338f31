"""Agent-trajectory memory measurements, one per subprocess: plain inference and an ES step over
multi-turn trajectories, and one full-parameter GRPO and one LoRA-GRPO step on the same
trajectories.

A trajectory is built as the agent loop builds it (``esbox.adapters.agents.loop``): a chat
prompt, then ``turns`` turns, each a fresh ``generate`` over the whole conversation so far
(the KV cache lives for one call) that writes ``reply_tokens`` greedy tokens, followed by a
tool result of filler tokens sized so that the trajectory ends at exactly ``tokens`` tokens.
The parent (:mod:`benchmarks.agent_memory`) runs
``python -m benchmarks.agent_memory_children --child '<json>'``; the spec names the child
(``kind``: inference, es, grpo, lora, trl_grpo or trl_lora) and carries the suite's options.

``trl_grpo`` and ``trl_lora`` run TRL's own ``GRPOTrainer`` (peft for LoRA) on the same
trajectories, handed to it by a ``rollout_func`` with the replies masked in: two optimizer steps,
the peak measured over the second, a steady-state one, as the hand-written steps measure theirs.
"""

from __future__ import annotations

import argparse
import copy
import time
from pathlib import Path
from typing import Any

from benchmarks import measure

METHODS = ("inference", "es", "grpo", "lora", "trl_grpo", "trl_lora")
LORA_RANK, LORA_ALPHA, KL_BETA = 16, 32, 0.04
QUESTION = "What is 4821 * 377 + 12.5% of 9600? Use the calculator tool."
FILLER = " result: 1817517 + 1200 = 1818717, checked twice." * 40


# -- shared set-up ---------------------------------------------------------------------------
def setup(args: argparse.Namespace) -> dict[str, Any]:
    """The model (fp32, resident in anonymous memory), tokenizer and the trajectory's parts."""
    import torch

    torch.set_num_threads(args.threads)
    from esbox.adapters.models import load_model

    runtime = measure.settle()  # interpreter + torch + transformers, no model yet
    model, tokenizer = load_model(Path(args.model).expanduser(), dtype="float32")
    with torch.no_grad():  # the weights resident, as after loading onto a device
        for param in model.parameters():
            param.data = param.data.clone()
    messages = [
        {"role": "system", "content": "You are a careful agent with a calculator tool."},
        {"role": "user", "content": QUESTION},
    ]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    prompt = tokenizer(text, add_special_tokens=False)["input_ids"]
    filler = tokenizer(FILLER, add_special_tokens=False)["input_ids"]
    return {
        "torch": torch,
        "model": model,
        "tokenizer": tokenizer,
        "prompt": prompt,
        "layout": layout(len(prompt), args.tokens, args.turns, args.reply_tokens),
        "filler": filler,
        "runtime": runtime,
    }


def layout(prompt: int, tokens: int, turns: int, reply: int) -> dict[str, Any]:
    """Token counts: the prompt's extra filler (one turn only) and each tool result."""
    extra = tokens - prompt - turns * reply
    if extra < 0:
        raise ValueError(
            f"{tokens} tokens cannot hold a {prompt}-token prompt and {turns} x {reply} replies"
        )
    if turns == 1:  # a single turn: the whole length is the prompt (retrieved text) + reply
        return {"prompt": prompt, "prompt_extra": extra, "tools": []}
    tools = [extra // (turns - 1)] * (turns - 1)
    tools[-1] += extra - sum(tools)
    return {"prompt": prompt, "prompt_extra": 0, "tools": tools}


def filler_ids(env: dict[str, Any], n: int) -> list[int]:
    base = env["filler"]
    return (base * (n // len(base) + 1))[:n]


def rollout(env: dict[str, Any], batch: int, reply: int) -> dict[str, Any]:
    """``batch`` trajectories turn by turn, the agent loop's way: each turn a fresh generate
    over the whole conversation, then the tool result appended."""
    torch, model = env["torch"], env["model"]
    lay = env["layout"]
    row = env["prompt"] + filler_ids(env, lay["prompt_extra"])
    history = torch.tensor([row] * batch)
    start, prefills = time.perf_counter(), []
    for turn in range(len(lay["tools"]) + 1):
        prefills.append(history.shape[1])
        with torch.inference_mode():
            out = model.generate(
                input_ids=history,
                attention_mask=torch.ones_like(history),
                max_new_tokens=reply,
                min_new_tokens=reply,
                do_sample=False,
                pad_token_id=env["tokenizer"].pad_token_id,
            )
        history = out
        if turn < len(lay["tools"]):
            tool = torch.tensor([filler_ids(env, lay["tools"][turn])] * batch)
            history = torch.cat([history, tool], dim=1)
    return {
        "tokens": int(history.shape[1]),
        "prefills": prefills,
        "seconds": time.perf_counter() - start,
    }


def trajectory_ids(env: dict[str, Any], batch: int, reply: int) -> tuple[Any, Any]:
    """The same trajectories as token ids (filler replies: memory does not depend on the
    values), and the mask of the reply tokens, which the policy-gradient loss covers."""
    torch, lay = env["torch"], env["layout"]
    ids = env["prompt"] + filler_ids(env, lay["prompt_extra"])
    mask = [0] * len(ids)
    for tool in [*lay["tools"], 0]:  # each turn: the reply, then its tool result
        ids += filler_ids(env, reply) + filler_ids(env, tool)
        mask += [1] * reply + [0] * tool
    return torch.tensor([ids] * batch), torch.tensor([mask] * batch, dtype=torch.float32)


# -- the GRPO loss -----------------------------------------------------------------------------
def token_logps(torch: Any, logits: Any, ids: Any) -> Any:
    """Log-probability of each next token, row by row as TRL's ``selective_log_softmax`` does
    (no second vocabulary-sized tensor kept for backward)."""
    picked = logits[:, :-1].gather(-1, ids[:, 1:, None]).squeeze(-1)
    norm = torch.stack([torch.logsumexp(row, dim=-1) for row in logits[:, :-1]])
    return picked - norm


def grpo_step(torch: Any, policy: Any, reference: Any, optimizer: Any, ids: Any, mask: Any,
              lora: bool) -> dict[str, Any]:  # fmt: skip
    """One GRPO update on the trajectories: reference log-probs (no grad), the policy's with
    grad, the ratio loss with the k3 KL term on the reply tokens, backward, AdamW."""
    mask = mask[:, 1:]
    advantages = torch.linspace(-1.0, 1.0, ids.shape[0])[:, None]  # a standardized group
    start = time.perf_counter()
    with torch.no_grad():
        if lora:
            set_lora(policy, enabled=False)  # the reference is the base model
        ref = token_logps(torch, reference(input_ids=ids).logits, ids)
        if lora:
            set_lora(policy, enabled=True)
    logps = token_logps(torch, policy(input_ids=ids).logits, ids)
    ratio = torch.exp(logps - logps.detach())
    delta = ref - logps
    kl = torch.exp(delta) - delta - 1
    loss = -(((ratio * advantages) - KL_BETA * kl) * mask).sum() / mask.sum()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return {"seconds": time.perf_counter() - start, "tokens": int(ids.numel())}


def add_lora(torch: Any, model: Any, targets: tuple[str, ...]) -> list[Any]:
    """Rank-``LORA_RANK`` fp32 adapters on every target linear (PEFT's layout, B = 0)."""
    nn = torch.nn

    class LoRALinear(nn.Module):
        def __init__(self, base: Any) -> None:
            super().__init__()
            self.base, self.enabled = base, True
            self.lora_a = nn.Parameter(torch.randn(LORA_RANK, base.in_features) * 0.01)
            self.lora_b = nn.Parameter(torch.zeros(base.out_features, LORA_RANK))

        def forward(self, x: Any) -> Any:
            out = self.base(x)
            if not self.enabled:
                return out
            return out + (x @ self.lora_a.t() @ self.lora_b.t()) * (LORA_ALPHA / LORA_RANK)

    for module in list(model.modules()):
        for name, linear in list(module.named_children()):
            if name in targets and isinstance(linear, nn.Linear):
                setattr(module, name, LoRALinear(linear))
    return [p for n, p in model.named_parameters() if "lora_" in n]


def set_lora(model: Any, enabled: bool) -> None:
    for module in model.modules():
        if hasattr(module, "lora_a"):
            module.enabled = enabled


# -- one child -------------------------------------------------------------------------------
def child(args: argparse.Namespace) -> dict[str, Any]:
    env = setup(args)
    torch, model = env["torch"], env["model"]
    out: dict[str, Any] = {"runtime": env["runtime"], "layout": env["layout"]}
    if args.child == "grpo":
        reference = copy.deepcopy(model)  # the frozen KL reference, a full copy
        model.train()
        model.requires_grad_(True)
        params = list(model.parameters())
    elif args.child == "lora":
        from esbox.adapters.models.shapes import LORA_TARGETS

        reference = model
        params = add_lora(torch, model, LORA_TARGETS)
        model.train()
        out["lora_parameters"] = sum(p.numel() for p in params)
    if args.child in ("grpo", "lora"):
        optimizer = torch.optim.AdamW(params, lr=1e-6)
        ids, mask = trajectory_ids(env, args.batch, args.reply_tokens)
        lora = args.child == "lora"
        # a warm-up step on 16 tokens allocates AdamW's moments, as every step after the first
        # of a run has them: the measured step is a steady-state one
        grpo_step(torch, model, reference, optimizer, ids[:, :16], mask[:, :16], lora)
        out["adam"] = (
            sum(
                v.numel() * v.element_size()
                for state in optimizer.state.values()
                for v in state.values()
                if torch.is_tensor(v) and v.dim()
            )
            / measure.MIB
        )
    out["baseline"] = measure.settle()
    out["reset"] = measure.reset_peak()
    if args.child == "inference":
        out["rollout"] = rollout(env, args.batch, args.reply_tokens)
    elif args.child == "es":
        import esbox
        from esbox.adapters.models.space import TorchModuleSpace

        space = TorchModuleSpace(model)  # generator noise, 2^20-element chunks
        strat = esbox.make_strategy("openai_es", space, seed=0, population=4, sigma=2e-3,
                                    learning_rate=2e-3)  # fmt: skip
        members = strat.ask()
        with space.sweep(members[:1]) as sweep:  # every member peaks alike; one is enough
            rollouts = [rollout(env, args.batch, args.reply_tokens) for _ in sweep]
        out["rollout"] = rollouts[0]
        space.apply(strat.tell([float(i % 3) for i in range(len(members))]))
        out["chunk"] = max(c.numel for c in space.chunks)
    else:
        out["step"] = grpo_step(torch, model, reference, optimizer, ids, mask, lora)
    out["peak"] = measure.peak_mib()
    return out


def trl_child(args: argparse.Namespace) -> dict[str, Any]:
    """Two steps of TRL's GRPOTrainer on the trajectories (a group of at least 2, TRL's least);
    the peak over the second, above the RSS after the first (model, reference, AdamW)."""
    import tempfile

    import datasets
    import trl
    from transformers import TrainerCallback

    from esbox.adapters.rl.agent import completion_logprobs

    env = setup(args)
    torch, tokenizer = env["torch"], env["tokenizer"]
    rows = max(2, args.batch)
    ids, mask = trajectory_ids(env, rows, args.reply_tokens)
    cut = len(env["prompt"]) + env["layout"]["prompt_extra"]
    prompt, completion = ids[0, :cut].tolist(), ids[0, cut:].tolist()
    reply_mask = mask[0, cut:].int().tolist()
    out: dict[str, Any] = {"runtime": env["runtime"], "layout": env["layout"], "rows": rows}

    def rollout(prompts: list[Any], trainer: Any) -> dict[str, Any]:
        n = len(prompts)
        logps = completion_logprobs(trainer.model, [prompt], [completion], 1.0)
        return {"prompt_ids": [prompt] * n, "completion_ids": [completion] * n,
                "logprobs": logps * n, "env_mask": [reply_mask] * n}  # fmt: skip

    class Measure(TrainerCallback):
        def on_step_begin(self, targs: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if state.global_step == 1:  # after the warm-up step: AdamW's moments exist
                optimizer = kwargs["optimizer"]
                out["adam"] = sum(v.numel() * v.element_size() for st in optimizer.state.values()
                                  for v in st.values() if torch.is_tensor(v) and v.dim()
                                  ) / measure.MIB  # fmt: skip
                out["baseline"], out["reset"] = measure.settle(), measure.reset_peak()
                out["started"] = time.perf_counter()

        def on_step_end(self, targs: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if state.global_step == 2:
                out["peak"] = measure.peak_mib()
                out["step"] = {"seconds": time.perf_counter() - out.pop("started"),
                               "tokens": rows * len(prompt + completion)}  # fmt: skip

    lora = None
    if args.child == "trl_grpo":
        env["model"].requires_grad_(True)  # load_model freezes the weights, as ES needs
    if args.child == "trl_lora":
        from peft import LoraConfig

        from esbox.adapters.models.shapes import LORA_TARGETS

        lora = LoraConfig(r=LORA_RANK, lora_alpha=LORA_ALPHA, lora_dropout=0.0,
                          target_modules=list(LORA_TARGETS))  # fmt: skip
    with tempfile.TemporaryDirectory() as folder:
        config = trl.GRPOConfig(
            output_dir=folder, per_device_train_batch_size=rows, num_generations=rows,
            max_completion_length=len(completion), max_steps=2, beta=KL_BETA, learning_rate=1e-6,
            lr_scheduler_type="constant", bf16=False, fp16=False, use_cpu=True,
            gradient_checkpointing=False, save_strategy="no", report_to="none",
            logging_steps=1, disable_tqdm=True, seed=0,
        )  # fmt: skip
        text = tokenizer.decode(prompt)
        trainer = trl.GRPOTrainer(
            model=env["model"], args=config, processing_class=tokenizer,
            reward_funcs=[lambda completions, **_: [float(i % 2) for i in range(len(completions))]],
            train_dataset=datasets.Dataset.from_dict({"prompt": [text] * (4 * rows)}),
            rollout_func=rollout, peft_config=lora, callbacks=[Measure()],
        )  # fmt: skip
        trainer.train()
    if lora is not None:
        out["lora_parameters"] = sum(
            p.numel() for p in trainer.model.parameters() if p.requires_grad
        )
    return out


def serve(spec: dict[str, Any]) -> dict[str, Any]:
    """Run the child ``spec["kind"]`` with the suite's options in the rest of the spec."""
    spec = dict(spec)
    args = argparse.Namespace(child=spec.pop("kind"), **spec)
    if args.child not in METHODS:
        raise ValueError(f"unknown agent-memory child {args.child!r}")
    return trl_child(args) if args.child.startswith("trl_") else child(args)


if __name__ == "__main__":
    raise SystemExit(measure.serve_child(serve))
