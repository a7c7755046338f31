"""esbox strategies inside nevergrad: ``register()`` adds ``ESBox_<Strategy>`` optimizers to
nevergrad's registry (``optimizer.ESBox`` is the configurable family); may import the core only.
nevergrad is imported here on use (the ``nevergrad`` extra)."""

from __future__ import annotations

from esbox.registry import available_strategies

EXTRA_HINT = "esbox inside nevergrad needs nevergrad: pip install 'esbox[nevergrad]'"


def register() -> list[str]:
    """Add ``ESBox_<class name>`` (``ESBox_CoPES``, ``ESBox_OpenAIES``, ``ESBox_ESOpt``, and one
    per plugin strategy) to ``nevergrad.optimizers.registry``; returns the names. Calling it
    again is harmless; a name nevergrad already holds for something else is a ValueError."""
    try:
        import nevergrad as ng

        from .optimizer import ESBox
    except ImportError as exc:
        raise ImportError(EXTRA_HINT) from exc
    names = []
    for key, cls in available_strategies().items():
        name = f"ESBox_{cls.__name__}"
        held = ng.optimizers.registry.get(name)
        if held is None:
            ng.optimizers.registry.register_name(name, ESBox(strategy=key).set_name(name))
        elif not (isinstance(held, ESBox) and held.config()["strategy"] == key):
            raise ValueError(f"nevergrad's registry already holds {name}: {held!r}")
        names.append(name)
    return names


__all__ = ["register"]
