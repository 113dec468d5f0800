"""The cost ledger: tokens by class, and what they cost at the prices a user gives.

A provider says how it bills (:class:`Billing`): its **tier** (``batch`` for the batch APIs,
``flex`` for ``service_tier="flex"``, ``standard`` for live calls, ``local`` for the engines
run here) and its **prompt-cache rule** (the shortest prefix it caches, and whether a cache
write is billed apart, as Anthropic's are). Dry runs use the rule to say how much input would be
read from a cache; finished runs report what the answers' ``usage`` said
(:mod:`batchclient._core.usage`).

Prices are never built in: they change, and differ by account and region. A **price table** is
a JSON file the user keeps (``--prices FILE``, :meth:`PriceTable.load`)::

    {
      "as_of": "2026-12-01",
      "source": "https://www.anthropic.com/pricing",
      "currency": "USD",
      "models": {
        "claude-sonnet-4-5": {
          "batch":    {"input": 1.5, "cached_input": 0.15, "cache_write": 3.0, "output": 7.5},
          "standard": {"input": 3.0, "cached_input": 0.3,  "cache_write": 6.0, "output": 15.0}
        }
      }
    }

Prices are per million tokens. ``cached_input`` and ``cache_write`` default to ``input``; a
model is found by its exact name, else by the longest name in the table that starts it (so
``claude-sonnet-4-5`` prices ``claude-sonnet-4-5-20250929``). Reasoning tokens are output
tokens and are billed as such.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..errors import ConfigurationError
from ..types import Cost, Tier

__all__ = ["Billing", "PriceTable", "TierPrices", "cost_of"]


@dataclass(frozen=True)
class Billing:
    """How a provider bills one model's requests: ``tier``; ``cache_min_tokens``: the shortest
    shared prefix its prompt cache takes (None: it has none a user pays less for);
    ``cache_writes``: whether writing to that cache is billed apart (Anthropic: yes; OpenAI and
    Gemini: no, a write is plain input); ``cache_min_requests``: how many requests must share a
    prefix before it is cached (Gemini's explicit caching waits for enough to pay for the
    storage)."""

    tier: Tier = "standard"
    cache_min_tokens: int | None = None
    cache_writes: bool = False
    cache_min_requests: int = 2


class TierPrices(BaseModel):
    """One model's prices on one tier, per million tokens (``cached_input`` and
    ``cache_write`` default to ``input``)."""

    model_config = ConfigDict(extra="forbid")

    input: float = Field(ge=0)
    cached_input: float | None = Field(default=None, ge=0)
    cache_write: float | None = Field(default=None, ge=0)
    output: float = Field(ge=0)


class PriceTable(BaseModel):
    """The prices a user gives (module docstring): ``as_of`` (the date they were read, shown
    with every cost), ``source``, ``currency``, ``models``: model -> tier -> prices."""

    model_config = ConfigDict(extra="forbid")

    as_of: str
    source: str | None = None
    currency: str = "USD"
    models: dict[str, dict[Tier, TierPrices]]

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> PriceTable:
        """The table in the JSON file ``path``.

        Raises:
            ConfigurationError: the file cannot be read, is not JSON or not a price table (the
                message names the field).
        """
        try:
            data = json.loads(Path(path).read_text())
            return cls.model_validate(data)
        except OSError as exc:
            raise ConfigurationError(f"prices {path}: {exc.strerror or exc}") from None
        except ValueError as exc:  # JSON and validation errors alike
            if isinstance(exc, ValidationError):
                first = exc.errors()[0]
                where = ".".join(str(p) for p in first["loc"])
                raise ConfigurationError(f"prices {path}: {where}: {first['msg']}") from None
            raise ConfigurationError(f"prices {path}: not JSON ({exc})") from None

    def prices(self, model: str, tier: Tier) -> TierPrices | None:
        """``model``'s prices on ``tier``: by its exact name, else the longest name in the table
        that starts it; None when the table has none."""
        names = [n for n in self.models if model == n or model.startswith(n)]
        for name in sorted(names, key=len, reverse=True):
            found = self.models[name].get(tier)
            if found is not None:
                return found
        return None


def cost_of(
    table: PriceTable,
    model: str,
    tier: Tier,
    *,
    input_tokens: int,
    cached_tokens: int = 0,
    cache_write_tokens: int = 0,
    output_tokens: int = 0,
) -> Cost | None:
    """The cost of tokens by class (``input_tokens`` all of the input, cached and
    cache-written ones included, as ``usage`` counts them); None when the table has no price for
    ``model`` on ``tier``."""
    p = table.prices(model, tier)
    if p is None:
        return None
    plain = max(0, input_tokens - cached_tokens - cache_write_tokens)
    cached_price = p.input if p.cached_input is None else p.cached_input
    write_price = p.input if p.cache_write is None else p.cache_write
    parts = (
        plain * p.input / 1e6,
        cached_tokens * cached_price / 1e6,
        cache_write_tokens * write_price / 1e6,
        output_tokens * p.output / 1e6,
    )
    return Cost(
        model=model, tier=tier, currency=table.currency, as_of=table.as_of,
        input=parts[0], cached_input=parts[1], cache_write=parts[2], output=parts[3],
        total=sum(parts),
    )  # fmt: skip
