"""Generation: the backend interface, the transformers backend and the vLLM driver and worker;
may import ``models`` and the core. The vLLM modules import vLLM only when used."""

from .backend import GenerationBackend, Prompt, TemplatedPrompts
from .hf import HFBackend

__all__ = ["GenerationBackend", "HFBackend", "Prompt", "TemplatedPrompts"]
