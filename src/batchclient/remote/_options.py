"""``RemoteOptions``: the keyword options of :class:`RemoteProvider`, declared once.

Each entry's ``Option`` holds its default and its help: ``RemoteProvider`` resolves what it is
given against them, ``RemoteBatchInference`` takes them as ``**options: Unpack[RemoteOptions]``
and lists them in its docstring, and the CLI derives its flags from them
(:mod:`batchclient._options`). A new option is added here and read in ``RemoteProvider``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Annotated, Literal, TypedDict

from .._options import Option
from .._routing.settings import (
    PREFIX_AFFINITY,
    AdaptiveConcurrency,
    Ejection,
    RateLimits,
    RetryPolicy,
)
from ._settings import HttpOptions, Timeouts, Verify

__all__ = ["EMBEDDING_GROUP_SIZE", "FLEX_TIMEOUT_S", "RemoteOptions"]

EMBEDDING_GROUP_SIZE = 16
"""Default one-input embedding requests sent as one ``/v1/embeddings`` request
(``embedding_group_size``; ``docs/remote.md``, "Embeddings in groups")."""

FLEX_TIMEOUT_S = 900.0
"""``timeout_s`` when ``service_tier="flex"`` and none is given: OpenAI's flex processing guide
raises the client timeout to 15 minutes, as flex answers can take that long."""


class RemoteOptions(TypedDict, total=False):
    """The keyword options of ``RemoteProvider`` and ``RemoteBatchInference`` (every one
    optional)."""

    max_concurrency: Annotated[
        int,
        Option(
            256,
            "Most requests in flight per replica and model (requests); with adaptive, the "
            "ceiling of the limit it finds.",
        ),
    ]
    max_retries: Annotated[
        int,
        Option(
            4,
            "Retries of one request after its first attempt, for transient failures (connection "
            "errors, timeouts, 408/409/429/5xx); 400/401/403/404/422 are never retried.",
        ),
    ]
    timeout_s: Annotated[
        float,
        Option(
            600.0,
            "Seconds one attempt may take, counted from when it is sent (never from when it was "
            "queued).",
        ),
    ]
    rpm: Annotated[
        float | None,
        Option(
            None,
            "Requests per minute per replica (None: no limit), shared by every call and batch "
            "of the client. Quotas a server announces in x-ratelimit-* headers are followed "
            "without it.",
        ),
    ]
    tpm: Annotated[
        float | None,
        Option(
            None,
            "Tokens per minute per replica (None: no limit): estimated before sending, settled "
            "with the answer's usage.",
        ),
    ]
    headers: Annotated[
        Mapping[str, str] | None,
        Option(
            None,
            "Extra HTTP headers for every request (a CR/LF or non-latin-1 value is a "
            "ConfigurationError naming the header).",
        ),
    ]
    default_query: Annotated[
        Mapping[str, str] | None,
        Option(
            None,
            "Query parameters added to every request (e.g. api-version=2024-10-21); they "
            "override the base URL's own.",
        ),
    ]
    proxy: Annotated[
        str | None,
        Option(
            None,
            "An http:// or https:// proxy for every replica (user:password@ in it is sent as "
            "Proxy-Authorization). None: with trust_env, the environment's HTTPS_PROXY / "
            "HTTP_PROXY / ALL_PROXY, honouring NO_PROXY.",
            metavar="URL",
        ),
    ]
    trust_env: Annotated[bool, Option(True, "Read proxies from the environment.")]
    verify: Annotated[
        Verify,
        Option(
            True,
            "TLS certificate verification for https://: True (the system's CAs), a CA bundle "
            "file or directory (a private CA's ca.pem), an ssl.SSLContext, or False (no "
            "verification: only for testing).",
        ),
    ]
    adaptive: Annotated[
        AdaptiveConcurrency | bool,
        Option(
            True,
            "An AdaptiveConcurrency (True: its defaults) that adapts the in-flight limit to "
            "throttling; False for a fixed limit of max_concurrency.",
        ),
    ]
    retry: Annotated[
        RetryPolicy, Option(RetryPolicy(), "Backoff and Retry-After handling (RetryPolicy).")
    ]
    rate_limits: Annotated[
        RateLimits,
        Option(
            RateLimits(),
            "The period of rpm and tpm and the initial output estimate (RateLimits).",
        ),
    ]
    ejection: Annotated[
        Ejection,
        Option(Ejection(), "When a failing replica is taken out, and for how long (Ejection)."),
    ]
    timeouts: Annotated[
        Timeouts, Option(Timeouts(), "Connect and model-listing timeouts (Timeouts).")
    ]
    http: Annotated[
        HttpOptions,
        Option(
            HttpOptions(),
            "Client certificate, answer size cap, keep-alive expiry (HttpOptions).",
        ),
    ]
    check_model: Annotated[
        bool,
        Option(
            True,
            "Ask GET /models once per model and raise ModelNotFoundError for a model the "
            "replicas do not list (skipped where they cannot list models).",
        ),
    ]
    tokenizer: Annotated[
        str | os.PathLike[str] | None,
        Option(
            None,
            "A local folder with the model's tokenizer files, for the scoring calls on text "
            "(batch_loglikelihood, batch_loglikelihood_rolling; needs transformers). None: the "
            "server's /tokenize route (vLLM), and a ConfigurationError at the call when the "
            "server has none.",
        ),
    ]
    embedding_group_size: Annotated[
        int,
        Option(
            EMBEDDING_GROUP_SIZE,
            "How many one-input /v1/embeddings requests in flight together (same model and "
            "parameters) are sent as one request with a list input (1: each alone). Each input "
            "keeps its own result, error and cache entry; a group the server refuses with "
            "400/413/422 is split until only the refused input fails.",
        ),
    ]
    prefix_affinity: Annotated[bool, PREFIX_AFFINITY]
    prompt_caching: Annotated[
        bool | Literal["auto"],
        Option(
            "auto",
            "Send a prompt_cache_key with each chat request whose prefix (every message but "
            "the last, 1,024 tokens or more) other requests of its call or batch share: one key "
            "per prefix, so that they reach the same cache. auto: to OpenAI's and Azure "
            "OpenAI's hosts only; true: to any server; false: never. A body's own "
            "prompt_cache_key is kept.",
        ),
    ]
    prompt_cache_retention: Annotated[
        str | None,
        Option(
            None,
            "Sent as prompt_cache_retention with every request that carries a "
            "prompt_cache_key (OpenAI: in_memory or 24h); a body's own is kept.",
            metavar="POLICY",
        ),
    ]
    api: Annotated[
        Literal["chat", "responses"],
        Option(
            "chat",
            "Where chat requests go: chat (/v1/chat/completions) or responses (/v1/responses, "
            "for models served only there: system messages become instructions, max_tokens "
            "max_output_tokens, response_format text.format; answers come back as chat "
            "completions with the reasoning summary and reasoning tokens kept). A field the "
            "Responses API has no place for (stop, seed, logprobs, n > 1, penalties) is that "
            "item's unsupported_parameter.",
        ),
    ]
    service_tier: Annotated[
        str | None,
        Option(
            None,
            "Sent as service_tier with every request, a body's own kept (OpenAI, Gemini and "
            "Groq take flex: batch prices, answers in minutes). With flex, timeout_s defaults "
            "to 900, and capacity refusals (429 resource_unavailable, 498, 503) are waited out "
            "and sent again, past max_retries, until timeout_s after the first send.",
            metavar="TIER",
        ),
    ]
    flex_fallback_after_s: Annotated[
        float | None,
        Option(
            None,
            "With service_tier flex: a request still unanswered this many seconds after its "
            "first send is sent on the server's standard tier instead (without service_tier; "
            "an attempt still in flight is abandoned). None: never.",
        ),
    ]
