"""Tokenizers for the remote scoring calls: a local tokenizer folder, or the server's own.

Scoring sends token ids (``batchclient._core.scoring``), so the remote provider needs the
model's tokenizer, from one of two places:

- ``tokenizer=<folder>``: the model's Hugging Face tokenizer files on this machine, loaded with
  ``transformers`` (never fetched from a hub: ``local_files_only``); the model's context length
  comes from the server's ``GET /models`` (vLLM lists ``max_model_len``).
- otherwise the server's ``POST /tokenize`` route (vLLM's, at the server root next to ``/v1``:
  ``{"model", "prompt", "add_special_tokens"} -> {"tokens", "max_model_len"}``), one call per
  distinct text. The BOS/EOS tokens an empty context or a rolling window needs come from
  ``GET /tokenizer_info`` when the server has it (vLLM with
  ``--enable-tokenizer-info-endpoint``).

Neither available: ``ConfigurationError`` naming both.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import anyio
import orjson

from .._core.decode import http_error
from .._core.request import item_error
from .._core.tokens import Tokenizer, TokenizerInfo, local_tokenizer
from .._routing.dispatch import Replica
from ..errors import ConfigurationError, ErrorCode
from ..types import BatchItemError
from ._transport import HttpError, HttpTimeout, ResponseTooLarge

_CONCURRENT_TOKENIZE = 32  # /tokenize calls in flight (each is a few hundred microseconds)

NO_TOKENIZER = (
    "scoring text needs the model's tokenizer: pass tokenizer=<local folder with the model's "
    "tokenizer files> (or --tokenizer), or use a server with a /tokenize route (vLLM); or give "
    "the requests as token ids"
)


class ServerTokenizer(Tokenizer):
    """A server's ``/tokenize`` (and ``/tokenizer_info``) route, for one model."""

    def __init__(self, replica: Replica, model: str, timeout_s: float) -> None:
        self._replica = replica
        self._model = model
        self._timeout_s = timeout_s
        self._limiter = anyio.CapacityLimiter(_CONCURRENT_TOKENIZE)
        self._info: TokenizerInfo | None = None
        self._max_model_len: int | None = None  # from the first answer that states it

    async def _post(self, path: str, body: dict[str, Any]) -> tuple[int, Any]:
        # /tokenize lives next to /v1, not under it
        resp = await self._replica.pool.request(
            "POST", path, orjson.dumps(body), timeout=self._timeout_s, root=True
        )
        try:
            return resp.status, orjson.loads(resp.body)
        except ValueError:
            return resp.status, resp.body

    async def probe(self) -> bool:
        """Whether the route answers (a tiny text, no model named: the server's default)."""
        try:
            status, data = await self._post("/tokenize", {"prompt": "a"})
        except (HttpError, HttpTimeout, ResponseTooLarge):
            return False
        return status == 200 and isinstance(data, dict) and isinstance(data.get("tokens"), list)

    async def _one(self, text: str, add_special_tokens: bool) -> list[int] | BatchItemError:
        body = {"model": self._model, "prompt": text, "add_special_tokens": add_special_tokens}
        async with self._limiter:
            try:
                status, data = await self._post("/tokenize", body)
            except (HttpError, HttpTimeout, ResponseTooLarge) as exc:
                return item_error(ErrorCode.connection_error, f"/tokenize: {exc}")
        if status != 200:
            raw = data if isinstance(data, bytes) else orjson.dumps(data)
            error = http_error(status, raw).error
            assert error is not None
            return error
        tokens = data.get("tokens") if isinstance(data, dict) else None
        if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
            return item_error(
                ErrorCode.bad_upstream_response, f"/tokenize answered without tokens: {data!r}"
            )
        if self._max_model_len is None and isinstance(data.get("max_model_len"), int):
            self._max_model_len = int(data["max_model_len"])
        return list(tokens)

    async def encode(
        self, texts: Sequence[str], *, add_special_tokens: bool = True
    ) -> list[list[int] | BatchItemError]:
        out: list[list[int] | BatchItemError] = [[] for _ in texts]

        async def run(i: int, text: str) -> None:
            out[i] = await self._one(text, add_special_tokens)

        async with anyio.create_task_group() as tg:
            for i, text in enumerate(texts):
                tg.start_soon(run, i, text)
        return out

    async def info(self) -> TokenizerInfo:
        if self._info is not None:
            return self._info
        probe = await self._one("a", True)
        if isinstance(probe, BatchItemError) and probe.code == ErrorCode.model_not_found:
            self._info = TokenizerInfo()  # each request reports the missing model itself
            return self._info
        bos, bos_id, eos_id = await self._special_tokens()
        self._info = TokenizerInfo(
            max_model_len=self._max_model_len,
            bos_token=bos,
            bos_token_id=bos_id,
            eos_token_id=eos_id,
        )
        return self._info

    async def _special_tokens(self) -> tuple[str | None, int | None, int | None]:
        try:
            resp = await self._replica.pool.request(
                "GET", "/tokenizer_info", timeout=self._timeout_s, root=True
            )
            config = orjson.loads(resp.body) if resp.status == 200 else None
        except (HttpError, HttpTimeout, ResponseTooLarge, ValueError):
            config = None
        if not isinstance(config, dict):
            return None, None, None
        bos, eos = _token_text(config.get("bos_token")), _token_text(config.get("eos_token"))
        return bos, await self._single_id(bos), await self._single_id(eos)

    async def _single_id(self, token: str | None) -> int | None:
        if token is None:
            return None
        ids = await self._one(token, False)
        return ids[0] if isinstance(ids, list) and len(ids) == 1 else None


def _token_text(value: Any) -> str | None:
    """A special token from a tokenizer config: a string, or ``{"content": ...}``."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) and value else None


async def find_tokenizer(
    path: str | os.PathLike[str] | None,
    model: str,
    replica: Replica,
    model_entries: list[dict[str, Any]] | None,
    timeout_s: float,
) -> Tokenizer:
    """The tokenizer for ``model``: the local folder ``path`` (its context length from the
    ``GET /models`` entries), else ``replica``'s ``/tokenize`` route. Raises
    ``ConfigurationError`` when neither is available."""
    if path is not None:
        lengths = [e.get("max_model_len") for e in model_entries or () if e.get("id") == model]
        limit = lengths[0] if lengths and isinstance(lengths[0], int) else None
        return await anyio.to_thread.run_sync(local_tokenizer, path, limit)
    server = ServerTokenizer(replica, model, timeout_s)
    if not await server.probe():
        raise ConfigurationError(f"{NO_TOKENIZER} ({replica.base_url} has no /tokenize)")
    return server
