"""``BatchClientLM``: an lm-evaluation-harness model over any batchclient provider.

lm-eval calls its three request types synchronously with every request of a type at once; the
model answers them through batchclient's calls on a client kept open in a background event loop
(an anyio blocking portal):

- ``loglikelihood`` -> ``batch_loglikelihood`` (the tokenisation and scoring rules of
  lm-eval's own backends, ``batchclient._core.scoring``);
- ``loglikelihood_rolling`` -> ``batch_loglikelihood_rolling``;
- ``generate_until`` -> ``batch_completion`` over the (possibly chat-templated) context, with
  lm-eval's own handling of ``gen_kwargs`` (``normalize_gen_kwargs``: greedy unless
  ``do_sample``; the EOS text added to ``until``; the answer cut at the first stop string).

Answers are kept in the result cache of the state directory (:mod:`._results`) as they arrive,
so a re-run of the same eval sends nothing. A request that fails (a context over the model's
length, an empty continuation) stops the eval with ``BatchFailedError`` once every other request
is answered and stored; lm-eval has no per-item error, and a made-up score would be wrong.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from lm_eval.api.model import LM
from lm_eval.api.registry import register_model
from lm_eval.models.utils import (
    handle_stop_sequences,
    normalize_gen_kwargs,
    postprocess_generated_text,
)
from tqdm import tqdm

from ..._core.client import BatchClient
from ..._core.tokens import HFTokenizer
from ...errors import BatchFailedError, ConfigurationError
from ...jobs._store import default_state_dir
from ...models import BUNDLED_MODEL_NAME
from ...types import (
    BatchItemError,
    BatchProgress,
    GreedySamplingStrategy,
    SamplingParams,
    TopKSamplingStrategy,
    TopPSamplingStrategy,
)
from ._results import Answers, request_key
from ._session import ClientSession, client_factory

__all__ = ["BatchClientLM"]

_LM_EVAL_ONLY = ("batch_size", "max_batch_size", "device")  # lm-eval passes them to every model
_OPEN: weakref.WeakSet[BatchClientLM] = weakref.WeakSet()


@register_model("batchclient")
class BatchClientLM(LM):  # type: ignore[misc]  # lm-eval is untyped
    """lm-eval's ``LM`` over a batchclient provider (``--model batchclient``).

    Args (``--model_args key=value,...``):
        provider: a provider name of the registry: ``vllm`` (default: a vLLM engine in this
            process), ``remote`` (an OpenAI-compatible server), ``ray`` (engine replicas on
            Ray) or ``batch-api`` (a remote Batch API; ``base_url`` and ``model`` as remote).
        model: vllm: the model folder or hub id (default: the bundled SmolLM2-135M-Instruct);
            remote: the served model name (required).
        base_url: remote: the API root (``http://host:port/v1``; a ``.../v1/completions`` URL
            as ``local-completions`` takes is accepted too).
        api_key: remote: bearer token (default ``$OPENAI_API_KEY``).
        tokenizer: remote, batch-api: a local folder with the model's tokenizer files (needed
            for chat templates; without it remote scores through the server's ``/tokenize``
            route, and batch-api cannot score text).
        max_gen_toks: ``generate_until``'s default ``max_tokens`` (256, lm-eval's default).
        state_dir: where answers are kept (default ``$BATCHCLIENT_STATE_DIR`` or the user data
            directory); ``cache=False`` keeps none.
        other keys: the provider's own options, at the provider's defaults when absent
            (``batchclient providers NAME`` lists them): ``max_concurrency``, ``timeout_s``,
            ``max_retries``, ``rpm``, ... for remote; ``max_concurrency``,
            ``single_token_scoring``, ... and vLLM engine arguments (``max_model_len``,
            ``kv_cache_memory_bytes``, ...) for vllm and ray; an option the provider does not
            take is a ``ConfigurationError``.

    The model opens its own client on first use, on an event loop in a background thread;
    ``close()`` (or leaving ``with``) stops it, and models still open at exit are closed then.
    :meth:`for_client` wraps a client that is already open instead.
    """

    def __init__(
        self,
        provider: str = "vllm",
        model: str | None = None,
        base_url: str | None = None,
        api_key: str | None = None,
        tokenizer: str | None = None,
        max_gen_toks: int = 256,
        state_dir: str | os.PathLike[str] | None = None,
        cache: bool = True,
        client: BatchClient | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__()
        options = {k: v for k, v in kwargs.items() if k not in _LM_EVAL_ONLY}
        self.provider_name = provider
        self.max_gen_toks = int(max_gen_toks)
        self._state_dir = Path(state_dir).expanduser() if state_dir else default_state_dir()
        self._store = Answers(self._state_dir) if cache else None
        if client is not None:
            self._session = ClientSession(borrowed=client)
        else:
            make = client_factory(
                provider,
                model,
                base_url=base_url,
                api_key=api_key,
                tokenizer=tokenizer,
                state_dir=self._state_dir,
                options=options,
            )
            self._session = ClientSession(make)
        if provider in ("vllm", "ray"):  # an engine of ours: the model it loads
            served = options.get("served_model_name")  # an engine argument
            self.model = str(served or (model if model is not None else BUNDLED_MODEL_NAME))
        else:
            self.model = str(model)
        self._tokenizer_arg = tokenizer
        self._hf: Any = None
        _OPEN.add(self)

    @classmethod
    def for_client(
        cls,
        client: BatchClient,
        model: str,
        *,
        tokenizer: str | None = None,
        state_dir: str | os.PathLike[str] | None = None,
        cache: bool = True,
        max_gen_toks: int = 256,
    ) -> BatchClientLM:
        """A model over ``client``, already open on an event loop (an async application, a
        test). lm-eval must then run in a worker thread of that loop, e.g.
        ``await anyio.to_thread.run_sync(lambda: simple_evaluate(model=lm, ...))``; the client
        is not closed by the model. ``tokenizer``: the folder the remote client was given, if
        any (it is part of the answers' key)."""
        provider = "remote" if client.provider.identity().get("provider") == "remote" else "vllm"
        lm = cls(
            provider=provider,
            model=model,
            state_dir=state_dir,
            cache=cache,
            max_gen_toks=max_gen_toks,
            client=client,
        )
        lm.model = model
        lm._tokenizer_arg = tokenizer
        return lm

    # ------------------------------------------------------------------ lifecycle

    def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        return self._session.call(fn, *args)

    def _the_client(self) -> BatchClient:
        return self._session.client

    def close(self) -> None:
        """Stop the client (an inline engine is shut down) and commit every answer."""
        try:
            self._session.close()
        finally:
            if self._store is not None:
                self._store.flush()

    def __enter__(self) -> BatchClientLM:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ tokenizer, chat

    def _hf_tokenizer(self) -> Any:
        """The model's Hugging Face tokenizer (inline: the engine's; remote: ``tokenizer=``),
        or None when there is none here (remote with the server's ``/tokenize``)."""
        if self._hf is None:
            client = self._the_client()
            try:
                tokenizer = self._call(client.provider.tokenizer, self.model)
            except ConfigurationError:
                return None
            self._hf = tokenizer.tokenizer if isinstance(tokenizer, HFTokenizer) else None
        return self._hf

    @property
    def tokenizer_name(self) -> str:
        hf = self._hf_tokenizer()
        name = getattr(hf, "name_or_path", None) or self.model
        return str(name).replace("/", "__")

    def chat_template(self, chat_template: bool | str = False) -> str | None:
        if chat_template is False or chat_template is None:
            return None
        hf = self._hf_tokenizer()
        template = getattr(hf, "chat_template", None) if hf is not None else None
        if isinstance(template, dict):
            name = chat_template if isinstance(chat_template, str) else "default"
            template = template.get(name)
        return template if isinstance(template, str) else ""

    def apply_chat_template(
        self, chat_history: list[dict[str, str]], add_generation_prompt: bool = True
    ) -> str:
        """The model's chat template over ``chat_history`` as text (as lm-eval's ``vllm``
        backend renders it). Remote needs ``tokenizer=`` for this."""
        hf = self._hf_tokenizer()
        if hf is None:
            raise ConfigurationError(
                "chat templates need the model's tokenizer: give tokenizer=<local folder>"
            )
        text = hf.apply_chat_template(
            chat_history,
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
            continue_final_message=not add_generation_prompt,
        )
        return str(text)

    # ------------------------------------------------------------------ requests

    def _scope(self) -> dict[str, Any]:
        """What decides an answer besides its request: the weights serving the model
        (``cache_identity``: the served ``root``... for remote, the model path and engine
        arguments inline, so other weights under the same name are asked again), the model
        name and the tokenizer."""
        client = self._the_client()
        return {
            "identity": self._call(client.provider.cache_identity, self.model),
            "model": self.model,
            "tokenizer": self._tokenizer_arg,
        }

    def _answer(
        self,
        kind: str,
        args: list[Any],
        run: Callable[[BatchClient, list[Any], Callable[[int, Any], None], Any], Any],
        value: Callable[[Any], Any],
        desc: str,
    ) -> list[Any]:
        """Answers for ``args``: stored ones, the rest from ``run`` (stored as they arrive).
        ``value`` turns one item of the call into what lm-eval wants (None: it failed)."""
        client = self._the_client()
        scope = self._scope()
        keys = [request_key(scope, kind, a) for a in args]
        stored = self._store.get_many(keys) if self._store is not None else {}
        missing = [i for i, k in enumerate(keys) if k not in stored]
        answers = {i: stored[keys[i]] for i in range(len(args)) if keys[i] in stored}
        failures: list[tuple[int, BatchItemError]] = []
        if missing:
            bar = tqdm(total=len(missing), desc=desc)

            def progress(p: BatchProgress) -> None:
                if p.total and bar.total != p.total:  # rolling: windows, not texts
                    bar.total = p.total
                bar.n = p.done
                bar.refresh()

            def on_item(j: int, item: Any) -> None:
                i = missing[j]
                answer = value(item)
                if answer is None:
                    failures.append((i, item.error))
                    return
                answers[i] = answer
                if self._store is not None:
                    self._store.put(keys[i], answer, kind=kind, model=self.model)

            try:
                self._call(run, client, [args[i] for i in missing], on_item, progress)
            finally:
                bar.close()
                if self._store is not None:
                    self._store.flush()
        if failures:
            failures.sort(key=lambda f: f[0])
            error = BatchFailedError(failures, failures)
            lines = "\n".join(f"  request {i}: {e.code}: {e.message}" for i, e in failures[:10])
            error.add_note(
                f"{len(failures)} of {len(args)} {kind} requests failed:\n{lines}\nevery other "
                f"answer is stored in {self._state_dir}: a re-run sends only these"
            )
            raise error
        return [answers[i] for i in range(len(args))]

    def loglikelihood(self, requests: Sequence[Any], disable_tqdm: bool = False) -> list[Any]:
        args = [list(req.args) for req in requests]

        async def run(client: BatchClient, todo: list[Any], on_item: Any, progress: Any) -> None:
            pairs = [(str(c), str(x)) for c, x in todo]
            await client.batch_loglikelihood(self.model, pairs, on_item=on_item, progress=progress)

        answers = self._answer("loglikelihood", args, run, _score, "Running loglikelihood requests")
        out = [(float(a[0]), bool(a[1])) for a in answers]
        for arg, answer in zip(args, out, strict=True):
            self.cache_hook.add_partial("loglikelihood", tuple(arg), answer)
        return out

    def loglikelihood_rolling(
        self, requests: Sequence[Any], disable_tqdm: bool = False
    ) -> list[float]:
        args = [str(req.args[0]) for req in requests]

        async def run(client: BatchClient, todo: list[Any], on_item: Any, progress: Any) -> None:
            await client.batch_loglikelihood_rolling(
                self.model, todo, on_item=on_item, progress=progress
            )

        answers = self._answer(
            "loglikelihood_rolling", args, run, _rolling, "Running loglikelihood_rolling requests"
        )
        out = [float(a) for a in answers]
        for arg, answer in zip(args, out, strict=True):
            self.cache_hook.add_partial("loglikelihood_rolling", (arg,), answer)
        return out

    def generate_until(self, requests: Sequence[Any], disable_tqdm: bool = False) -> list[str]:
        eos = self._eos_text()
        prepared = [self._generation(str(req.args[0]), dict(req.args[1]), eos) for req in requests]
        args = [[context, params.model_dump(mode="json")] for context, params, _ in prepared]

        async def run(client: BatchClient, todo: list[Any], on_item: Any, progress: Any) -> None:
            await client.batch_completion(
                self.model,
                [context for context, _ in todo],
                [SamplingParams.model_validate(p) for _, p in todo],
                on_item=on_item,
                progress=progress,
            )

        texts = self._answer("generate_until", args, run, _text, "Running generate_until requests")
        out = []
        for req, text, (_, _, until) in zip(requests, texts, prepared, strict=True):
            answer = postprocess_generated_text(str(text), until, None)
            self.cache_hook.add_partial("generate_until", req.args, answer)
            out.append(answer)
        return out

    def _eos_text(self) -> str | None:
        hf = self._hf_tokenizer()
        if hf is None or getattr(hf, "eos_token_id", None) is None:
            return None
        return str(hf.decode(hf.eos_token_id)) or getattr(hf, "eos_token", None)

    def _generation(
        self, context: str, gen_kwargs: dict[str, Any], eos: str | None
    ) -> tuple[str, SamplingParams, list[str]]:
        """lm-eval's ``gen_kwargs`` as ``SamplingParams``, and the stop strings."""
        kwargs = dict(normalize_gen_kwargs(gen_kwargs, default_max_gen_toks=self.max_gen_toks))
        until = handle_stop_sequences(kwargs.pop("until", None), eos=eos)
        temperature = float(kwargs.get("temperature", 0.0))
        strategy: Any = GreedySamplingStrategy()
        if temperature > 0 and kwargs.get("top_k"):
            strategy = TopKSamplingStrategy(temperature=temperature, top_k=int(kwargs["top_k"]))
        elif temperature > 0:
            strategy = TopPSamplingStrategy(
                temperature=temperature, top_p=float(kwargs.get("top_p") or 1.0)
            )
        params = SamplingParams(
            strategy=strategy, max_tokens=int(kwargs["max_gen_toks"]), stop=until or None
        )
        return context, params, until


def _score(item: Any) -> list[Any] | None:
    return None if item.error is not None else [item.logprob, item.is_greedy]


def _rolling(item: Any) -> float | None:
    return None if item.error is not None else float(item.logprob)


def _text(item: Any) -> str | None:
    return None if item.error is not None else str(item.content)


def close_all() -> None:
    """Close every model still open (the command does this after lm-eval returns; an exit
    hook does it for scripts that never close theirs)."""
    for lm in list(_OPEN):
        with contextlib.suppress(Exception):
            lm.close()


atexit.register(close_all)
