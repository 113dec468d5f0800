"""``RayOptions``: the named keyword options of :class:`RayProvider`, declared once.

As with the inline provider, vLLM's engine arguments come on top, which a ``TypedDict``
cannot leave open, so the provider and ``RayBatchInference`` take ``**options: Any`` and split
them (:func:`batchclient._options.split`) into these options and the engine's arguments.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, TypedDict

from .._options import Option
from .._routing.settings import PREFIX_AFFINITY
from ..inline._options import SINGLE_TOKEN_SCORING, TOOL_CALL_PARSER

__all__ = ["RayOptions"]


class RayOptions(TypedDict, total=False):
    """The named keyword options of ``RayProvider`` and ``RayBatchInference``; engine
    arguments come on top."""

    replicas: Annotated[int, Option(1, "How many engines (Ray actors).")]
    address: Annotated[
        str | None,
        Option(
            None,
            "The Ray cluster: None joins the Ray this process already initialised, else starts "
            "a local one for the client (no dashboard; shut down on exit); auto or "
            "ray://host:10001 connects to an existing cluster.",
            metavar="ADDRESS",
        ),
    ]
    resources_per_replica: Annotated[
        Mapping[str, Any] | None,
        Option(
            None,
            "Ray resources of each actor: num_cpus (default 1), num_gpus (default: tensor x "
            "pipeline parallel size when the cluster has GPUs, else none), memory (bytes), "
            "accelerator_type, or custom resources.",
        ),
    ]
    max_concurrency: Annotated[
        int,
        Option(
            1024,
            "Requests in flight per replica (the engine batches up to its max_num_seqs of them).",
        ),
    ]
    max_restarts: Annotated[
        int,
        Option(
            3,
            "How often Ray may restart a replica's actor after it dies (-1: without limit); a "
            "restarted replica builds a new engine and is taken back.",
        ),
    ]
    cores_per_replica: Annotated[
        int | None,
        Option(
            None,
            "CPU builds: how many cores each replica's engine binds, each replica its own "
            "(None: on a one-node Ray, this machine's cores divided among the replicas; on a "
            "cluster, num_cpus). Ignored when VLLM_CPU_OMP_THREADS_BIND is set.",
        ),
    ]
    restart_wait_s: Annotated[
        float,
        Option(
            600.0,
            "Seconds requests wait for a restarting replica when every replica is down, after "
            "which they fail with endpoint_unavailable.",
        ),
    ]
    tool_call_parser: Annotated[str | None, TOOL_CALL_PARSER]
    single_token_scoring: Annotated[bool, SINGLE_TOKEN_SCORING]
    prefix_affinity: Annotated[bool, PREFIX_AFFINITY]
    runtime_env: Annotated[
        Mapping[str, Any] | None,
        Option(None, "A Ray runtime environment for the actors (env_vars, pip, ...)."),
    ]
