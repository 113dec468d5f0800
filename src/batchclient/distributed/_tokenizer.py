"""The replicas' tokenizer, for the scoring calls on text: each call asks a live replica's
engine (its own tokenizer, as the inline provider's scoring uses), so the driver needs neither
the model's files nor ``transformers``, and the token boundaries are exactly the engine's."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from .._core.tokens import Tokenizer, TokenizerInfo
from ..errors import BatchClientError, ConfigurationError
from ..types import BatchItemError

__all__ = ["ReplicaTokenizer"]


class ReplicaTokenizer(Tokenizer):
    """``model``'s tokenizer on the replicas. ``actors`` gives the actors to ask, in order of
    preference (live replicas first); a replica that dies between two calls is skipped."""

    def __init__(self, model: str, actors: Callable[[], Sequence[Any]]) -> None:
        self._model = model
        self._actors = actors
        self._info: TokenizerInfo | None = None

    async def info(self) -> TokenizerInfo:
        if self._info is None:
            self._info = await self._ask("tokenizer_info", self._model)
        return self._info

    async def encode(
        self, texts: Sequence[str], *, add_special_tokens: bool = True
    ) -> list[list[int] | BatchItemError]:
        if not texts:
            return []
        ids: list[list[int] | BatchItemError] = await self._ask(
            "encode", self._model, list(texts), add_special_tokens
        )
        return ids

    async def _ask(self, method: str, *args: Any) -> Any:
        from ray.exceptions import RayActorError

        problem = "the replicas are not running: use the client in `async with`"
        for actor in self._actors():
            try:
                return await getattr(actor, method).remote(*args)
            except RayActorError as exc:  # died meanwhile: ask the next one
                problem = f"every replica is down ({type(exc).__name__}: {exc})"
            except Exception as exc:
                cause = getattr(exc, "cause", None)  # Ray wraps what the actor raised
                if isinstance(cause, BatchClientError):
                    raise cause from None
                raise
        raise ConfigurationError(f"no replica can tokenise for {self._model!r}: {problem}")
