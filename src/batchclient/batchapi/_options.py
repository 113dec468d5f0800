"""The options of the remote batch providers, declared once (``batchclient._options``):
:class:`RemoteBatchOptions`, what every batch API takes, extended by each backend's own
(:class:`BatchAPIOptions`, :class:`AnthropicBatchOptions`, :class:`GeminiBatchOptions`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Literal, TypedDict

from .._core.client import BatchClient
from .._core.provider import Provider
from .._options import Option
from .._routing.settings import RetryPolicy

__all__ = ["AnthropicBatchOptions", "BatchAPIOptions", "GeminiBatchOptions", "RemoteBatchOptions"]

POLL_INTERVAL_S = 10.0
"""Every batch API's default poll interval: little next to a remote batch's minutes to hours (a
``batchclient serve`` batch of seconds is not held up), and six polls a minute per batch stay
far under every provider's request limits."""


class RemoteBatchOptions(TypedDict, total=False):
    """What every remote batch API takes (``batch-api``, ``anthropic-batch``,
    ``gemini-batch``)."""

    poll_interval_s: Annotated[
        float, Option(POLL_INTERVAL_S, "Seconds between two polls of one remote batch.")
    ]
    completion_window: Annotated[
        str | None,
        Option(
            None,
            "How long a call's remote batches may run, e.g. 24h or 90m; None: the API's own "
            "(24h; Gemini 48h). OpenAI's own host and Together take only 24h, Groq 24h to 7d, "
            "Mistral whole hours up to 7d, Anthropic only 24h. The call's local job expires "
            "this long (plus expiry_grace_s) after it starts; a batch of client.batches has "
            "its own window.",
        ),
    ]
    max_attempts: Annotated[
        int,
        Option(
            3,
            "Remote batches one request is sent in: a request that comes back expired, "
            "rate-limited (429), with a 5xx or overloaded error, or whose batch failed "
            "without naming it, goes into a new remote batch until then. Answers and final "
            "errors (a validation error naming the request) are never sent again.",
        ),
    ]
    max_retries: Annotated[
        int,
        Option(
            8,
            "Retries of one API call (upload, create, cancel, results) after a transient "
            "failure: a connection error, a timeout, 408/409/429/5xx. Polls retry without "
            "limit: the remote batch runs on while its server has a bad hour.",
        ),
    ]
    timeout_s: Annotated[
        float, Option(600.0, "Seconds without progress on one HTTP call before it is retried.")
    ]
    max_lines: Annotated[
        int | None,
        Option(
            None,
            "The most requests in one remote batch; None: the API's limit (batch-api: the "
            "flavour's, 50000; anthropic-batch 95000, 95% of its cap; gemini-batch 100000). "
            "Larger inputs are split into remote batches that run at once.",
        ),
    ]
    max_bytes: Annotated[
        int | None,
        Option(
            None,
            "The largest remote batch in bytes; None: the API's limit (batch-api: 200 MiB for "
            "openai, 100 MiB for the other flavours; anthropic-batch 95% of 256 MB; "
            "gemini-batch 95% of 2 GB). A single request above it is an invalid_request item.",
        ),
    ]
    expiry_grace_s: Annotated[
        float,
        Option(
            600.0,
            "Seconds past the local job's window that its remote batches are still waited "
            "for before they are cancelled (remote batches are created a little after the "
            "local job, so they expire a little later).",
        ),
    ]
    on_expired: Annotated[
        Provider | BatchClient | None,
        Option(
            None,
            "A provider (or a client: its provider) that runs, live, what is still not run "
            "after max_attempts remote batches; None: batch_expired items. Started and "
            "stopped with this provider.",
            flag=False,
        ),
    ]
    retry: Annotated[
        RetryPolicy,
        Option(
            RetryPolicy(),
            "Backoff between retries and the longest Retry-After honoured (RetryPolicy).",
            flag=False,
        ),
    ]
    headers: Annotated[
        Mapping[str, str] | None,
        Option(None, "Extra HTTP headers for every call (a CR, LF or NUL in a value is refused)."),
    ]


class BatchAPIOptions(RemoteBatchOptions, total=False):
    """The options of ``batch-api``: an OpenAI-shaped Batch API (``/v1/files`` +
    ``/v1/batches``)."""

    flavor: Annotated[
        Literal["openai", "together", "groq", "mistral"] | None,
        Option(
            None,
            "The provider's variant of the OpenAI Batch API (statuses, timestamps, file "
            "purpose, paths and paging are translated); None: named by the base URL's host "
            "(api.together.xyz, api.groq.com, api.mistral.ai), else openai.",
        ),
    ]
    check_model: Annotated[
        bool,
        Option(
            True,
            "Ask GET /models once per model and raise ModelNotFoundError for one the server "
            "does not list (skipped when it cannot list models).",
        ),
    ]
    tokenizer: Annotated[
        str | None,
        Option(
            None,
            "A local folder with the model's tokenizer files, for the scoring calls on text "
            "(batch_loglikelihood, batch_loglikelihood_rolling, lm-eval) and exact prompt "
            "token counts in dry runs; scoring token ids needs none.",
            metavar="DIR",
        ),
    ]
    prompt_caching: Annotated[
        bool | Literal["auto"],
        Option(
            "auto",
            "Add a prompt_cache_key to each chat line whose prefix (every message but the last, "
            "1,024 tokens or more) another line of its remote batch shares: one key per prefix. "
            "auto: on OpenAI's and Azure OpenAI's hosts only; true: any server; false: never. "
            "A line's own key is kept.",
        ),
    ]
    output_expires_after_s: Annotated[
        int | None,
        Option(
            None,
            "Sent as output_expires_after (anchor created_at) with each remote batch: the "
            "server deletes its output and error files this many seconds after the batch's "
            "creation (OpenAI: 3600 to 2592000; sent to OpenAI and batchclient serve only). "
            "Results are downloaded as soon as a remote batch ends, so this never loses them.",
            metavar="SECONDS",
        ),
    ]
    api: Annotated[
        Literal["chat", "responses"],
        Option(
            "chat",
            "Where chat lines go: chat (/v1/chat/completions batches) or responses "
            "(/v1/responses batches, for models served only there: each line sent as the "
            "Responses request it stands for, each answer read back as a chat completion with "
            "the reasoning summary and tokens kept). A field the Responses API has no place "
            "for (stop, seed, logprobs, n > 1, penalties) is that line's "
            "unsupported_parameter.",
        ),
    ]


class AnthropicBatchOptions(RemoteBatchOptions, total=False):
    """The options of ``anthropic-batch``: Anthropic Message Batches."""

    api_version: Annotated[
        str,
        Option(
            "2023-06-01",
            "The anthropic-version header. 2023-06-01 accepts temperature, top_p and top_k; "
            "under 2026-10-21 (the SDK's own) a request carrying one is an "
            "unsupported_parameter item.",
        ),
    ]
    max_tokens: Annotated[
        int, Option(4096, "max_tokens of a request that sets none (Anthropic requires one).")
    ]
    prompt_caching: Annotated[
        bool | Literal["auto"],
        Option(
            "auto",
            "Mark each request's last content block shared with another request of its remote "
            "batch, when that prefix reaches the model's minimum cacheable length, with "
            'cache_control {"type": "ephemeral", "ttl": "1h"}: cache reads cost a tenth of the '
            "input price. auto and true: mark; false: never. A request's own marks are kept "
            "(at most 4 in all).",
        ),
    ]


class GeminiBatchOptions(RemoteBatchOptions, total=False):
    """The options of ``gemini-batch``: the Gemini Batch API (Developer API)."""

    inline_bytes: Annotated[
        int,
        Option(
            1024**2,
            "Remote batches up to this many bytes go inline in the create call, larger ones "
            "are uploaded as a file first (inline requests pass through the SDK's types, "
            "slower than an upload for large batches); at most 95% of Gemini's 20 MB inline "
            "cap.",
        ),
    ]
    prompt_caching: Annotated[
        bool | Literal["auto"],
        Option(
            "auto",
            "Create a prefix (system text, tools and every turn but the last) shared by the "
            "requests of a remote batch once as a Gemini cached content, read by each of them "
            "at the cached price and deleted when the batch ends, when it reaches the model's "
            "minimum cacheable length. auto: when 10 or more requests share it (an hour of "
            "storage paid back), else Gemini's implicit caching; true: when 2 do; false: never.",
        ),
    ]
