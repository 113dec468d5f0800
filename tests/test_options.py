"""Each provider's options are declared once, as an ``Annotated`` ``TypedDict`` (``RemoteOptions``,
``VLLMOptions``, ``RayOptions``), and everything else derives from it: the provider resolves
what it is given, the client hands its options on and lists them in its docstring, the
registry describes them, and the CLI's provider flags are derived from them, a flag not given
being a value not passed."""

from __future__ import annotations

import argparse
import inspect
import re
from pathlib import Path
from typing import Any

import pytest

import batchclient
from batchclient import (
    ConfigurationError,
    RayBatchInference,
    RemoteBatchInference,
    VLLMBatchInference,
)
from batchclient._options import OptionSpec, _shown, is_declared, resolve, specs
from batchclient._registry import PROVIDERS, ProviderEntry
from batchclient.cli import build_parser, main
from batchclient.cli._lm_eval import model_args
from batchclient.cli._providers import OPTIONS_GROUP, provider_options
from batchclient.distributed import RayOptions
from batchclient.inline import VLLMOptions
from batchclient.remote import AdaptiveConcurrency, RemoteOptions, RemoteProvider

URL = "http://127.0.0.1:9/v1"
DECLARED = list(PROVIDERS.values())


def test_every_entry_declares_its_options_once() -> None:
    assert [e.name for e in DECLARED] == [
        "remote", "vllm", "ray", "batch-api", "anthropic-batch", "gemini-batch"
    ]  # fmt: skip
    for entry in DECLARED:
        assert is_declared(entry.options), entry.name  # every entry Annotated[..., Option(...)]


@pytest.mark.parametrize("entry", DECLARED, ids=lambda e: e.name)
def test_no_client_or_provider_spells_out_an_option_it_declares(entry: ProviderEntry) -> None:
    for cls in (entry.provider, entry.client):
        init = getattr(cls, "__init__", None) if isinstance(cls, type) else cls
        parameters = dict(inspect.signature(init).parameters)  # type: ignore[arg-type]
        parameters.pop("cls", None)  # a constructor classmethod (the batch APIs' provider)
        if not isinstance(cls, type):
            parameters = {"self": inspect.Parameter("self", KEYWORD_OR_POSITIONAL), **parameters}
        spelt = sorted(set(parameters) & set(specs(entry.options)))
        assert spelt == [], f"{cls.__name__} spells out {spelt}"
        (var,) = [p for p in parameters.values() if p.kind is p.VAR_KEYWORD]
        wanted = "Any" if entry.engine_args else f"Unpack[{entry.options.__name__}]"
        assert str(var.annotation) == wanted, cls.__name__
        positional = [p for p in parameters.values() if p.kind is p.POSITIONAL_OR_KEYWORD]
        assert [p.name for p in positional] == [
            "self",
            "model" if entry.engine_args else "base_url",
        ]


@pytest.mark.parametrize("entry", DECLARED, ids=lambda e: e.name)
def test_the_clients_docstring_lists_every_option_with_its_default(entry: ProviderEntry) -> None:
    doc = " ".join((entry.client.__doc__ or "").split())  # type: ignore[union-attr]
    for spec in specs(entry.options).values():
        assert f"{spec.name} (default {_shown(spec.default)}): {spec.help}" in doc, spec.name
    described = " ".join(entry.describe().split())
    for spec in specs(entry.options).values():
        assert f"{spec.name} (default {_shown(spec.default)}): {spec.help}" in described


def test_the_clients_hand_every_option_to_the_provider() -> None:
    adaptive = AdaptiveConcurrency(minimum=2)
    remote = RemoteBatchInference(
        URL, api_key="sk-x", max_concurrency=3, max_retries=0, timeout_s=5.0, adaptive=adaptive
    )
    given = {"max_concurrency": 3, "max_retries": 0, "timeout_s": 5.0, "adaptive": adaptive}
    assert remote.provider.options == resolve(RemoteOptions, given, who="x")
    assert (remote.provider.max_concurrency, remote.provider.timeout_s) == (3, 5.0)
    vllm = VLLMBatchInference(None, max_concurrency=5, single_token_scoring=False, dtype="float32")
    assert vllm.provider.options == resolve(
        VLLMOptions, {"max_concurrency": 5, "single_token_scoring": False}, who="x"
    )
    assert vllm.provider.engine_args == {"dtype": "float32"}
    ray = RayBatchInference(replicas=2, prefix_affinity=False, max_model_len=512)
    assert ray.provider.options == resolve(
        RayOptions, {"replicas": 2, "prefix_affinity": False}, who="x"
    )
    assert ray.provider.engine_args == {"max_model_len": 512}


def test_an_option_a_provider_does_not_declare_or_of_another_type_is_refused() -> None:
    with pytest.raises(ConfigurationError, match=r"takes no option timeout;.*timeout_s"):
        RemoteBatchInference(URL, timeout=5.0)  # type: ignore[call-arg]
    with pytest.raises(ConfigurationError, match="no option replicas"):
        RemoteProvider(URL, replicas=2)  # type: ignore[call-arg]
    with pytest.raises(ConfigurationError, match="max_retries must be int, not '3'"):
        RemoteProvider(URL, max_retries="3")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match=r"replicas must be int, not 2\.5"):
        RayBatchInference(replicas=2.5)
    with pytest.raises(TypeError):  # the key is keyword-only after the URL
        RemoteBatchInference(URL, "sk-x")  # type: ignore[misc]


KEYWORD_OR_POSITIONAL = inspect.Parameter.POSITIONAL_OR_KEYWORD


def flag_actions() -> dict[str, argparse.Action]:
    """The provider-option flags of ``run``, by option name."""
    run = subparser("run")
    group = next(g for g in run._action_groups if g.title == OPTIONS_GROUP[0])
    return {a.dest: a for a in group._group_actions}


def subparser(name: str) -> argparse.ArgumentParser:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    parser = sub.choices[name]
    assert isinstance(parser, argparse.ArgumentParser)
    return parser


def declarations() -> dict[str, list[tuple[str, OptionSpec]]]:
    """Every option of every provider ``run`` offers, by name: (provider, declaration)."""
    out: dict[str, list[tuple[str, OptionSpec]]] = {}
    for entry in PROVIDERS.values():
        for spec in specs(entry.options).values():
            out.setdefault(spec.name, []).append((entry.name, spec))
    return out


def test_every_provider_flag_maps_to_its_declaration_and_shows_each_default() -> None:
    actions = flag_actions()
    declared = declarations()
    own = {"completion_window", "tokenizer"}  # run's own flags (the job's window, the dry run's)
    flaggable = {n for n, d in declared.items() if d[0][1].flag is not None} - own
    assert set(actions) == flaggable
    for name, action in actions.items():
        (flag,) = [s for s in action.option_strings if not s.startswith("--no-")]
        assert flag == declared[name][0][1].flag == "--" + name.removesuffix("_s").replace("_", "-")
        assert action.default is argparse.SUPPRESS  # not given: not passed
        help_text = str(action.help)
        for provider, spec in declared[name]:
            assert provider in help_text
            assert _shown(spec.default) in help_text, (name, provider)


def test_run_help_shows_every_providers_own_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stop:
        main(["run", "--help"])
    assert stop.value.code == 0
    # argparse wraps after hyphens: "batch-api" may come out as "batch- api"
    text = " ".join(capsys.readouterr().out.split()).replace("- ", "-")
    assert "--max-concurrency N remote: Most requests in flight" in text
    assert "finds (default 256); vllm: Requests handed to the engine at once" in text
    assert "--timeout SECONDS remote: Seconds one attempt may take" in text
    assert "--restart-wait SECONDS ray: Seconds requests wait" in text
    polls = "Seconds between two polls of one remote batch (default 10.0)"
    assert f"--poll-interval SECONDS batch-api, anthropic-batch, gemini-batch: {polls}" in text
    for action in flag_actions().values():  # as argparse prints it: %% is %
        assert " ".join(str(action.help).split()).replace("- ", "-").replace("%%", "%") in text


def parse_run(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["run", "in.jsonl", "-o", "out.jsonl", *argv])


def test_a_flag_not_given_is_not_passed_and_one_given_is(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    assert provider_options(parse_run("--base-url", URL)) == {"base_url": URL, "api_key": None}
    assert provider_options(parse_run("--provider", "vllm")) == {}
    given = parse_run(
        "--base-url", URL, "--timeout", "5", "--no-check-model", "--headers", "x-a=1",
        "--max-concurrency", "8",
    )  # fmt: skip
    assert provider_options(given) == {
        "base_url": URL, "api_key": None, "timeout_s": 5.0, "check_model": False,
        "headers": {"x-a": "1"}, "max_concurrency": 8,
    }  # fmt: skip
    ray = parse_run("--provider", "ray", "--resources-per-replica", "num_gpus=1", "--replicas", "2")
    assert provider_options(ray) == {"resources_per_replica": {"num_gpus": 1}, "replicas": 2}
    cores = parse_run("--provider", "vllm", "--cpu-cores", "0", "1", "--verbose")
    assert provider_options(cores) == {"cpu_cores": [0, 1], "verbose": True}
    # a switch with a named setting: one word, the name or true / false
    for word, value in (("auto", "auto"), ("true", True), ("false", False)):
        caching = parse_run("--base-url", URL, "--prompt-caching", word)
        assert provider_options(caching)["prompt_caching"] == value
    with pytest.raises(SystemExit):
        parse_run("--base-url", URL, "--prompt-caching", "yes")


def test_a_flag_the_chosen_provider_does_not_take_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    requests = tmp_path / "in.jsonl"
    requests.write_text("")
    argv = ["run", str(requests), "-o", str(tmp_path / "out.jsonl"), "--state-dir", str(tmp_path)]
    assert main([*argv, "--base-url", URL, "--replicas", "2", "--verbose"]) == 2
    assert "--replicas, --verbose does not apply to provider 'remote'" in capsys.readouterr().err
    assert main([*argv, "--provider", "vllm", "--rpm", "5"]) == 2
    assert "--rpm does not apply to provider 'vllm'" in capsys.readouterr().err
    assert main([*argv, "--provider", "vllm", "--engine-arg", "max_concurrency=3"]) == 2
    assert "--engine-arg max_concurrency: give these with their own flags" in (
        capsys.readouterr().err
    )
    assert main([*argv, "--base-url", URL, "--model", "m"]) == 2
    assert "--model does not apply to provider 'remote'" in capsys.readouterr().err


def test_serve_and_lm_eval_derive_the_same_flags() -> None:
    run = {a.dest: a.option_strings for a in flag_actions().values()}
    serve_flags = {a.dest: a.option_strings for a in subparser("serve")._actions}
    for name in ("max_concurrency", "timeout_s", "replicas", "single_token_scoring"):
        assert serve_flags[name] == run[name]
    assert "poll_interval_s" not in serve_flags  # a server runs one request at a time
    lm_eval = subparser("lm-eval")
    args = lm_eval.parse_args(
        ["--provider", "remote", "--model", "m", "--base-url", URL, "--max-concurrency", "4",
         "--timeout", "30", "--no-check-model", "--", "--tasks", "t"]
    )  # fmt: skip
    text = model_args(args)
    assert text == f"provider=remote,model=m,base_url={URL},max_concurrency=4,timeout_s=30.0," + (
        "check_model=False"
    )
    vllm = lm_eval.parse_args(["--provider", "vllm", "--rpm", "3"])
    with pytest.raises(ConfigurationError, match="--rpm does not apply to provider 'vllm'"):
        model_args(vllm)


def test_the_package_docstring_and_providers_command_name_every_provider(
    capsys: pytest.CaptureFixture[str],
) -> None:
    doc = batchclient.__doc__ or ""
    for name in PROVIDERS:
        assert f'"{name}"' in doc, name
    assert main(["providers"]) == 0
    out = capsys.readouterr().out
    for entry in DECLARED:
        assert re.search(rf"^{entry.name}: ", out, re.MULTILINE)
        for spec in specs(entry.options).values():
            assert f"{spec.name} (default {_shown(spec.default)})" in out
    assert main(["providers", "ray"]) == 0
    assert capsys.readouterr().out.startswith("ray: vLLM engine replicas as Ray actors")


@pytest.mark.parametrize("entry", DECLARED, ids=lambda e: e.name)
def test_the_registry_builds_with_the_declared_defaults(entry: ProviderEntry) -> None:
    needed: dict[str, Any] = {"base_url": URL} if entry.name in ("remote", "batch-api") else {}
    if entry.name in ("anthropic-batch", "gemini-batch"):
        needed["api_key"] = "k"
    provider: Any = entry.provider(**needed)
    assert provider.options == resolve(entry.options, {}, who="x")


def test_the_remote_guide_lists_every_remote_option() -> None:
    """``docs/remote.md``'s knob table keeps up with the declarations (names; the defaults
    shown there are the declared ones, written for people)."""
    guide = (Path(__file__).parents[1] / "docs" / "remote.md").read_text()
    rows = set(re.findall(r"^\| `(\w+)[`=]", guide, re.MULTILINE))
    assert set(specs(RemoteOptions)) <= rows, set(specs(RemoteOptions)) - rows
