"""The inline provider: a vLLM engine driven in-process (see :class:`VLLMBatchInference`)."""

from ._client import OUTPUT_ENGINE_ARGS, VLLMBatchInference, VLLMProvider
from ._options import SINGLE_TOKEN_SCORING, TOOL_CALL_PARSER, VLLMOptions

__all__ = [
    "OUTPUT_ENGINE_ARGS",
    "SINGLE_TOKEN_SCORING",
    "TOOL_CALL_PARSER",
    "VLLMBatchInference",
    "VLLMOptions",
    "VLLMProvider",
]
