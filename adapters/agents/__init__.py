"""Agents: the multi-turn tool loop, tools, the tool-call protocol and the code sandbox; may import
the core, ``tasks``, ``generation`` and ``models``."""
