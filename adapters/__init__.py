"""Adapters: what the core plugs into (benchmark functions, torch/LLM weight spaces, tasks, backends)."""
