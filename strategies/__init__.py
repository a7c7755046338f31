"""Built-in strategies; importing this package registers them."""

from esbox.strategies import copes, esopt, nevergrad, openai_es, pycma, snes

__all__ = ["copes", "esopt", "nevergrad", "openai_es", "pycma", "snes"]
