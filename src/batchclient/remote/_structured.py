"""What the remote provider adds for structured output and tools before a body is sent.

- **Grammars** travel in vLLM's own request field (``structured_outputs: {"grammar": ...}``),
  which other OpenAI-compatible servers ignore or refuse. Ignoring it would return an
  unconstrained answer as if it were constrained (crmne/ruby_llm #894), so a body with
  ``structured_outputs`` is only sent when every replica is a vLLM server; otherwise the item
  is refused with ``unsupported_parameter`` naming ``response_format``.
- **How a replica is known to be vLLM**: ``GET {base_url}/models``, whose entries vLLM's
  server marks ``"owned_by": "vllm"`` (``vllm/entrypoints/openai/models/serving.py``), asked
  once per replica and cached for the client's life (``/models`` is the route every
  OpenAI-compatible server has). A replica that cannot be reached is asked again next time,
  not cached, and the item is sent (its own request then fails or succeeds on its merits).
"""

from __future__ import annotations

from collections.abc import Sequence

import anyio

from .._core.decode import load_json
from .._core.request import Result, failed
from .._routing.dispatch import Replica
from ..errors import ErrorCode
from ._transport import HttpError, HttpTimeout, ResponseTooLarge


class VllmProbe:
    """Whether replicas are vLLM servers, asked once per replica (see the module doc)."""

    def __init__(self, timeout_s: float = 10.0) -> None:
        self._timeout_s = timeout_s
        self._known: dict[str, bool] = {}
        self._lock = anyio.Lock()

    async def is_vllm(self, replica: Replica) -> bool | None:
        """True/False once known; None when the replica could not be asked (not cached)."""
        if replica.base_url in self._known:
            return self._known[replica.base_url]
        async with self._lock:  # one probe per replica, however many items wait on it
            if replica.base_url in self._known:
                return self._known[replica.base_url]
            try:
                resp = await replica.pool.request("GET", "/models", timeout=self._timeout_s)
            except (HttpError, HttpTimeout, ResponseTooLarge):
                return None
            verdict = resp.status == 200 and _owned_by_vllm(resp.body)
            self._known[replica.base_url] = verdict
            return verdict

    async def grammar_refusal(self, replicas: Sequence[Replica]) -> Result | None:
        """None when every replica is (or may be) vLLM; else the item's refusal."""
        others = []
        for replica in replicas:
            if await self.is_vllm(replica) is False:
                others.append(replica.base_url)
        if not others:
            return None
        return failed(
            ErrorCode.unsupported_parameter,
            "response_format: a grammar needs a vLLM server (sent as its structured_outputs "
            f"field), and {', '.join(others)} is not one (GET /models has no entry owned by "
            "vllm); use a JSON schema instead",
            status_code=400,
            param="response_format",
        )


def _owned_by_vllm(raw: bytes | bytearray) -> bool:
    try:
        data = load_json(raw)
    except ValueError:
        return False
    entries = data.get("data") if isinstance(data, dict) else None
    return isinstance(entries, list) and any(
        isinstance(e, dict) and e.get("owned_by") == "vllm" for e in entries
    )
