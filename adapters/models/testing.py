"""Tiny random causal LMs and a character tokenizer built in code: tests and demos, no download.

Nothing here touches a model hub, so plugin authors can test LLM code paths anywhere.
"""

from __future__ import annotations

import string
from pathlib import Path
from typing import Any

from .loading import require_transformers

SPECIALS = ["<pad>", "<s>", "</s>", "<unk>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
ARCHITECTURES = ("llama", "qwen2")


def char_tokenizer() -> Any:
    """A character-level fast tokenizer with a ChatML-style chat template."""
    transformers = require_transformers()
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    chars = string.ascii_letters + string.digits + string.punctuation + " \n"
    vocab = {tok: i for i, tok in enumerate(SPECIALS + list(dict.fromkeys(chars)))}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens(SPECIALS)
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="<|im_end|>",
        pad_token="<pad>",
        unk_token="<unk>",
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def tiny_causal_lm(
    arch: str = "llama", vocab_size: int = len(SPECIALS) + 96, seed: int = 0, **overrides: Any
) -> Any:
    """A 2-layer random Llama- or Qwen2-style model (tied embeddings) in eval mode."""
    import torch

    transformers = require_transformers()
    if arch not in ARCHITECTURES:
        raise ValueError(f"arch must be one of {ARCHITECTURES}, got {arch!r}")
    torch.manual_seed(seed)
    config = dict(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        eos_token_id=SPECIALS.index("<|im_end|>"),
        pad_token_id=0,
        bos_token_id=1,
        initializer_range=0.5,  # varied greedy text from a random model
    )
    config.update(overrides)
    cls = {"llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config}[arch]
    return transformers.AutoModelForCausalLM.from_config(cls(**config)).eval()


def save_tiny_lm(
    directory: str | Path, arch: str = "llama", seed: int = 0, **overrides: Any
) -> Path:
    """Save a tiny model and its tokenizer as a local HF folder that ``load_model`` reads."""
    tokenizer = char_tokenizer()
    model = tiny_causal_lm(arch, len(tokenizer), seed, **overrides)
    out = Path(directory)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out
