"""``VLLMBatchInference``: a vLLM engine (``AsyncLLM``) driven in-process.

Each conversation becomes one engine request; up to ``max_concurrency`` of them are in the
engine at once and the engine batches them (continuous batching), which is where the speed over
one-at-a-time comes from. The request path mirrors vLLM's own OpenAI server: the model's chat
template renders the messages (in vLLM's renderer thread pool, off the event loop), the body's
sampling fields become ``vllm.SamplingParams`` (:mod:`._mapping`), and the finished output
becomes an OpenAI ``ChatCompletion`` body. Only the final output of each request crosses into
Python (``RequestOutputKind.FINAL_ONLY``); time to first token comes from the engine's own
per-request timestamps rather than from streaming every token.
"""

from __future__ import annotations

import itertools
import os
import time
import uuid
from types import ModuleType
from typing import TYPE_CHECKING, Any

import anyio

from .._core.client import BatchClient
from .._core.provider import Provider
from .._core.request import Request, Result, failed
from .._tools import ToolPlan, ToolRefusal, apply_to_body, mentions_tools, plan_tools
from ..errors import (
    BatchClientError,
    ConfigurationError,
    EndpointError,
    ErrorCode,
    ModelNotFoundError,
)
from ..models import BUNDLED_MODEL_NAME, resolve_model
from ._mapping import Plan, Refusal, completion_body, logprobs_content, map_body, resolve_max_tokens

if TYPE_CHECKING:
    from ._engine import Engine

__all__ = ["VLLMBatchInference", "VLLMProvider"]

_INSTALL_HINT = (
    "the inline provider needs vLLM: pip install 'batchclient[vllm]' (GPU) or "
    "'batchclient[cpu]' (CPU)"
)


class VLLMBatchInference(BatchClient):
    """Batch inference on a vLLM engine in this process. Use as ``async with``.

    ``async with`` starts vLLM's ``AsyncLLM`` (its engine core runs in a child process; about
    20-90 s on 2 CPU cores, seconds on a GPU) and on exit shuts it down and waits until every
    engine process has exited. Scripts need an ``if __name__ == "__main__":`` guard because vLLM
    spawns its engine process.

    Args:
        model: a model directory or Hugging Face hub id; None (default) is the bundled
            SmolLM2-135M-Instruct, served as ``smollm2``.
        max_concurrency: requests handed to the engine at once, shared by all calls on this
            client (default 1024). The engine batches them (up to its ``max_num_seqs``) and
            queues the rest; the window keeps a 100k-conversation call from building 100k
            engine requests at once. Below ``max_num_seqs`` it limits the batch size.
        tool_call_parser: the vLLM tool parser that reads calls from answers of a model whose
            chat template renders tools itself (the names of vLLM's ``--tool-call-parser``:
            ``hermes``, ``llama3_json``, ``pythonic``, ...). None (default): tools are written
            into the system prompt in the call's ``tool_prompt_format`` (default ``json``) and
            calls are read back by batchclient, which works for any model, including the
            bundled one (whose template has no tool support). See ``docs/structured.md``.
        state_dir: where files, jobs and results are kept (default ``$BATCHCLIENT_STATE_DIR``
            or the user data directory); jobs there resume with a client on the same model.
        **engine_args: vLLM engine arguments (``vllm.AsyncEngineArgs`` fields), e.g.
            ``max_model_len``, ``dtype``, ``tensor_parallel_size``,
            ``gpu_memory_utilization``, ``kv_cache_memory_bytes``, ``served_model_name``,
            ``max_num_seqs``. Defaults batchclient adds when they are not given: see
            ``docs/inline.md`` (bundled model: ``max_model_len=2048``; CPU builds:
            ``enforce_eager=True`` and a 2 GiB KV cache unless memory is sized otherwise).

    Each call's ``model`` must name the loaded model: ``smollm2`` for the bundled one, else
    its path (as given or resolved) or served name; anything else raises
    ``ModelNotFoundError``. Per-item errors: ``context_length_exceeded`` (prompt, or prompt +
    ``max_tokens``, over ``max_model_len``; HTTP-like status 400), ``invalid_request`` (400,
    vLLM's message, or malformed ``tools``/``tool_choice``), ``unsupported_parameter`` (400, a
    body field the engine cannot honour: ``stream``, ``n`` > 1, unknown fields),
    ``engine_error`` (the engine failed); and the answer checks every provider makes
    (``invalid_tool_call``, ``invalid_structured_output``).

    Raises (on entering ``async with``):
        ConfigurationError: vLLM is not installed, an unknown engine argument, or an unknown
            ``tool_call_parser``.
        EndpointError: the engine failed to start (the message holds vLLM's reason).
    """

    provider: VLLMProvider

    def __init__(
        self,
        model: str | None = None,
        *,
        max_concurrency: int = 1024,
        tool_call_parser: str | None = None,
        state_dir: str | os.PathLike[str] | None = None,
        **engine_args: Any,
    ) -> None:
        provider = VLLMProvider(
            model, max_concurrency=max_concurrency, tool_call_parser=tool_call_parser, **engine_args
        )
        super().__init__(provider, state_dir=state_dir)


class VLLMProvider(Provider):
    """The inline engine as a :class:`~batchclient.Provider` (for ``BatchClient``, the server
    and other providers). Arguments as :class:`VLLMBatchInference`, without ``state_dir``;
    ``start`` builds the engine, ``stop`` shuts it down."""

    def __init__(
        self,
        model: str | None = None,
        *,
        max_concurrency: int = 1024,
        tool_call_parser: str | None = None,
        **engine_args: Any,
    ) -> None:
        if max_concurrency < 1:
            raise ConfigurationError("max_concurrency must be >= 1")
        self.model = model
        self.max_concurrency = max_concurrency
        self.tool_call_parser = tool_call_parser
        self._parser_class: type | None = None
        self.engine_args = dict(engine_args)
        self._limiter = anyio.CapacityLimiter(max_concurrency)
        self._engine: Engine | None = None
        self._vllm: ModuleType | None = None  # the ._engine module, imported on start
        self._names: frozenset[str] = frozenset()
        self._served: list[str] = []  # the served names alone (no paths), for listings
        # Engine request ids: a per-client random prefix and a counter, never anything the
        # caller supplied (two clients or two calls can never collide).
        self._id_prefix = uuid.uuid4().hex[:12]
        self._ids = itertools.count()

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        try:
            from . import _engine
        except ImportError as exc:
            raise ConfigurationError(f"{_INSTALL_HINT} ({exc})") from exc
        engine = _engine.Engine()
        try:
            await anyio.to_thread.run_sync(self._build, _engine, engine)
        except BaseException as exc:
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(_engine.stop, engine)
            if isinstance(exc, Exception) and not isinstance(exc, BatchClientError):
                raise EndpointError(f"the vLLM engine failed to start: {exc}") from exc
            raise
        self._vllm = _engine
        self._engine = engine

    def _build(self, _engine: ModuleType, engine: Engine) -> None:
        """In a worker thread: resolve (and maybe convert) the model, start the engine."""
        unknown = set(self.engine_args) - _engine.ENGINE_ARG_NAMES
        if unknown:
            raise ConfigurationError(f"unknown vLLM engine argument(s): {sorted(unknown)}")
        if self.tool_call_parser is not None:
            try:
                self._parser_class = _engine.tool_parser_class(self.tool_call_parser)
            except KeyError:
                raise ConfigurationError(
                    f"unknown tool_call_parser {self.tool_call_parser!r}"
                ) from None
        served, ref = resolve_model(self.model)
        bundled = self.model is None or self.model == BUNDLED_MODEL_NAME
        args = _engine.engine_args(str(ref), served, bundled, self.engine_args)
        names = args["served_model_name"]
        self._served = [names] if isinstance(names, str) else list(names)
        self._names = frozenset(
            {str(ref), served, *self._served}
            | ({str(self.model)} if self.model is not None else set())
        )
        _engine.start(engine, args)

    async def stop(self) -> None:
        engine, self._engine = self._engine, None
        if engine is not None and self._vllm is not None:
            with anyio.CancelScope(shield=True):
                await self._vllm.stop_output_handler(engine)
                await anyio.to_thread.run_sync(self._vllm.stop, engine)

    def window(self) -> int:
        return self.max_concurrency

    def concurrency_limit(self) -> int | None:
        return self.max_concurrency

    def identity(self) -> dict[str, Any]:
        # What changes the answers: the model. Engine args (memory, parallelism) do not.
        return {"provider": "vllm", "model": str(self.model or BUNDLED_MODEL_NAME)}

    async def models(self) -> list[str]:
        """The loaded model's served names (``smollm2`` for the bundled one); empty before
        ``start``."""
        return list(self._served)

    async def check_model(self, model: str) -> None:
        if model not in self._names:
            raise ModelNotFoundError(model, sorted(self._names))

    # ------------------------------------------------------------------ one request

    async def execute(self, request: Request) -> Result:
        engine = self._engine
        if engine is None:
            return failed(ErrorCode.engine_error, "the engine is not running")
        body = request.body
        model = body.get("model")
        if model not in self._names:
            return failed(
                ErrorCode.model_not_found,
                f"model {model!r} is not loaded here; loaded: {', '.join(sorted(self._names))}",
                status_code=404,
                param="model",
            )
        try:
            body, tools = self._plan_tools(engine, request)
            plan = map_body(body, engine.sampling_defaults)
        except ToolRefusal as refusal:
            return failed(refusal.code, refusal.message, status_code=400, param=refusal.param)
        except Refusal as refusal:
            return _refused(refusal)
        async with self._limiter:
            return await self._generate(engine, str(model), plan, tools)

    def _plan_tools(
        self, engine: Engine, request: Request
    ) -> tuple[dict[str, Any], ToolPlan | None]:
        """The body with its tools planned (``batchclient._tools.plan_tools``): rendered by the
        chat template when it renders tools, no ``tool_prompt_format`` was asked for and a
        ``tool_call_parser`` can read the calls back; otherwise written into the prompt."""
        body = request.body
        if not mentions_tools(body):
            return body, None
        vllm = self._vllm
        assert vllm is not None
        template = body.get("chat_template")
        template = template if isinstance(template, str) else engine.chat_template
        offered = bool(body.get("tools")) and body.get("tool_choice") != "none"
        native = (
            request.tool_prompt_format is None
            and vllm.renders_tools(template)
            and (self._parser_class is not None or not offered)
        )
        return plan_tools(body, request.tool_prompt_format, native=native)

    async def _generate(
        self, engine: Engine, model: str, plan: Plan, tools: ToolPlan | None
    ) -> Result:
        vllm = self._vllm
        assert vllm is not None
        llm = engine.llm
        started, started_wall = time.perf_counter(), time.time()
        native = tools is not None and tools.fmt is None
        try:
            (_conversation,), (prompt,) = await llm.renderer.render_chat_async(
                [plan.messages],
                vllm.chat_params(plan.chat_template, tools.tools if native and tools else None),
            )
        except Exception as exc:  # a template or tokenizer refusing this conversation
            return _request_error(vllm, exc, "messages")
        prompt_tokens = len(prompt["prompt_token_ids"])
        reader, keep_special = None, False
        try:
            if native and tools is not None and not tools.forced:
                reader, keep_special = vllm.native_reader(
                    self._parser_class, llm.get_tokenizer(), tools.tools
                )
            max_tokens = resolve_max_tokens(plan.max_tokens, prompt_tokens, engine.max_model_len)
            params = vllm.sampling_params(
                plan.sampling, max_tokens, plan.structured, skip_special_tokens=not keep_special
            )
        except Refusal as refusal:
            return _refused(refusal)
        except Exception as exc:
            return _request_error(vllm, exc, None)

        request_id = f"{self._id_prefix}-{next(self._ids)}"
        final: Any = None
        try:
            async for output in llm.generate(prompt, params, request_id):
                final = output
        except anyio.get_cancelled_exc_class():
            # vLLM aborts on cancellation itself, but its abort can be cut short by a
            # cancelled scope (or skipped when cancelled mid-submit); aborting twice is harmless.
            with anyio.CancelScope(shield=True):
                await llm.abort(request_id)
            raise
        except Exception as exc:
            if vllm.is_request_error(exc):
                return _request_error(vllm, exc, None)
            return failed(ErrorCode.engine_error, f"{type(exc).__name__}: {exc}")
        latency = time.perf_counter() - started
        if final is None or not final.outputs:
            return failed(ErrorCode.engine_error, "the engine finished without an output")
        result = self._result(llm, request_id, model, plan, final, started_wall, latency)
        if tools is not None and result.body is not None:
            apply_to_body(tools, result.body, reader)
        return result

    def _result(
        self,
        llm: Any,
        request_id: str,
        model: str,
        plan: Plan,
        final: Any,
        started_wall: float,
        latency: float,
    ) -> Result:
        output = final.outputs[0]
        logprobs = None
        if plan.top_logprobs is not None:
            tokenizer = llm.get_tokenizer()
            logprobs = logprobs_content(
                output.token_ids,
                output.logprobs or [],
                plan.top_logprobs,
                lambda token_id: str(tokenizer.decode([token_id])),
            )
        body = completion_body(
            request_id=request_id,
            model=model,
            created=int(started_wall),
            text=output.text,
            finish_reason=output.finish_reason,
            prompt_tokens=len(final.prompt_token_ids or ()),
            completion_tokens=len(output.token_ids),
            logprobs=logprobs,
        )
        return Result(
            status_code=200,
            body=body,
            request_id=request_id,
            ttft_s=_ttft(final.metrics, started_wall),
            latency_s=latency,
        )

    # ------------------------------------------------------------------ inspection

    def engine_counts(self) -> tuple[int, int, int]:
        """(unfinished requests in this process's engine front end, running and waiting
        requests as last reported by the engine core). For tests and diagnostics."""
        engine = self._engine
        if engine is None:
            return (0, 0, 0)
        counts = engine.counts
        return (engine.llm.get_num_unfinished_requests(), counts.running, counts.waiting)


def _ttft(metrics: Any, started_wall: float) -> float | None:
    """Seconds from dispatch to the first token, from the engine's per-request timestamps
    (``arrival_time`` is wall-clock when rendering began, ``first_token_latency`` is measured
    from it). None when the engine kept no timings."""
    latency = getattr(metrics, "first_token_latency", 0.0) or 0.0
    arrival = getattr(metrics, "arrival_time", 0.0) or 0.0
    if latency <= 0 or arrival <= 0:
        return None
    return max(0.0, arrival + latency - started_wall)


def _refused(refusal: Refusal) -> Result:
    return failed(refusal.code, refusal.message, status_code=400, param=refusal.param)


def _request_error(vllm: ModuleType, exc: Exception, param: str | None) -> Result:
    """A vLLM refusal of one request as an API-style 400 (or ``engine_error`` when it is not
    the request's fault)."""
    message = str(exc) or type(exc).__name__
    if vllm.is_context_error(exc):
        return failed(ErrorCode.context_length_exceeded, message, status_code=400, param="messages")
    if param is not None or vllm.is_request_error(exc):
        return failed(ErrorCode.invalid_request, message, status_code=400, param=param)
    return failed(ErrorCode.engine_error, f"{type(exc).__name__}: {message}")
