"""Interactive traffic next to the batches: ``GET /v1/models`` and one request at a time
through the same provider (``POST /v1/chat/completions`` and ``/v1/responses``, and
``/v1/completions`` / ``/v1/embeddings`` when the provider serves them), so its limits (the
remote provider's in-flight limit and rpm/tpm, the engine's ``max_concurrency``) cover both
kinds of traffic.

A request is checked as a batch line would be (same codes), answered whole (``stream`` is
refused), and cancelled in the provider when the client hangs up. The provider's answer goes
back as it came: a ``ChatCompletion`` with its status, or its refusal in OpenAI's envelope;
a request refused with no HTTP answer of its own (a batch provider's per-request error)
is 400 (404 for an unknown model); one that got no answer is 502 (connection), 503 (no
replica in service), 504 (timeout) or 500.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from .._core.flows import interactive
from .._core.request import Request as ProviderRequest
from .._core.request import Result, error_type, failed
from .._core.responses import over_chat
from ..errors import ErrorCode
from ..jobs._validate import check_request
from ..types import Endpoint
from ._body import read_json
from ._errors import APIError, clip, envelope, error_response
from ._middleware import tenant_of

router = APIRouter()
T = TypeVar("T")

_NO_ANSWER_STATUS = {
    # a request refused without an HTTP answer of its own (a batch provider's per-request
    # error, a translation's refusal) is still the client's fault: OpenAI's 400 / 404
    ErrorCode.invalid_request.value: 400,
    ErrorCode.context_length_exceeded.value: 400,
    ErrorCode.unsupported_parameter.value: 400,
    ErrorCode.model_not_found.value: 404,
    ErrorCode.timeout.value: 504,
    ErrorCode.connection_error.value: 502,
    ErrorCode.bad_upstream_response.value: 502,
    ErrorCode.endpoint_unavailable.value: 503,
    ErrorCode.rate_limited.value: 429,
    ErrorCode.server_error.value: 502,
}


@router.get("/v1/models")
async def list_models(request: Request) -> JSONResponse:
    names = await tenant_of(request).client.provider.models()
    return JSONResponse({"object": "list", "data": [_model(request, n) for n in names]})


@router.get("/v1/models/{model:path}")
async def retrieve_model(request: Request, model: str) -> JSONResponse:
    if model not in await tenant_of(request).client.provider.models():
        raise APIError(
            404,
            f"The model {clip(model)} is not served here",
            param="model",
            code="model_not_found",
        )
    return JSONResponse(_model(request, model))


def _model(request: Request, name: str) -> dict[str, Any]:
    """``openai.types.Model``; ``created`` is when this server started."""
    return {
        "id": name,
        "object": "model",
        "created": request.app.state.started_at,
        "owned_by": "batchclient",
    }


async def _one_request(request: Request, endpoint: Endpoint) -> JSONResponse:
    # a provider that serves chat answers /v1/responses too (translated both ways)
    provider = over_chat(tenant_of(request).client.provider)
    if endpoint not in provider.endpoints:
        raise APIError(404, f"{endpoint.value} is not served by this server's provider")
    body = await read_json(request)
    if body.get("stream") not in (None, False):
        raise APIError(
            400,
            "stream is not supported by this server: send stream=false (answers come back whole)",
            param="stream",
            code=ErrorCode.unsupported_parameter.value,
        )
    line = {"custom_id": "request", "method": "POST", "url": endpoint.value, "body": body}
    problem = check_request(line, endpoint.value)
    if problem is not None:
        code, message, param = problem
        raise APIError(400, message, param=param.removeprefix("body."), code=code.value)
    await provider.check_model(body["model"])  # ModelNotFoundError: 404
    item = ProviderRequest(index=0, body=body, endpoint=endpoint)

    async def execute() -> Result:
        try:
            with interactive():  # ahead of batch lines at the fair gate
                return await provider.execute(item)
        except Exception as exc:  # a provider bug: this request's 500, not the server's
            return failed(ErrorCode.internal_error, f"{type(exc).__name__}: {exc}")

    return result_response(await until_disconnect(request, execute))


def _endpoint_route(endpoint: Endpoint) -> None:
    async def handler(request: Request) -> JSONResponse:
        return await _one_request(request, endpoint)

    handler.__name__ = "create_" + endpoint.value.rsplit("/", 1)[-1]
    router.add_api_route(endpoint.value, handler, methods=["POST"])


for _endpoint in Endpoint:
    _endpoint_route(_endpoint)


def result_response(result: Result) -> JSONResponse:
    """The HTTP answer for a provider's result (see the module docstring)."""
    if result.error is None and result.status_code is not None and result.body is not None:
        return JSONResponse(result.body, status_code=result.status_code)
    error = result.error
    status = result.status_code
    if status is not None and status >= 400 and isinstance(result.body, dict):
        # the upstream's body as it came (kept as is in results): any shape, made an envelope
        upstream = result.body.get("error")
        if not isinstance(upstream, dict):
            upstream = {"message": error.message if error is not None else f"HTTP {status}"}
        if status in (401, 403):  # the upstream refused *our* key: not the client's fault
            message = f"the upstream refused this server's credentials: {upstream.get('message')}"
            return error_response(502, message, type="server_error", code="upstream_auth")
        fields = {k: upstream.get(k) for k in ("message", "type", "param", "code")}
        fields["message"] = fields["message"] or (error.message if error else f"HTTP {status}")
        return JSONResponse({"error": fields}, status_code=status)
    code = error.code if error is not None else ErrorCode.internal_error.value
    message = error.message if error is not None else "no answer"
    try:
        kind = error_type(ErrorCode(code))
    except ValueError:  # an upstream's own code
        kind = "server_error"
    param = error.param if error is not None else None
    return JSONResponse(
        envelope(message, type=kind, param=param, code=code),
        status_code=_NO_ANSWER_STATUS.get(code, 500),
    )


async def until_disconnect(request: Request, work: Callable[[], Awaitable[T]]) -> T:
    """Run ``work`` (after the body was read); cancel it when the client disconnects, which
    closes the upstream request or aborts the engine request. A gone client gets nothing:
    ``APIError`` 499 (nginx's "client closed request") is raised for the log line."""
    results: list[T] = []
    failures: list[Exception] = []
    async with anyio.create_task_group() as tg:

        async def watch() -> None:
            while (await request.receive())["type"] != "http.disconnect":
                pass
            tg.cancel_scope.cancel()

        async def run() -> None:
            try:
                results.append(await work())
            except Exception as exc:  # raised below, as itself (not in an exception group)
                failures.append(exc)
            tg.cancel_scope.cancel()

        tg.start_soon(watch)
        tg.start_soon(run)
    if failures:
        raise failures[0]
    if not results:
        raise APIError(499, "the client closed the connection before the answer")
    return results[0]
