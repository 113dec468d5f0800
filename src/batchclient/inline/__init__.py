"""The inline provider: a vLLM engine driven in-process (see :class:`VLLMBatchInference`)."""

from ._client import VLLMBatchInference, VLLMProvider
from ._options import VLLMOptions

__all__ = [
    "VLLMBatchInference",
    "VLLMOptions",
    "VLLMProvider",
]
