"""The remote fan-out provider: any OpenAI-compatible ``/v1/chat/completions`` endpoint."""

from ._client import RemoteBatchInference

__all__ = ["RemoteBatchInference"]
