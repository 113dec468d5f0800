"""The result cache: successful answers kept in the state directory's SQLite database and
given again to an identical request on an identical provider (guide: ``docs/jobs.md``,
"Result cache").

Off unless asked for (``BatchClient(..., cache=True)``, ``cache=`` per call or batch,
``batchclient run --cache``): a cache that answers silently surprises whoever benchmarks or has
just swapped a model. The key is the endpoint, the canonical request body, the provider's cache
identity (remote: the base URLs and what ``/v1/models`` says about the model; inline: the model
path and the engine arguments that change answers) and a repeat index, so ``k`` samples of one
prompt are ``k`` entries.

- :class:`ResultCache`: the table (``stats``, ``clear``; ``batchclient cache stats | clear``);
- :class:`CachedProvider`: a provider answering from it before asking the one it wraps;
- :func:`cache_key`, :func:`request_digest`, :func:`canonical_json`, :func:`is_deterministic`:
  what makes two requests the same.
"""

from ._store import CacheStats, ModelCacheStats, ResultCache

__all__ = [
    "CacheStats",
    "ModelCacheStats",
    "ResultCache",
]
