"""The inline provider: a vLLM engine driven in-process (see :class:`VLLMBatchInference`)."""

from ._client import VLLMBatchInference, VLLMProvider

__all__ = ["VLLMBatchInference", "VLLMProvider"]
