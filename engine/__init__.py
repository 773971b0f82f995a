"""nib's decoder: one Llama-family model, a static KV cache and a decode loop.

The engine imports torch and never grpc; it speaks dataclasses and tensors.
"""

from nib.engine.config import ModelConfig
from nib.engine.request import FinishReason, GenerationParams

__all__ = ["FinishReason", "GenerationParams", "ModelConfig"]
