"""Adapters: what the core plugs into, one subpackage (room) per concern.

``functions`` (benchmark functions), ``models`` (loading, weight spaces, memory), ``generation``
(transformers and vLLM backends), ``tasks`` (data, rewards, rollouts), ``agents`` (tool loop,
tools, sandbox), ``scale`` (Ray) and ``problems`` (the top: what a run config builds). Imports go
one way (docs/architecture.md); ``tests/test_architecture.py`` enforces it.
"""
