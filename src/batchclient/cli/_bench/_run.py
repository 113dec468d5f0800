"""``batchclient bench``: the run (server phase, engine phase, report); options in ``_args``.

Order of a run: sample the requests once; start the vLLM server (unless ``--base-url``) and run
the server modes, each run in a fresh process, repeats interleaved (run 1 of every mode, then
run 2, ...) so slow drift on the machine spreads over all modes; stop the server; run the engine
modes the same way, so an engine never shares the cores or memory with the server or another
engine; then write the JSON, the chart and the Markdown table.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import batchclient

from ..._engine_defaults import choose_dtype, vllm_on_cpu
from ..._logs import VERBOSE_ENV, copy_output, is_verbose, vllm_env
from ...errors import ConfigurationError
from . import _report
from ._args import check_args, command_line
from ._spec import (
    ALL_MODES,
    ENGINE_MAX_NUM_BATCHED_TOKENS,
    ENGINE_MAX_NUM_SEQS,
    ENGINE_MODES,
    UNBOUND_MODES,
    BenchRequest,
    RunFigures,
    RunSpec,
    save_requests,
)
from ._stats import ModeRow, add_ratios, run_row, targets


def bench_command(args: argparse.Namespace) -> int:
    """Run the benchmark (or re-render a saved one) and print the Markdown report."""
    if args.from_json is not None:
        import json

        report = json.loads(args.from_json.read_text(encoding="utf-8"))
        json_path = args.from_json
    else:
        report = run(args)
        json_path = args.out / f"{args.name}.json"
        _report.write_json(report, json_path)
    chart = json_path.with_suffix(".png")
    _report.write_chart(report, chart)
    text = _report.markdown(report, chart.name)
    json_path.with_suffix(".md").write_text(text, encoding="utf-8")
    if args.update_doc is not None:
        _report.update_doc(args.update_doc, report, chart)
    print(text)
    print(
        f"wrote {json_path}, {chart.name} and {json_path.with_suffix('.md').name}", file=sys.stderr
    )
    return 0


# ---------------------------------------------------------------------------- the run


def load_data(args: argparse.Namespace) -> tuple[list[BenchRequest], str]:
    """The requests and a one-line description of where they came from."""
    from ._data import jsonl_requests, sharegpt_requests

    if args.input is not None:
        requests = jsonl_requests(args.input, n=args.n, max_tokens=args.max_tokens)
        return requests, f"{args.input} (first {len(requests)} lines)"
    if args.model not in (None, "smollm2"):
        raise ConfigurationError(
            "ShareGPT sampling counts tokens with the bundled model's "
            "tokenizer; with --model, give --input FILE.jsonl"
        )
    requests = sharegpt_requests(args.n, seed=args.seed, max_tokens=args.max_tokens)
    return requests, (
        f"ShareGPT V3 by vLLM's rules (seed {args.seed}), output length = reference reply's, "
        f"capped at {args.max_tokens}"
    )


def plan(args: argparse.Namespace) -> list[ModeRow]:
    """One row per mode (remote: per concurrency), in report order; modes whose package is
    missing are rows with ``skipped`` set."""
    peer = args.peer_max_concurrency or max(args.max_concurrency)
    rows: list[ModeRow] = []
    for mode in ALL_MODES:
        if mode not in args.modes:
            continue
        if mode == "sequential":
            rows.append(ModeRow("sequential", mode, 1))
        elif mode == "remote":
            rows += [ModeRow(f"remote@{c}", mode, c) for c in dict.fromkeys(args.max_concurrency)]
        elif mode in ("openai-gather", "litellm"):
            rows.append(ModeRow(f"{mode}@{peer}", mode, peer))
        elif mode == "ray":
            rows += [
                ModeRow(f"ray-{n}", mode, None, replicas=n) for n in dict.fromkeys(args.replicas)
            ]
        else:
            rows.append(ModeRow(mode, mode, None))
    for row in rows:
        package = {"litellm": "litellm", "openai-gather": "openai"}.get(row.mode)
        needs = [package] if package else []
        if row.mode in ENGINE_MODES:
            needs = ["vllm", *(["ray"] if row.mode == "ray" else [])]
        missing = [name for name in needs if importlib.util.find_spec(name) is None]
        if missing:
            row.skipped = f"not installed (pip install {' '.join(missing)})"
    return rows


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run every planned mode ``--repeat`` times; return the report (what the JSON holds)."""
    from ...models import resolve_model

    check_args(args)
    started, started_at = time.monotonic(), _report.stamp()
    default_name, model_ref = resolve_model(args.model)
    model_name = args.served_model_name or default_name
    requests, source = load_data(args)
    rows = plan(args)
    env = _report.environment(model_name, str(model_ref))
    server_rows = [r for r in rows if r.mode not in ENGINE_MODES and not r.skipped]
    engine_rows = [r for r in rows if r.mode in ENGINE_MODES and not r.skipped]
    with tempfile.TemporaryDirectory(prefix="batchclient-bench-") as tmp:
        work = Path(tmp)
        save_requests(requests, work / "all.json")
        save_requests(requests[: args.sequential_n], work / "sequential.json")
        base = RunSpec(
            mode="",
            requests_file="",
            result_file="",
            model_name=model_name,
            model_path=str(model_ref),
            max_model_len=args.max_model_len,
            kv_cache_gib=args.kv_cache_gib,
            warmup=not args.no_warmup,
        )
        if server_rows:
            with _server(args, model_ref, model_name) as url:
                base.base_url = url
                reset = None if args.base_url else _reset_prefix_cache
                _run_rows(server_rows, base, work, args, before_each=reset)
        _run_rows(engine_rows, base, work, args)
    for row in rows:
        row.finish()
    add_ratios(rows)
    peer = args.peer_max_concurrency or max(args.max_concurrency)
    return {
        "command": command_line(args),
        "started_at": started_at,
        "total_s": time.monotonic() - started,
        "note": "one invocation; on a shared machine the figures are noisy",
        "environment": env,
        "server": f"given: {args.base_url}" if args.base_url else _server_text(args),
        "engine": {
            "binding": harness_binding(),
            "dtype": choose_dtype(cpu=vllm_on_cpu()).value,
            "max_model_len": args.max_model_len,
            "enforce_eager": True,
            "kv_cache_gib": args.kv_cache_gib,
            "max_num_seqs": ENGINE_MAX_NUM_SEQS,
            "max_num_batched_tokens": ENGINE_MAX_NUM_BATCHED_TOKENS,
        },
        "data": {
            "source": source,
            "requests": len(requests),
            "seed": args.seed if args.input is None else None,
            "max_tokens_cap": args.max_tokens,
            "max_tokens_min": min(r.max_tokens for r in requests),
            "max_tokens_max": max(r.max_tokens for r in requests),
            "max_tokens_sum": sum(r.max_tokens for r in requests),
            "sequential_n": min(args.sequential_n or len(requests), len(requests)),
        },
        "repeat": args.repeat,
        "concurrency": list(args.max_concurrency),
        "peer_concurrency": peer,
        "rows": [r.to_json() for r in rows],
        "targets": targets(rows, peer),
    }


def harness_binding() -> str:
    """The ``VLLM_CPU_OMP_THREADS_BIND`` the server, ``inline`` and ``vllm-offline`` get (the
    caller's value if set, else every core of this process's affinity, as the inline provider
    binds by default), so their comparison is fair; on GPUs vLLM ignores it."""
    from ..._cpu import THREADS_BIND, affinity, bind_mask

    return os.environ.get(THREADS_BIND) or bind_mask(affinity()) or "auto"


def _server_text(args: argparse.Namespace) -> str:
    return (
        f"started by the harness (vLLM OpenAI server, threads bound to {harness_binding()}, "
        f"eager, {args.kv_cache_gib} GiB KV cache, "
        f"max_num_seqs {ENGINE_MAX_NUM_SEQS}, max_num_batched_tokens "
        f"{ENGINE_MAX_NUM_BATCHED_TOKENS}, prefix cache emptied before every run), "
        "stopped before the engine modes"
    )


@contextlib.contextmanager
def _server(args: argparse.Namespace, model_ref: Any, model_name: str) -> Iterator[str]:
    if args.base_url:
        yield args.base_url.rstrip("/")
        return
    from ..._cpu import THREADS_BIND
    from ...testing import vllm_server

    _say("starting the vLLM server ...")
    with vllm_server(
        model_ref,
        served_model_name=model_name,
        max_model_len=args.max_model_len,
        kv_cache_memory_bytes=args.kv_cache_gib << 30,
        max_num_seqs=ENGINE_MAX_NUM_SEQS,
        max_num_batched_tokens=ENGINE_MAX_NUM_BATCHED_TOKENS,
        verbose=args.verbose,
        # dev mode for POST /reset_prefix_cache (loopback only), see _reset_prefix_cache
        env={THREADS_BIND: harness_binding(), "VLLM_SERVER_DEV_MODE": "1"},
    ) as url:
        yield url
    _say("server stopped")


def _reset_prefix_cache(base_url: str) -> None:
    """Empty the harness server's prefix cache, so a server run does not find the prompts of
    the runs before it cached (every engine run starts with a fresh engine). Raises
    ``ConfigurationError`` when the server refuses (the figures would not be comparable)."""
    import httpx

    root = base_url.removesuffix("/v1")
    answer = httpx.post(f"{root}/reset_prefix_cache", timeout=60)
    if answer.status_code != 200:
        raise ConfigurationError(
            f"the server did not reset its prefix cache: HTTP {answer.status_code}"
        )


def _run_rows(
    rows: list[ModeRow],
    base: RunSpec,
    work: Path,
    args: argparse.Namespace,
    before_each: Callable[[str], None] | None = None,
) -> None:
    """Run ``rows`` ``args.repeat`` times, interleaved; ``before_each(base_url)`` runs before
    every run (the harness server's prefix-cache reset)."""
    for repeat in range(args.repeat):
        for row in rows:
            if before_each is not None and base.base_url:
                before_each(base.base_url)
            spec = RunSpec(**{**base.__dict__})
            spec.mode = row.mode
            spec.concurrency = row.concurrency or 1
            spec.replicas = row.replicas
            spec.requests_file = str(
                work / f"{'sequential' if row.mode == 'sequential' else 'all'}.json"
            )
            spec.result_file = str(work / f"{row.label}-{repeat}.result.json")
            tag = f"{row.label} run {repeat + 1}/{args.repeat}"
            _say(f"{tag} ...")
            outcome = _child(
                spec, work / f"{row.label}-{repeat}", args.run_timeout, verbose=args.verbose
            )
            if isinstance(outcome, str):
                row.failed_runs.append(outcome)
                _say(f"{tag}: FAILED: {outcome}")
                continue
            figures = run_row(outcome)
            row.runs.append(figures)
            _say(
                f"{tag}: {figures['wall_s']:.1f} s, {figures['output_tokens_per_s']:.1f} output "
                f"tok/s, {figures['failed']} failed"
            )


def _child(spec: RunSpec, stem: Path, timeout: float, *, verbose: bool) -> RunFigures | str:
    """Run one spec in a fresh process (its own session, so a timeout kills its engine
    processes too); the figures, or why there are none. Its output goes to a log file, and
    with ``verbose`` to the terminal too."""
    import json

    from ..._cpu import THREADS_BIND
    from ...testing._vllm_server import stop_group

    spec_file, log_file = stem.with_suffix(".spec.json"), stem.with_suffix(".log")
    spec.save(spec_file)
    env = {
        **{k: v for k, v in os.environ.items() if k != THREADS_BIND},
        **({} if spec.mode in UNBOUND_MODES else {THREADS_BIND: harness_binding()}),
        **vllm_env(verbose),
        **({VERBOSE_ENV: "1"} if is_verbose(verbose) else {}),
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # litellm fetches a price list at import
        "TOKENIZERS_PARALLELISM": "false",
        # the child runs this very copy of batchclient, whatever the venv's install points at
        "PYTHONPATH": os.pathsep.join(
            [str(Path(batchclient.__file__).resolve().parents[1])]
            + [x for x in [os.environ.get("PYTHONPATH")] if x]
        ),
    }
    cmd = [sys.executable, "-m", "batchclient.cli._bench._child", str(spec_file)]
    echo = getattr(sys.stderr, "buffer", None) if is_verbose(verbose) else None
    with log_file.open("wb") as log:
        proc = subprocess.Popen(
            cmd,
            stdout=log if echo is None else subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
        copier = None if proc.stdout is None else copy_output(proc.stdout, log_file, echo)
        try:
            code: int | None = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            code = None
        finally:  # also on Ctrl-C or SIGTERM: no engine process outlives its run
            stop_group(proc)
            proc.wait()
            if copier is not None:
                copier.join(timeout=10)
    if code is None:
        return f"timed out after {timeout:.0f} s"
    result = Path(spec.result_file)
    if not result.exists():
        return f"exited with status {code}; last lines:\n{_tail(log_file)}"
    data = json.loads(result.read_text(encoding="utf-8"))
    if "error" in data:
        _say(_tail(log_file))
        return str(data["error"])
    return RunFigures(**data)


def _tail(path: Path, lines: int = 25) -> str:
    return "\n".join(path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:])


def _say(text: str) -> None:
    print(f"[bench] {text}", file=sys.stderr, flush=True)
