"""One run of one mode in a fresh process: ``python -m batchclient.cli._bench._child SPEC.json``.

A fresh process per run makes the peak RSS that mode's own (a high-water mark cannot be reset
in a process that already ran another mode), keeps two engines from ever running at once, and
keeps one mode's leftovers (threads, connection pools, engine processes) out of the next one's
figures. The result (a :class:`~._spec.RunFigures` as JSON, or ``{"error": message}``) goes to
the spec's ``result_file``; vLLM's own output goes to stdout/stderr as usual.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import sys
import threading
import traceback
from pathlib import Path
from typing import Any

from ..._engine_defaults import quick_engine_stops
from ._spec import RunFigures, RunSpec, load_requests


class TreeRss:
    """Samples the resident memory of this process and all its descendants (the engine core
    and its workers are child processes) every ``interval_s``; ``stop()`` returns the peak sum
    in bytes. Sampling can miss a spike shorter than the interval."""

    def __init__(self, interval_s: float = 0.2) -> None:
        import psutil

        self._psutil = psutil
        self.peak_bytes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(interval_s,), daemon=True)
        self._thread.start()

    def _run(self, interval_s: float) -> None:
        me = self._psutil.Process()
        while True:
            total = 0
            with contextlib.suppress(self._psutil.Error):
                for proc in [me, *me.children(recursive=True)]:
                    with contextlib.suppress(self._psutil.Error):
                        total += proc.memory_info().rss
            self.peak_bytes = max(self.peak_bytes, total)
            if self._stop.wait(interval_s):
                return

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak_bytes


def run(spec: RunSpec) -> RunFigures:
    """Run ``spec.mode`` once on the spec's requests and measure it."""
    import anyio

    from . import _client_modes, _engine_modes

    requests = load_requests(Path(spec.requests_file))
    rss = TreeRss()
    items: Any
    if spec.mode in ("sequential", "remote"):
        items, wall = anyio.run(_client_modes.run_remote, spec, requests)
    elif spec.mode == "openai-gather":
        items, wall = anyio.run(_client_modes.run_openai_gather, spec, requests)
    elif spec.mode == "litellm":
        items, wall = _client_modes.run_litellm(spec, requests)
    elif spec.mode == "inline":
        items, wall = anyio.run(_engine_modes.run_inline, spec, requests)
    elif spec.mode in ("vllm-offline", "vllm-defaults"):  # the binding differs (harness env)
        items, wall = _engine_modes.run_vllm_offline(spec, requests)
    elif spec.mode == "ray":
        items, wall = anyio.run(_engine_modes.run_ray, spec, requests)
    else:
        raise ValueError(f"unknown mode {spec.mode!r}")
    figures = RunFigures.collect(requests, items, wall)
    # Sampled, not ru_maxrss: Linux keeps ru_maxrss across execve, so a child would report
    # the parent's high-water mark (the ShareGPT file and a tokenizer) as its own.
    figures.peak_rss_mb = rss.stop() / 2**20
    return figures


def main(argv: list[str]) -> int:
    spec = RunSpec.load(Path(argv[0]))
    try:
        with quick_engine_stops():  # the process exits right after the run
            out: dict[str, Any] = dataclasses.asdict(run(spec))
    except Exception as exc:
        traceback.print_exc()
        out = {"error": f"{type(exc).__name__}: {exc}"}
    Path(spec.result_file).write_text(json.dumps(out), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
