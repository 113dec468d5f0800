"""``VLLMOptions``: the named keyword options of :class:`VLLMProvider`, declared once.

The provider also takes vLLM's engine arguments (any ``AsyncEngineArgs`` field), which a
``TypedDict`` cannot leave open (``Unpack`` allows no other keys, and mypy does not support
PEP 728's ``extra_items``), so the provider and ``VLLMBatchInference`` take ``**options: Any``
and split them (:func:`batchclient._options.split`): these options, resolved against their
declarations here, and the rest, the engine's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, TypedDict

from .._options import Option

__all__ = ["SINGLE_TOKEN_SCORING", "TOOL_CALL_PARSER", "VLLMOptions"]

TOOL_CALL_PARSER = Option(
    None,
    "The vLLM tool parser that reads calls from answers of a model whose chat template renders "
    "tools itself (the names of vLLM's --tool-call-parser: hermes, llama3_json, pythonic, ...). "
    "None: tools are written into the system prompt in the call's tool_prompt_format and calls "
    "are read back by batchclient, which works for any model, the bundled one included "
    "(docs/structured.md).",
    metavar="NAME",
)
SINGLE_TOKEN_SCORING = Option(
    True,
    "Score log-likelihood requests with generation requests over the context, which read the "
    "prefix cache, instead of asking for the prompt's log-probabilities, which makes vLLM "
    "prefill the whole prompt: a one-token continuation by one request per context "
    "(max_tokens 1, greedy, vLLM's logprob_token_ids; the same scores bit for bit in float32), "
    "a continuation of 2-16 tokens by teacher forcing (the request is made to generate the "
    "continuation's tokens; within 1e-4 in float32). Longer ones (rolling windows) keep the "
    "prompt_logprobs way (docs/evals.md, Shared prefixes). False: every continuation the "
    "prompt_logprobs way.",
)
"""Options the Ray provider's replicas share (``RayOptions`` declares them with these)."""


class VLLMOptions(TypedDict, total=False):
    """The named keyword options of ``VLLMProvider`` and ``VLLMBatchInference``; engine
    arguments come on top."""

    max_concurrency: Annotated[
        int,
        Option(
            1024,
            "Requests handed to the engine at once, shared by every call on the client. The "
            "engine batches them (up to its max_num_seqs) and queues the rest; the limit keeps "
            "a 100k-conversation call from building 100k engine requests at once. Below "
            "max_num_seqs it limits the batch size.",
        ),
    ]
    tool_call_parser: Annotated[str | None, TOOL_CALL_PARSER]
    verbose: Annotated[
        bool,
        Option(
            False,
            "Show everything vLLM prints (about 66 INFO lines per engine start); by default "
            "only its warnings and errors. BATCHCLIENT_VERBOSE=1 in the environment does the "
            "same as True; a VLLM_LOGGING_LEVEL set there always wins.",
        ),
    ]
    cpu_cores: Annotated[
        Sequence[int] | None,
        Option(
            None,
            "On a CPU build of vLLM, the cores the engine's compute threads are bound to (None: "
            "every core of this process's CPU affinity). Ignored when VLLM_CPU_OMP_THREADS_BIND "
            "is set (vLLM's own knob: auto, nobind, or a core list). See docs/inline.md (Speed).",
        ),
    ]
    single_token_scoring: Annotated[bool, SINGLE_TOKEN_SCORING]
