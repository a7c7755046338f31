"""Built-in strategies; importing this package registers them."""

from esbox.strategies import copes, esopt, openai_es

__all__ = ["copes", "esopt", "openai_es"]
