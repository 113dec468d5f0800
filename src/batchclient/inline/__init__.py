"""The inline provider: a vLLM engine driven in-process (see :class:`VLLMBatchInference`)."""

from ._client import OUTPUT_ENGINE_ARGS, VLLMBatchInference, VLLMProvider
from ._options import VLLMOptions

__all__ = ["OUTPUT_ENGINE_ARGS", "VLLMBatchInference", "VLLMOptions", "VLLMProvider"]
