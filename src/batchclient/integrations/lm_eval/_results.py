"""The lm-eval model's durable answers, kept in the result cache (:mod:`batchclient.cache`).

The result cache keys HTTP-like requests; an lm-eval answer is not one: a ``loglikelihood``
score comes from a tokenisation and one scoring request (or a ``/tokenize`` call first), a
rolling one from several windows. So an answer is stored under its own key, the SHA-256 of what
decides it: the kind of request (``loglikelihood``, ``loglikelihood_rolling``,
``generate_until``), which weights answer the model (``Provider.cache_identity``: remote base
URLs and what ``/v1/models`` reports, ``root`` included; inline, the model path and the engine
arguments that change outputs), the model name, the tokenizer the scores were cut with, and the
request's own arguments. It is a cache row like any other (endpoint ``lm-eval/<kind>``, the
model, status 200, body ``{"answer": ...}``), in the state directory's ``batchclient.sqlite3``:
``batchclient cache stats`` counts it and ``batchclient cache clear`` removes it.

A re-run of the same eval finds every answer here and sends nothing; an interrupted one sends
only what is missing. Answers are written in small groups as they arrive (the cache's: at most
32 answers or a quarter second are lost by a crash).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..._state import bind, database_url
from ...cache import ResultCache
from ...jobs._store import DB_NAME

ENDPOINT = "lm-eval/{kind}"
"""The ``endpoint`` column of an lm-eval answer in the result cache."""


def request_key(scope: Any, kind: str, args: Any) -> str:
    """The key of one request: ``scope`` (the weights' identity, model, tokenizer) + kind + args,
    as canonical JSON, hashed."""
    text = json.dumps([scope, kind, args], sort_keys=True, ensure_ascii=False, default=str)
    return "lm-eval:" + hashlib.sha256(text.encode()).hexdigest()


class Answers:
    """lm-eval answers by key in the result cache of ``state_dir``. Thread-safe: looked up from
    lm-eval's thread, written from the client's event loop."""

    def __init__(self, state_dir: Path) -> None:
        url = database_url(None)
        if url is not None:  # the client's shared database, opened before or after this
            bind(state_dir, url)
        self._cache = ResultCache(state_dir / DB_NAME)

    def get_many(self, keys: Sequence[str]) -> dict[str, Any]:
        """The stored answers of those keys that have one."""
        return {k: a.body["answer"] for k, a in self._cache.get_many(keys).items()}

    def put(self, key: str, value: Any, *, kind: str, model: str) -> None:
        """Queue one answer (written with the cache's next group)."""
        body = {"answer": value}
        self._cache.put(
            key, endpoint=ENDPOINT.format(kind=kind), model=model, status_code=200, body=body
        )

    def flush(self) -> None:
        """Write every queued answer."""
        self._cache.flush()

    def close(self) -> None:
        self._cache.close()
