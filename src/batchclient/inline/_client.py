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
from typing import TYPE_CHECKING, Any, Literal

import anyio

from .._core.client import BatchClient
from .._core.ledger import Billing
from .._core.provider import Provider
from .._core.request import Request, Result, failed
from .._core.scoring import prompt_logprobs_body
from .._core.tokens import HFTokenizer, Tokenizer
from .._engine_defaults import EngineDefaults, decide
from .._logs import is_verbose, vllm_logging
from .._options import document, split
from .._tools import ToolPlan, ToolRefusal, apply_to_body, mentions_tools, plan_tools
from ..errors import (
    BatchClientError,
    ConfigurationError,
    EndpointError,
    ErrorCode,
    ModelNotFoundError,
)
from ..models import BUNDLED_MAX_MODEL_LEN, BUNDLED_MODEL_NAME, resolve_model
from ..types import Endpoint
from ._logprob_gate import side_of
from ._mapping import Plan, Refusal, completion_body, logprobs_content, map_body, resolve_max_tokens
from ._next_tokens import NextTokenGroups
from ._options import VLLMOptions

if TYPE_CHECKING:
    from ._engine import Engine

_GENERATE = frozenset({Endpoint.chat_completions, Endpoint.completions})
_POOLING = frozenset({Endpoint.embeddings})

__all__ = ["OUTPUT_ENGINE_ARGS", "VLLMBatchInference", "VLLMProvider"]

OUTPUT_ENGINE_ARGS = frozenset(
    {
        "code_revision", "convert", "dtype", "generation_config", "hf_config_path",
        "hf_overrides", "kv_cache_dtype", "logits_processors", "logprobs_mode", "max_logprobs",
        "max_model_len", "model_impl", "model_weights", "override_generation_config",
        "pooler_config", "quantization", "quantization_config", "reasoning_parser", "revision",
        "runner", "seed", "tokenizer", "tokenizer_mode", "tokenizer_revision", "use_fp64_gumbel",
        "watermark", "watermark_config", "load_format",
    }
)  # fmt: skip
"""vLLM engine arguments that change answers (weights, precision, context, sampling
defaults, seed); part of the result cache's key. Memory, parallelism and scheduling arguments
change speed, not answers, and are left out."""

_INSTALL_HINT = (
    "the inline provider needs vLLM: pip install 'batchclient[vllm]' (GPU) or "
    "'batchclient[cpu]' (CPU)"
)


@document(VLLMOptions)
class VLLMBatchInference(BatchClient):
    """Batch inference on a vLLM engine in this process. Use as ``async with``.

    ``async with`` starts vLLM's ``AsyncLLM`` (its engine core runs in a child process; about
    20-90 s on 2 CPU cores, seconds on a GPU) and on exit shuts it down and waits until every
    engine process has exited. Scripts need an ``if __name__ == "__main__":`` guard because vLLM
    spawns its engine process.

    Args (every one after ``model`` keyword-only; the options below are :class:`VLLMOptions`,
    the provider's; any other keyword is an engine argument):
        model: a model directory or Hugging Face hub id; None (default) is the bundled
            SmolLM2-135M-Instruct, served as ``smollm2``.
        state_dir: where files, jobs and results are kept (default ``$BATCHCLIENT_STATE_DIR``
            or the user data directory); jobs there resume with a client on the same model.
        cache: use the result cache in ``state_dir`` for every call and batch (default False;
            see :class:`~batchclient.BatchClient`).
        database: a ``postgresql://`` URL keeping the state there instead of ``state_dir``
            (default ``$BATCHCLIENT_DATABASE_URL``; see :class:`~batchclient.BatchClient`).
        **engine_args: vLLM engine arguments (``vllm.AsyncEngineArgs`` fields), e.g.
            ``max_model_len``, ``dtype``, ``tensor_parallel_size``,
            ``gpu_memory_utilization``, ``kv_cache_memory_bytes``, ``served_model_name``,
            ``max_num_seqs``. Defaults batchclient adds when they are not given: see
            ``docs/inline.md`` (bundled model: ``max_model_len=2048``; CPU builds:
            ``enforce_eager=True``, a 2 GiB KV cache unless memory is sized otherwise, and
            ``dtype`` ``bfloat16`` only where the CPU has bfloat16 arithmetic, else
            ``float32``; GPUs: the checkpoint's dtype). A ``dtype`` given always wins.
            ``runner="pooling", convert="embed"`` makes an embedding engine (it serves
            ``batch_embeddings`` and ``/v1/embeddings`` batches, nothing else; any model,
            the bundled one included); otherwise the engine serves chat and text
            completions, scoring included (``docs/evals.md``).

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
            ``tool_call_parser`` (an option of the wrong type: at once).
        EndpointError: the engine failed to start (the message holds vLLM's reason).
    """

    provider: VLLMProvider

    def __init__(
        self,
        model: str | None = None,
        *,
        state_dir: str | os.PathLike[str] | None = None,
        cache: bool = False,
        database: str | None = None,
        **options: Any,
    ) -> None:
        provider = VLLMProvider(model, **options)
        super().__init__(provider, state_dir=state_dir, cache=cache, database=database)


class VLLMProvider(Provider):
    """The inline engine as a :class:`~batchclient.Provider` (for ``BatchClient``, the server
    and other providers). Arguments as :class:`VLLMBatchInference`, without ``state_dir`` and
    ``cache``; the resolved options are ``options``, the engine arguments ``engine_args``.
    ``start`` builds the engine, ``stop`` shuts it down."""

    def __init__(self, model: str | None = None, **options: Any) -> None:
        self.options, engine_args = split(VLLMOptions, options, who="the vllm provider")
        max_concurrency, cpu_cores = self.options["max_concurrency"], self.options["cpu_cores"]
        if max_concurrency < 1:
            raise ConfigurationError("max_concurrency must be >= 1")
        if cpu_cores is not None and not cpu_cores:
            raise ConfigurationError("cpu_cores: give at least one core (or None for all)")
        self.model = model
        self.cpu_cores = None if cpu_cores is None else sorted(set(cpu_cores))
        self.max_concurrency = max_concurrency
        self.tool_call_parser = self.options["tool_call_parser"]
        self.verbose = self.options["verbose"]
        self.single_token_scoring = self.options["single_token_scoring"]
        self._parser_class: type | None = None
        self.engine_args = dict(engine_args)
        self.endpoints = _POOLING if engine_args.get("runner") == "pooling" else _GENERATE
        self._limiter = anyio.CapacityLimiter(max_concurrency)
        self._engine: Engine | None = None
        self._vllm: ModuleType | None = None  # the ._engine module, imported on start
        self._names: frozenset[str] = frozenset()
        self._served: list[str] = []  # the served names alone (no paths), for listings
        self._model_ref: str | None = None
        # Engine request ids: a per-client random prefix and a counter, never anything the
        # caller supplied (two clients or two calls can never collide).
        self._id_prefix = uuid.uuid4().hex[:12]
        self._ids = itertools.count()
        self._next_tokens = NextTokenGroups(self._score_next_tokens)
        self._defaults: EngineDefaults | None = None

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        # vLLM configures its logging on import and when the engine is built, here and in the
        # engine processes it spawns: all of that happens inside this block.
        with vllm_logging(self.verbose):
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
        self._model_ref = os.path.abspath(ref) if os.path.exists(ref) else str(ref)
        bundled = self.model is None or self.model == BUNDLED_MODEL_NAME
        given = dict(self.engine_args)
        if not is_verbose(self.verbose):
            given.setdefault("use_tqdm_on_load", False)  # the weight-loading progress bar
        defaults = self.defaults(cpu=_engine.is_cpu())
        args = _engine.engine_args(str(ref), served, bundled, given, defaults)
        names = args["served_model_name"]
        self._served = [names] if isinstance(names, str) else list(names)
        self._names = frozenset(
            {str(ref), served, *self._served}
            | ({str(self.model)} if self.model is not None else set())
        )
        _engine.start(engine, args, self.cpu_cores, defaults=defaults)
        # the model may make the engine a pooling one without runner="pooling" being given
        pooling = getattr(engine.llm.model_config, "runner_type", None) == "pooling"
        self.endpoints = _POOLING if pooling else _GENERATE

    async def stop(self) -> None:
        engine, self._engine = self._engine, None
        if engine is not None and self._vllm is not None:
            with anyio.CancelScope(shield=True):
                await self._vllm.stop_output_handler(engine)
                await anyio.to_thread.run_sync(self._vllm.stop, engine)

    def defaults(self, cpu: bool | None = None) -> EngineDefaults:
        """The engine's hardware-chosen defaults (dtype, KV cache, cores; see
        ``batchclient._engine_defaults``), decided once per provider: the same before and after
        ``start``, so identities computed before the engine runs are the run's. ``cpu``:
        whether vLLM runs on the CPU, when the caller knows (default: asked cheaply)."""
        if self._defaults is None:
            self._defaults = decide(self.engine_args, cores=self.cpu_cores, cpu=cpu)
        return self._defaults

    @property
    def dtype(self) -> str:
        """The engine's ``dtype``: the one given, else chosen by the hardware (``float32`` or
        ``bfloat16`` on CPU, ``auto``, the checkpoint's, on GPUs)."""
        return self.defaults().dtype.value

    @property
    def binding(self) -> str | None:
        """The ``VLLM_CPU_OMP_THREADS_BIND`` value the running engine started with (CPU builds;
        None on GPUs or before start), e.g. ``"0-1"``."""
        return None if self._engine is None else self._engine.binding

    def max_in_flight(self) -> int:
        return self.max_concurrency

    def billing(self, model: str) -> Billing:
        """``local``: the engine runs here, its prefix cache at no price."""
        return Billing("local")

    def concurrency_limit(self) -> int | None:
        return self.max_concurrency

    def identity(self) -> dict[str, Any]:
        # What changes the answers: the model, its dtype, and whether it embeds. Engine args
        # (memory, parallelism) do not.
        identity = {
            "provider": "vllm",
            "model": str(self.model or BUNDLED_MODEL_NAME),
            "dtype": self.dtype,
        }
        if self.endpoints == _POOLING:
            identity["runner"] = "pooling"
        return identity

    async def models(self) -> list[str]:
        """The loaded model's served names (``smollm2`` for the bundled one); empty before
        ``start``."""
        return list(self._served)

    async def cache_identity(self, model: str) -> dict[str, Any]:
        """The model's resolved path (the bundled one's folder is named after its GGUF's
        hash), the engine arguments in :data:`OUTPUT_ENGINE_ARGS` (with batchclient's defaults:
        the ``dtype`` chosen by the hardware, ``max_model_len`` for the bundled model) and the
        ``tool_call_parser``. Needs no engine: a dry run computes the same identity as the
        run."""
        path = await anyio.to_thread.run_sync(self._model_path)
        args = {k: v for k, v in self.engine_args.items() if k in OUTPUT_ENGINE_ARGS}
        args["dtype"] = self.dtype
        if self.model is None or self.model == BUNDLED_MODEL_NAME:
            args.setdefault("max_model_len", BUNDLED_MAX_MODEL_LEN)
        args = dict(sorted(args.items()))
        return {
            "provider": "vllm",
            "model": model,
            "model_path": path,
            "engine_args": args,
            "tool_call_parser": self.tool_call_parser,
        }

    async def tokenizer_path(self, model: str) -> str | None:
        """The model's directory, when it is one (a hub id gives None)."""
        path = await anyio.to_thread.run_sync(self._model_path)
        return path if await anyio.Path(path).is_dir() else None

    def _model_path(self) -> str:
        """The model to load, as an absolute path when it is a local directory (may convert
        the bundled model once; see ``batchclient.models.bundled_model_path``)."""
        if self._model_ref is None:
            _, ref = resolve_model(self.model)
            self._model_ref = os.path.abspath(ref) if os.path.exists(ref) else str(ref)
        return self._model_ref

    def served_names(self) -> frozenset[str]:
        """The names calls may use for the loaded model (empty before start)."""
        return self._names

    async def check_model(self, model: str) -> None:
        if model not in self._names:
            raise ModelNotFoundError(model, sorted(self._names))

    async def tokenizer(self, model: str) -> Tokenizer:
        """The engine's own tokenizer, with its ``max_model_len``."""
        engine = self._engine
        if engine is None:
            raise ConfigurationError("the engine is not running: use the client in `async with`")
        await self.check_model(model)
        return HFTokenizer(engine.llm.get_tokenizer(), engine.max_model_len)

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
        if request.endpoint not in self.endpoints:
            served = ", ".join(sorted(e.value for e in self.endpoints))
            return failed(
                ErrorCode.unsupported_parameter,
                f"this engine does not serve {request.endpoint.value} (it serves {served}; "
                "embeddings need runner='pooling', convert='embed')",
                status_code=400,
                param="url",
            )
        if request.endpoint is not Endpoint.chat_completions:
            return await self._other(engine, request, str(model))
        try:
            body, tools = self._plan_tools(engine, request)
            plan = map_body(body, engine.sampling_defaults)
        except ToolRefusal as refusal:
            return failed(refusal.code, refusal.message, status_code=400, param=refusal.param)
        except Refusal as refusal:
            return _refused(refusal)
        async with self._limiter:
            return await self._generate(engine, str(model), plan, tools)

    async def _other(self, engine: Engine, request: Request, model: str) -> Result:
        """A completions or embeddings request (:mod:`._kinds`, imported with the engine)."""
        from . import _kinds

        request_id = f"{self._id_prefix}-{next(self._ids)}"
        if request.endpoint is Endpoint.embeddings:
            return await _kinds.embed(engine, request.body, model, request_id, self._limiter)
        body, span = request.body, request.score_span
        path = _scoring_path(body, span, engine.forcing) if self.single_token_scoring else None
        if path is not None:
            assert span is not None
            prompt = [int(t) for t in body["prompt"]]  # token ids (``_scoring_path``)
            if path == "next-token":
                return await self._next_tokens.execute(engine, model, prompt[:-1], prompt[-1])
            return await _kinds.score_forced(
                engine, prompt[: span[0]], prompt[span[0] :], model, request_id, self._limiter
            )
        scoring = span is not None
        if scoring:
            body = prompt_logprobs_body(body)
        return await _kinds.complete(
            engine, body, model, request_id, self._limiter, scoring=scoring
        )

    async def _score_next_tokens(
        self, engine: Engine, model: str, context: list[int], tokens: list[int]
    ) -> list[Result]:
        """One engine request scoring every one of ``tokens`` after ``context``
        (:mod:`._next_tokens` merges a question's choices into it)."""
        from . import _kinds

        request_id = f"{self._id_prefix}-{next(self._ids)}"
        return await _kinds.score_next_tokens(
            engine, context, tokens, model, request_id, self._limiter
        )

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
            async with engine.gate.enter(side_of(params)):
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


MAX_FORCED_TOKENS = 16
"""The longest continuation scored by teacher forcing (:func:`._kinds.score_forced`); a longer
one (a rolling window) is scored the ``prompt_logprobs`` way: its positions are computed in one
prefill instead of one engine step each."""


def _scoring_path(
    body: dict[str, Any], span: tuple[int, int] | None, forcing: bool
) -> Literal["next-token", "forced"] | None:
    """How a scoring request is sent: ``"next-token"`` (a continuation of one token, grouped
    with the other continuations of its context: :mod:`._next_tokens`), ``"forced"`` (2 to
    :data:`MAX_FORCED_TOKENS` tokens, on an engine with the forcing processor), or None (the
    ``prompt_logprobs`` way). Both cached paths need a prompt of token ids whose scored span
    ends it, after a context of at least one token."""
    prompt = body.get("prompt")
    if span is None or not isinstance(prompt, list) or span[1] != len(prompt) or span[0] < 1:
        return None
    k = span[1] - span[0]
    if k == 1:
        return "next-token"
    return "forced" if forcing and 2 <= k <= MAX_FORCED_TOKENS else None


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
