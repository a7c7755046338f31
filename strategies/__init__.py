"""Built-in strategies; importing this package registers them."""

from esbox.strategies import copes, esopt, nevergrad, openai_es, snes

__all__ = ["copes", "esopt", "nevergrad", "openai_es", "snes"]
