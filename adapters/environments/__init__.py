"""Environments: stateful objects an agent plays a trajectory against (``reset``, ``step``,
``reward``; TRL's ``environment_factory`` convention), and TextArena's single-player games
behind that contract; imports only the core (``tasks`` and ``agents`` import it)."""

from .base import Environment, environment_reward, is_text_driven, tool_methods

__all__ = ["Environment", "environment_reward", "is_text_driven", "tool_methods"]
