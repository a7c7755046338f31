"""Models: loading and converting HF models, the torch weight space, model shapes and the memory
estimator; may import the core only."""

from .loading import convert_smollm2, load_model
from .memory import estimate_memory
from .shapes import model_shape, parse_context
from .space import MODEL_CHUNK_SIZE, TorchModuleSpace

__all__ = [
    "MODEL_CHUNK_SIZE",
    "TorchModuleSpace",
    "convert_smollm2",
    "estimate_memory",
    "load_model",
    "model_shape",
    "parse_context",
]
