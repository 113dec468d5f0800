"""Starting and stopping vLLM's ``AsyncLLM``. Imports vLLM: only imported when an engine starts,
so ``import batchclient`` stays light.

Start-up is blocking (about 20-90 s on 2 CPU cores: the engine core process loads the model and
sizes its KV cache), so the client runs :func:`start` in a worker thread. :func:`stop` shuts the
engine down and then waits until every process of the engine's tree (engine core and its
workers) has exited, killing stragglers, so nothing outlives ``async with``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import jinja2
import jinja2.ext
import jinja2.meta
import jinja2.sandbox
import psutil
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.exceptions import VLLMClientError
from vllm.platforms import current_platform
from vllm.renderers.chat_utils import make_tool_call_id
from vllm.renderers.params import ChatParams
from vllm.sampling_params import RequestOutputKind, SamplingParams, StructuredOutputsParams
from vllm.tool_parsers import ToolParser, ToolParserManager
from vllm.usage.usage_lib import UsageContext
from vllm.v1.engine.async_llm import AsyncLLM
from vllm.v1.metrics.loggers import StatLoggerBase

from .. import _cpu as _binding
from .._engine_defaults import EngineDefaults, decide, stop_grace_s
from ..models import BUNDLED_MAX_MODEL_LEN
from . import _forced
from ._logprob_gate import LogprobGate

ENGINE_ARG_NAMES = frozenset(f.name for f in dataclasses.fields(AsyncEngineArgs))
"""The engine arguments this vLLM accepts (``AsyncEngineArgs`` fields)."""

_KILL_WAIT_S = 5.0  # for a killed process to be gone


def engine_args(
    model: str,
    served_name: str,
    bundled: bool,
    given: Mapping[str, Any],
    defaults: EngineDefaults | None = None,
) -> dict[str, Any]:
    """vLLM engine arguments: the caller's, over defaults that make the engine start anywhere.

    Defaults (each applies only when the caller does not set it):

    - ``served_model_name``: ``served_name`` (``smollm2`` for the bundled model).
    - ``max_model_len``: 2048 for the bundled model (vLLM's default, the model's 8k, otherwise).
    - ``disable_log_stats``: True (no Prometheus or periodic log lines; the per-request
      timings batchclient reports come from its own stat logger, see :class:`EngineCounts`).
    - On a CPU build of vLLM only: ``enforce_eager=True`` (skips torch.compile, which takes
      minutes on CPU).
    - ``dtype`` and the KV cache size by the hardware: ``defaults`` (default: decided here by
      :func:`batchclient._engine_defaults.decide`; float32 or bfloat16 on CPU, a 2 GiB KV cache
      on CPU unless something sizes it). On GPUs vLLM's own defaults (CUDA graphs,
      ``gpu_memory_utilization`` 0.92, the checkpoint's dtype) stay.
    """
    args = dict(given)
    args["model"] = model
    args.setdefault("served_model_name", served_name)
    if bundled:
        args.setdefault("max_model_len", BUNDLED_MAX_MODEL_LEN)
    args.setdefault("disable_log_stats", True)
    if defaults is None:
        defaults = decide(given, cpu=is_cpu())
    if defaults.cpu:
        args.setdefault("enforce_eager", True)
    return defaults.apply(args)


def is_cpu() -> bool:
    """Whether this vLLM runs on the CPU (its platform's verdict)."""
    return bool(current_platform.is_cpu())


@dataclass
class EngineCounts:
    """The engine core's own request counts, from the scheduler stats it reports after each
    step: ``running`` (being generated) and ``waiting`` (queued in the engine)."""

    running: int = 0
    waiting: int = 0
    reports: int = 0


class _CountsLogger(StatLoggerBase):
    """A vLLM stat logger that keeps the last scheduler counts. Registering any stat logger
    makes the engine time each request (``RequestOutput.metrics``: time to first token)
    without vLLM's default Prometheus and log-line loggers."""

    def __init__(self, counts: EngineCounts) -> None:
        self.counts = counts

    def record(
        self,
        scheduler_stats: Any,
        iteration_stats: Any,
        mm_cache_stats: Any = None,
        engine_idx: int = 0,
    ) -> None:
        if scheduler_stats is not None:
            self.counts.running = int(scheduler_stats.num_running_reqs)
            self.counts.waiting = int(scheduler_stats.num_waiting_reqs) + int(
                getattr(scheduler_stats, "num_skipped_waiting_reqs", 0)
            )
            self.counts.reports += 1

    def log_engine_initialized(self) -> None:
        pass


@dataclass
class Engine:
    """A started engine and what is needed to stop it cleanly."""

    llm: Any = None  # AsyncLLM
    counts: EngineCounts = field(default_factory=EngineCounts)
    max_model_len: int = 0
    sampling_defaults: dict[str, Any] = field(default_factory=dict)
    chat_template: str | None = None
    binding: str | None = None  # VLLM_CPU_OMP_THREADS_BIND the engine started with (CPU)
    forcing: bool = False  # has the ForcedTokens logits processor (._forced)
    gate: LogprobGate = field(default_factory=LogprobGate)  # log-probability kinds apart


def _generating(args: Mapping[str, Any]) -> bool:
    """Whether these engine arguments make a generating engine (the model's own config
    decides when ``runner`` is not given: an embedding checkpoint makes a pooling engine)."""
    runner = args.get("runner")
    if runner not in (None, "auto"):
        return bool(runner == "generate")
    try:
        config = AsyncEngineArgs(**args).create_model_config()
    except Exception:
        return False  # the engine's own start reports what is wrong
    return bool(getattr(config, "runner_type", None) == "generate")


def start(
    engine: Engine,
    args: Mapping[str, Any],
    cores: Sequence[int] | None = None,
    *,
    defaults: EngineDefaults | None = None,
) -> None:
    """Build the ``AsyncLLM`` (blocking) into ``engine.llm``. Assigns ``engine.llm`` as soon as
    it exists, so a caller cancelled meanwhile can still shut it down.

    On a CPU build, unless ``VLLM_CPU_OMP_THREADS_BIND`` is set, the engine's compute threads
    are bound to ``cores`` (default: every core of this process's affinity; the rule is
    :func:`batchclient._engine_defaults.choose_cores`, ``defaults.cores`` when given, the
    mechanism :mod:`batchclient._cpu`); ``engine.binding`` records the value used. Logs the engine's
    defaults once (INFO, ``batchclient`` logger).

    A generating engine gets the :class:`._forced.ForcedTokens` logits processor after the
    caller's own (``engine.forcing``); a pooling one cannot take logits processors (vLLM
    refuses them), so its runner is resolved first when ``runner`` is not given."""
    args = dict(args)
    engine.forcing = _generating(args)
    if engine.forcing:
        args["logits_processors"] = _forced.processors(args.get("logits_processors"))
    counts = engine.counts
    if defaults is None:
        defaults = decide(args, cores=cores, cpu=is_cpu())
    chosen = defaults.cores.value
    mask = None if chosen is None else _binding.bind_mask(chosen, _binding.engine_workers(args))
    engine.binding = mask or os.environ.get(_binding.THREADS_BIND)
    defaults.log("vLLM engine", engine.binding)
    with _binding.bound(mask):
        engine.llm = AsyncLLM.from_engine_args(
            AsyncEngineArgs(**args),
            # Batch inference is offline work: take the scheduler defaults of vLLM's offline
            # ``LLM`` class (on CPU 256 sequences / 4,096 tokens per step instead of the
            # server's 128 / 2,048), so the engine batches as ``LLM.chat`` does.
            usage_context=UsageContext.LLM_CLASS,
            stat_loggers=[lambda _config, _index: _CountsLogger(counts)],
        )
    engine.max_model_len = int(engine.llm.model_config.max_model_len)
    engine.sampling_defaults = dict(engine.llm.model_config.get_diff_sampling_param())
    engine.chat_template = default_chat_template(engine.llm)


def _engine_processes(llm: Any) -> tuple[list[Any], list[psutil.Process]]:
    """The engine core processes vLLM started (``multiprocessing`` children of this process)
    and all their descendants (the workers). Empty if this vLLM keeps them elsewhere."""
    resources = getattr(getattr(llm, "engine_core", None), "resources", None)
    manager = getattr(resources, "engine_manager", None)
    roots = list(getattr(manager, "processes", None) or ())
    descendants: list[psutil.Process] = []
    for proc in roots:
        with contextlib.suppress(psutil.Error, ValueError, TypeError):
            descendants += psutil.Process(proc.pid).children(recursive=True)
    return roots, descendants


async def stop_output_handler(engine: Engine) -> None:
    """Cancel the engine's output-handler task (on the event loop, before :func:`stop`):
    otherwise it sees the engine core exit and logs an ``EngineDeadError`` traceback."""
    handler = getattr(engine.llm, "output_handler", None)
    if isinstance(handler, asyncio.Task) and not handler.done():
        handler.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await handler


def stop(engine: Engine) -> None:
    """Shut the engine down (blocking) and wait until its processes are gone: they get
    ``batchclient._engine_defaults.stop_grace_s()`` (30 s; 3 s in the ``batchclient``
    command) to exit on their own, then they are killed. A clean exit takes 10-15 s on a busy
    2-core machine, mostly the interpreter teardown of each process."""
    llm, engine.llm = engine.llm, None
    if llm is None:
        return
    grace = stop_grace_s()
    deadline = time.monotonic() + grace
    roots, descendants = _engine_processes(llm)
    try:
        llm.shutdown(timeout=grace)
    finally:
        for proc in roots:  # join() also reaps them, so no zombie is left
            proc.join(max(0.0, deadline - time.monotonic()))
            if proc.is_alive():  # vLLM gave up on it: it is ours, end it
                proc.kill()
                proc.join(_KILL_WAIT_S)
        left = max(0.0, deadline - time.monotonic())
        _, alive = psutil.wait_procs(descendants, timeout=left)
        for child in alive:
            with contextlib.suppress(psutil.Error):
                child.kill()
        psutil.wait_procs(alive, timeout=_KILL_WAIT_S)


# ---------------------------------------------------------------------------- per request

CHAT_PARAMS = ChatParams(
    chat_template_kwargs={"add_generation_prompt": True, "continue_final_message": False}
)
"""How conversations are rendered: the model's own chat template with the assistant prompt
appended, as vLLM's OpenAI server does by default."""


def chat_params(template: str | None, tools: Sequence[Mapping[str, Any]] | None) -> ChatParams:
    """:data:`CHAT_PARAMS` with another chat template and/or the OpenAI ``tools`` the template
    renders itself (vLLM's renderer hands ``chat_template_kwargs["tools"]`` to the template)."""
    if template is None and not tools:
        return CHAT_PARAMS
    kwargs = dict(CHAT_PARAMS.chat_template_kwargs)
    if tools:
        kwargs["tools"] = [dict(t) for t in tools]
    return ChatParams(chat_template=template, chat_template_kwargs=kwargs)


def default_chat_template(llm: Any) -> str | None:
    """The model's chat template (the tokenizer's), or None when it has none."""
    try:
        template = llm.get_tokenizer().get_chat_template()
    except Exception:  # no template at all: the renderer reports it per request
        return None
    return template if isinstance(template, str) else None


@lru_cache(maxsize=32)
def renders_tools(template: str | None) -> bool:
    """Whether a chat template reads the ``tools`` variable, i.e. renders tool definitions
    itself (the same test vLLM's renderer uses to pass template kwargs: jinja2's undeclared
    variables). The bundled SmolLM2's template does not."""
    if not template:
        return False
    try:
        parsed = jinja2.sandbox.ImmutableSandboxedEnvironment(
            extensions=[jinja2.ext.loopcontrols]
        ).parse(template)
    except jinja2.TemplateError:
        return False
    return "tools" in jinja2.meta.find_undeclared_variables(parsed)


def tool_parser_class(name: str) -> type[ToolParser]:
    """vLLM's tool parser called ``name`` (the server's ``--tool-call-parser`` names, e.g.
    ``hermes``, ``llama3_json``, ``pythonic``). Raises ``KeyError`` for an unknown name."""
    return ToolParserManager.get_tool_parser(name)


def native_reader(
    parser_class: type[ToolParser], tokenizer: Any, tools: Sequence[Mapping[str, Any]]
) -> tuple[Callable[[str], tuple[str | None, list[dict[str, Any]]]], bool]:
    """A reader of tool calls from a natively rendered answer, with vLLM's tool parser as its
    server uses it, and whether special tokens must be kept in the answer's text (Hermes-style
    parsers need their ``<tool_call>`` tokens). The parser reads only the request's tools and
    tool choice, so the request it is given carries no messages of the caller's."""
    request = ChatCompletionRequest.model_validate(
        {
            "model": "",
            "messages": [{"role": "user", "content": ""}],
            "tools": [dict(t) for t in tools],
            "tool_choice": "auto",
        }
    )
    parser = parser_class(tokenizer, list(request.tools or ()))
    adjusted = parser.adjust_request(request)
    assert isinstance(adjusted, ChatCompletionRequest)

    def read(text: str) -> tuple[str | None, list[dict[str, Any]]]:
        info = parser.extract_tool_calls(text, adjusted)
        if not info.tools_called:
            return text, []
        calls = [
            {
                "id": call.id or make_tool_call_id(),
                "type": "function",
                "function": {"name": call.function.name, "arguments": call.function.arguments},
            }
            for call in info.tool_calls
        ]
        return info.content, calls

    return read, not adjusted.skip_special_tokens


def sampling_params(
    sampling: Mapping[str, Any],
    max_tokens: int,
    structured: Mapping[str, Any] | None,
    *,
    skip_special_tokens: bool = True,
) -> SamplingParams:
    """``vllm.SamplingParams`` for one request; only the finished output is sent back
    (``FINAL_ONLY``: no per-token traffic through Python). Raises vLLM's own validation errors
    (e.g. ``max_tokens must be at least 1``)."""
    return SamplingParams(
        **sampling,
        max_tokens=max_tokens,
        structured_outputs=StructuredOutputsParams(**structured) if structured else None,
        output_kind=RequestOutputKind.FINAL_ONLY,
        skip_special_tokens=skip_special_tokens,
    )


def is_request_error(exc: BaseException) -> bool:
    """True for vLLM's per-request validation errors (the request's fault, HTTP 400)."""
    return isinstance(exc, VLLMClientError | ValueError | TypeError)


def is_context_error(exc: BaseException) -> bool:
    """True when vLLM refused the prompt for not fitting the context."""
    return getattr(exc, "parameter", None) == "input_tokens" or (
        "maximum context length" in str(exc)
    )
