"""``BatchInference`` (the protocol eval code is written against) and ``BatchClient`` (what
every client is) cannot drift apart: every call of the protocol has the same signature on the
client and on each client class of the package, down to the annotations' text."""

from __future__ import annotations

import inspect
from typing import Any

import pytest

import batchclient
from batchclient import BatchClient, BatchInference


def protocol_methods() -> list[str]:
    return sorted(
        name
        for name, member in vars(BatchInference).items()
        if not name.startswith("_") and inspect.isfunction(member)
    )


def clients() -> list[type[BatchClient]]:
    """``BatchClient`` and every client class exported by the package."""
    found = [BatchClient]
    for name in batchclient.__all__:
        member = getattr(batchclient, name)
        if inspect.isclass(member) and issubclass(member, BatchClient) and member not in found:
            found.append(member)
    return found


def shape(function: Any) -> list[tuple[str, str, str, str]]:
    """Each parameter's name, kind, default and annotation (as text), and the return."""
    signature = inspect.signature(function)
    rows = [
        (p.name, p.kind.name, repr(p.default), str(p.annotation))
        for p in signature.parameters.values()
    ]
    return [*rows, ("return", "", "", str(signature.return_annotation))]


def test_the_protocol_is_the_five_original_calls_and_the_rest() -> None:
    original = {"batch_chat_completion", "schedule_batch", "job_status", "job_cancel",
                "job_result"}  # fmt: skip
    added = {"batch_completion", "batch_loglikelihood", "batch_loglikelihood_rolling",
             "batch_embeddings"}  # fmt: skip
    assert original | added <= set(protocol_methods())
    assert {"files", "batches"} <= {
        name for name, m in vars(BatchInference).items() if isinstance(m, property)
    }
    assert len(clients()) >= 5  # BatchClient and the four providers' clients


@pytest.mark.parametrize("name", protocol_methods())
@pytest.mark.parametrize("client", clients(), ids=lambda c: c.__name__)
def test_every_call_has_the_protocols_signature(name: str, client: type[BatchClient]) -> None:
    assert shape(getattr(client, name)) == shape(getattr(BatchInference, name))


@pytest.mark.parametrize(
    "name", ["batch_completion", "batch_loglikelihood", "batch_loglikelihood_rolling",
             "batch_embeddings", "batch_chat_completion"],
)  # fmt: skip
def test_every_batch_call_takes_the_same_keyword_options(name: str) -> None:
    keywords = [
        p.name
        for p in inspect.signature(getattr(BatchInference, name)).parameters.values()
        if p.kind is inspect.Parameter.KEYWORD_ONLY and p.name != "encoding_format"
    ]
    assert keywords == ["custom_ids", "progress", "on_item", "raise_on_error", "cache"]
