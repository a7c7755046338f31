"""Adapters: what the core plugs into (functions, torch/LLM weight spaces, tasks, backends)."""
