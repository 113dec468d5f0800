"""``batchclient cache``: what the result cache of a state directory holds, and clearing it."""

from __future__ import annotations

import argparse
import datetime as dt

import anyio

from .._state import exists
from ..cache import CacheStats
from ..errors import ConfigurationError
from ..jobs import JobManager
from ..jobs._runner import parse_window


def add_cache_arguments(p: argparse.ArgumentParser, common: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="cache_command", required=True, metavar="{stats,clear}")
    st = sub.add_parser(
        "stats", parents=[common], help="entries, stored bytes and hits, overall and per model"
    )
    st.set_defaults(func=_stats)
    cl = sub.add_parser("clear", parents=[common], help="delete cached answers")
    cl.add_argument(
        "--older-than",
        default=None,
        metavar="AGE",
        help="only entries stored longer ago than AGE (a number and s, m, h or d: 7d, 12h)",
    )
    cl.add_argument("--model", default=None, help="only entries of this model")
    cl.set_defaults(func=_clear)


def _manager(args: argparse.Namespace) -> JobManager:
    return JobManager(getattr(args, "state_dir", None))


def _stats(args: argparse.Namespace) -> int:
    async def go() -> CacheStats | None:
        async with _manager(args) as m:
            if not exists(m.state_dir / "batchclient.sqlite3"):
                return None
            cache = await m.result_cache()
            return await anyio.to_thread.run_sync(cache.stats)

    stats = anyio.run(go)
    if stats is None or stats.entries == 0:
        print("the result cache is empty")
        return 0
    print(
        f"{stats.entries:,} entries, {_size(stats.bytes)}, {stats.hits:,} hits; "
        f"stored {_when(stats.oldest)} .. {_when(stats.newest)}"
    )
    for model in stats.models:
        print(
            f"  {model.model}: {model.entries:,} entries, {_size(model.bytes)}, {model.hits:,} hits"
        )
    return 0


def _clear(args: argparse.Namespace) -> int:
    older = None
    if args.older_than is not None:
        try:
            older = parse_window(args.older_than)
        except ValueError as exc:
            raise ConfigurationError(f"--older-than: {exc}") from None

    async def go() -> int:
        async with _manager(args) as m:
            if not exists(m.state_dir / "batchclient.sqlite3"):
                return 0
            cache = await m.result_cache()
            return await anyio.to_thread.run_sync(
                lambda: cache.clear(older_than_s=older, model=args.model)
            )

    print(f"deleted {anyio.run(go):,} cached answer(s)")
    return 0


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB"):
        if n < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return f"{n:.1f} GiB"


def _when(ts: float | None) -> str:
    return "-" if ts is None else dt.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M")
