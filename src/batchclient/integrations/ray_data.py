"""Ray Data: run a ``ray.data.Dataset`` of requests through any batchclient provider, with a
per-row answer or error (never a failed dataset for one bad row).

- :class:`ChatPredictor`: a callable class for ``Dataset.map_batches``. Each row is either a
  conversation (a ``messages`` column: OpenAI chat messages) or an OpenAI batch input line
  (``custom_id``, ``body``, optionally ``method`` and ``url``). The batch runs through the
  provider built by ``provider_factory`` once per Ray Data actor, with the provider's own
  concurrency; each row comes back with its input columns plus :data:`OUTPUT_COLUMNS`.
- :func:`infer`: a ``Dataset`` of requests -> a ``Dataset`` of results through the replicas of
  an open :class:`~batchclient.RayBatchInference` (the Ray Data actors share its engines).

Ray Data LLM's own processor fails the dataset on a row's error by default; with
``should_continue_on_error=True`` it emits the failed row with the error's text in an
``__inference_error__`` column (ray-project/ray PRs #59212 and #60572). Here every row gets
``error_code`` (one of :class:`~batchclient.ErrorCode`) and ``error_message`` without a
setting, so failures can be counted by kind. Guide and example: ``docs/scale-out.md``.
Importing this module does not import Ray.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import anyio
import anyio.from_thread

from .._core.decode import to_response
from .._core.provider import Provider
from .._core.request import Request, Result
from .._core.scheduler import run_requests
from ..errors import ErrorCode
from ..jobs._output import request_for
from ..jobs._validate import check_request
from ..types import Endpoint

if TYPE_CHECKING:
    from ..distributed import RayBatchInference, RayProvider

__all__ = ["OUTPUT_COLUMNS", "ChatPredictor", "infer"]

OUTPUT_COLUMNS = (
    "answer",
    "finish_reason",
    "prompt_tokens",
    "completion_tokens",
    "error_code",
    "error_message",
)
"""Columns added to every row: ``answer`` (the assistant's text; None on error),
``finish_reason`` (``stop``, ``length``, ``tool_calls``), ``prompt_tokens`` and
``completion_tokens`` (0 on error), ``error_code`` and ``error_message`` (None on success)."""


class ChatPredictor:
    """A ``Dataset.map_batches`` callable class over a batchclient provider.

    Args:
        provider_factory: builds the provider in each Ray Data actor (a picklable callable:
            e.g. ``functools.partial(RemoteProvider, "http://host:8000/v1")``, or by name,
            ``functools.partial(make_provider, "remote", base_url=...)``); it is started
            once and stopped when the actor exits.
        model: the model conversations are sent to (rows with ``messages``); batch-line rows
            name their own in ``body.model``.
        sampling: OpenAI body fields added to every conversation (``max_tokens``,
            ``temperature``, ...); a batch line's own body is sent as is.
        messages_column: the column holding conversations (default ``messages``).

    Each call takes a batch in any of Ray Data's formats (``pyarrow``, ``pandas``, ``numpy``)
    and returns ``pyarrow`` rows: the input columns plus :data:`OUTPUT_COLUMNS`, in input order.
    A row whose conversation or batch line is malformed gets ``invalid_request`` (or the batch
    validator's code) without being sent.
    """

    def __init__(
        self,
        provider_factory: Callable[[], Provider],
        *,
        model: str | None = None,
        sampling: Mapping[str, Any] | None = None,
        messages_column: str = "messages",
    ) -> None:
        self.model = model
        self.sampling = dict(sampling or {})
        self.messages_column = messages_column
        self._portal_cm: Any = anyio.from_thread.start_blocking_portal()
        self._portal = self._portal_cm.__enter__()
        self._provider = provider_factory()
        self._portal.call(self._provider.start)
        self._seq = itertools.count()

    def __call__(self, batch: Any) -> Any:
        import pyarrow as pa

        rows = _rows(batch)
        out = self._portal.call(self.run_rows, rows)
        return pa.Table.from_pylist(out)

    async def run_rows(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Run plain rows (dicts) and return them with :data:`OUTPUT_COLUMNS` added."""
        outputs: list[dict[str, Any] | None] = [None] * len(rows)
        requests: list[tuple[int, Request]] = []
        for position, row in enumerate(rows):
            request, problem = self._request(row)
            if problem is not None:
                outputs[position] = {**row, **_error_columns(*problem)}
            else:
                assert request is not None
                requests.append((position, request))
        where = {id(request): position for position, request in requests}

        def on_result(request: Request, result: Result) -> None:
            position = where[id(request)]
            outputs[position] = {**rows[position], **_answer_columns(request, result)}

        await run_requests(
            self._provider.execute,
            (request for _, request in requests),
            max_in_flight=self._provider.max_in_flight(),
            on_result=on_result,
        )
        return [o if o is not None else {**r, **_error_columns("internal_error", "no result")}
                for o, r in zip(outputs, rows, strict=True)]  # fmt: skip

    def _request(self, row: Mapping[str, Any]) -> tuple[Request | None, tuple[str, str] | None]:
        seq = next(self._seq)
        if "body" in row and self.messages_column not in row:
            line = {"method": "POST", "url": Endpoint.chat_completions.value, **row}
            custom_id = line.get("custom_id") or f"row-{seq}"
            line["custom_id"] = custom_id
            body = _plain(line.get("body"))
            if isinstance(body, str):  # a JSON string column
                try:
                    body = json.loads(body)
                except ValueError:
                    return None, (ErrorCode.invalid_request.value, "body is not JSON")
            line["body"] = body
            problem = check_request(line, Endpoint.chat_completions)
            if problem is not None:
                code, message, _param = problem
                return None, (code.value, message)
            return request_for(seq, str(custom_id), body), None
        messages = _plain(row.get(self.messages_column))
        if isinstance(messages, str):
            try:
                messages = json.loads(messages)
            except ValueError:
                messages = None
        if (
            not isinstance(messages, list)
            or not messages
            or not all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages)
        ):
            return None, (
                ErrorCode.invalid_request.value,
                f"{self.messages_column} must be a non-empty list of messages with a role",
            )
        if self.model is None:
            return None, (ErrorCode.invalid_request.value, "ChatPredictor has no model")
        body = {"model": self.model, "messages": messages, **self.sampling}
        custom_id = row.get("custom_id")
        return request_for(seq, str(custom_id) if custom_id else f"row-{seq}", body), None

    def __del__(self) -> None:
        portal_cm = getattr(self, "_portal_cm", None)
        if portal_cm is None:
            return
        self._portal_cm = None
        try:
            self._portal.call(self._provider.stop)
        finally:
            portal_cm.__exit__(None, None, None)


def _rows(batch: Any) -> list[dict[str, Any]]:
    """A Ray Data batch (``pyarrow.Table``, ``pandas.DataFrame`` or dict of columns) as plain
    Python rows."""
    if hasattr(batch, "to_pylist"):  # pyarrow
        return [dict(r) for r in batch.to_pylist()]
    if hasattr(batch, "to_dict") and hasattr(batch, "columns"):  # pandas
        return [{k: _plain(v) for k, v in r.items()} for r in batch.to_dict("records")]
    columns = {k: list(v) for k, v in dict(batch).items()}
    n = len(next(iter(columns.values()), []))
    return [{k: _plain(v[i]) for k, v in columns.items()} for i in range(n)]


def _plain(value: Any) -> Any:
    """NumPy arrays and scalars (how pandas and numpy batches hold nested values) as plain
    lists and Python values; ``None`` fields dropped from objects (Arrow fills absent struct
    fields with nulls, which a message must not carry)."""
    if hasattr(value, "tolist") and not isinstance(value, str | bytes):
        value = value.tolist()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items() if v is not None}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def _error_columns(code: str, message: str) -> dict[str, Any]:
    return {
        "answer": None,
        "finish_reason": None,
        "prompt_tokens": 0,
        "completion_tokens": 0,
        "error_code": code,
        "error_message": message,
    }


def _answer_columns(request: Request, result: Result) -> dict[str, Any]:
    response = to_response(request, result)
    if response.error is not None:
        return _error_columns(response.error.code, response.error.message)
    body = result.body or {}
    usage = body.get("usage") or {}
    choice = (body.get("choices") or [{}])[0]
    return {
        "answer": response.text,
        "finish_reason": choice.get("finish_reason"),
        "prompt_tokens": int(usage.get("prompt_tokens") or 0),
        "completion_tokens": int(usage.get("completion_tokens") or 0),
        "error_code": None,
        "error_message": None,
    }


def infer(
    dataset: Any,
    client: RayBatchInference | RayProvider,
    *,
    model: str | None = None,
    sampling: Mapping[str, Any] | None = None,
    batch_size: int = 256,
    concurrency: int = 1,
    messages_column: str = "messages",
) -> Any:
    """``dataset`` (rows of conversations or OpenAI batch lines) -> a ``Dataset`` of results,
    run on the replicas of ``client`` (an open ``RayBatchInference`` or its provider). Lazy, as
    Ray Data is: consume it (``take_all``, ``write_json``, ...) while ``client`` is open.

    ``concurrency`` Ray Data actors (default 1, each holding no CPU) send ``batch_size`` rows at
    a time to the replicas, each routing to the least-loaded one; a replica that dies mid-batch
    is ejected and its rows are sent again to the others. ``model`` defaults to the replicas'
    served model name.
    """
    from ..distributed import RayBatchInference

    provider = client.provider if isinstance(client, RayBatchInference) else client
    return dataset.map_batches(
        ChatPredictor,
        fn_constructor_args=(provider.attached,),
        fn_constructor_kwargs={
            "model": model or provider.served_name(),
            "sampling": dict(sampling or {}),
            "messages_column": messages_column,
        },
        batch_size=batch_size,
        batch_format="pyarrow",
        concurrency=concurrency,
        num_cpus=0,
    )
