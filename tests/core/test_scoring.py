"""Log-likelihood scoring rules against lm-evaluation-harness's own code (no engine): pairs are
tokenised as its ``TemplateLM.loglikelihood`` tokenises them, rolling windows are its
``get_rolling_token_windows`` + ``make_disjoint_window``, and both answer shapes (OpenAI's echoed
``logprobs``, vLLM's ``prompt_logprobs``) decode to the same score."""

from __future__ import annotations

import re
from typing import Any

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from lm_eval.api.model import TemplateLM
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

from batchclient import Endpoint, ErrorCode, HFTokenizer, Request, Result
from batchclient._core.scoring import (
    combine_windows,
    encode_pairs,
    loglikelihood_requests,
    prompt_logprobs_body,
    rolling_requests,
    rolling_windows,
    split_pair,
    to_loglikelihood,
)
from providers import tokenizer as bundled_tokenizer


class _Encoded:
    def __init__(self, input_ids: list[list[int]]) -> None:
        self.input_ids = input_ids


class ToyTokenizer:
    """Words with their leading space are tokens (so a context cut mid-word merges with its
    continuation), ids from a growing vocabulary; a BOS token when ``add_special_tokens``."""

    bos_token, bos_token_id, eos_token_id = "<s>", 1, 2

    def __init__(self) -> None:
        self.vocab: dict[str, int] = {}

    def _ids(self, text: str, special: bool) -> list[int]:
        pieces = re.findall(r"<s>|\s?\w+|\s+|[^\w\s]", text)
        ids = [self.vocab.setdefault(p, 10 + len(self.vocab)) if p != "<s>" else 1 for p in pieces]
        return [1, *ids] if special else ids

    def __call__(self, texts: list[str], add_special_tokens: bool = True) -> _Encoded:
        return _Encoded([self._ids(t, add_special_tokens) for t in texts])


class Reference(TemplateLM):  # type: ignore[misc]
    """lm-eval's own tokenisation of loglikelihood requests, with our tokenizer; the encoded
    pairs are captured instead of scored."""

    def __init__(self, tok: Any) -> None:
        super().__init__()
        self.tok = tok
        self.captured: list[tuple[list[int], list[int]]] = []

    @property
    def eot_token_id(self) -> int:
        return int(self.tok.eos_token_id)

    @property
    def prefix_token_id(self) -> int:  # as its vllm backend: BOS, else EOS
        bos = getattr(self.tok, "bos_token_id", None)
        return int(bos) if bos is not None else self.eot_token_id

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kw: Any) -> Any:
        special = {} if add_special_tokens is None else {"add_special_tokens": add_special_tokens}
        return self.tok([string], **special).input_ids[0]

    def _loglikelihood_tokens(self, requests: Any, **kwargs: Any) -> list[tuple[float, bool]]:
        self.captured = [(list(c), list(x)) for _, c, x in requests]
        return [(0.0, True)] * len(requests)

    def loglikelihood_rolling(self, requests: Any, disable_tqdm: bool = False) -> list[float]:
        raise NotImplementedError

    def generate_until(self, requests: Any, disable_tqdm: bool = False) -> list[str]:
        raise NotImplementedError


class _Instance:
    def __init__(self, args: tuple[str, str]) -> None:
        self.args = args


def reference_pairs(tok: Any, pairs: list[tuple[str, str]]) -> list[tuple[list[int], list[int]]]:
    ref = Reference(tok)
    ref.loglikelihood([_Instance(p) for p in pairs], disable_tqdm=True)
    return ref.captured


def ours(tok: Any, pairs: list[tuple[str, str]], max_model_len: int | None = 2048) -> list[Any]:
    return anyio.run(encode_pairs, pairs, HFTokenizer(tok, max_model_len))


PAIRS = [
    ("Question: What is the capital of France?\nAnswer:", " Paris"),
    ("The cat sat on the ", "mat"),  # trailing space moves to the continuation
    ("Hello,", " world!"),
    ("", "Completely unconditioned text"),  # empty context: the prefix token
    ("Numbers 12", "34 and 5.6"),
    ("Emoji ", "🙂 and ünïcödé"),
]


@pytest.mark.parametrize("which", ["bundled", "toy"])
def test_pairs_are_tokenised_as_lm_eval_tokenises_them(which: str) -> None:
    tok = bundled_tokenizer() if which == "bundled" else ToyTokenizer()
    assert ours(tok, PAIRS) == reference_pairs(tok, PAIRS)


@pytest.mark.slow
@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.text(st.characters(codec="utf-8"), min_size=1, max_size=30).filter(str.strip),
            st.text(st.characters(codec="utf-8"), min_size=1, max_size=20),
        ),
        min_size=1,
        max_size=4,
    )
)
def test_random_pairs_match_lm_eval_or_are_refused(pairs: list[tuple[str, str]]) -> None:
    tok = bundled_tokenizer()
    mine, theirs = ours(tok, pairs), reference_pairs(tok, pairs)
    for got, want in zip(mine, theirs, strict=True):
        if want[1]:
            assert got == want
        else:  # lm-eval would score nothing; we refuse the pair
            assert got.code == ErrorCode.invalid_request


def test_a_text_starting_with_bos_gets_no_second_bos() -> None:
    tok = ToyTokenizer()
    [(ctx, cont)] = ours(tok, [("<s> chat templated", " answer")])
    assert ctx[:2] != [1, 1] and ctx[0] == 1 and cont == tok._ids(" answer", False)


def test_bad_pairs_are_per_item_errors() -> None:
    tok = bundled_tokenizer()
    got = ours(tok, [("ctx", ""), ("ctx", " ok"), ("only one",), ([1, 2], []), ([], [3])])  # type: ignore[list-item]
    codes = [g.code if not isinstance(g, tuple) else "ok" for g in got]
    assert codes == [
        "invalid_request",
        "ok",
        "invalid_request",
        "invalid_request",
        "invalid_request",
    ]
    assert "empty" in got[0].message


def test_token_pairs_need_no_tokenizer_and_text_pairs_do() -> None:
    assert anyio.run(encode_pairs, [([5, 6], [7])], None) == [([5, 6], [7])]
    with pytest.raises(ValueError, match="tokenizer"):
        anyio.run(encode_pairs, [("a", " b")], None)


def test_requests_over_the_context_are_refused_before_sending() -> None:
    reqs = list(
        loglikelihood_requests("m", [([1] * 10, [2] * 5), ([1] * 10, [2] * 6)], 16, ["a", "b"])
    )
    assert reqs[0].error is None and reqs[0].score_span == (10, 15)
    assert reqs[0].body == {
        "model": "m",
        "prompt": [1] * 10 + [2] * 5,
        "max_tokens": 1,
        "temperature": 0.0,
        "echo": True,
        "logprobs": 1,
    }
    assert reqs[1].error is not None and reqs[1].error.code == ErrorCode.context_length_exceeded
    assert reqs[1].endpoint is Endpoint.completions and reqs[1].custom_id == "b"


@settings(max_examples=80, deadline=None)
@given(st.lists(st.integers(3, 500), max_size=60), st.integers(1, 12))
def test_rolling_windows_are_lm_evals(tokens: list[int], max_seq_len: int) -> None:
    want = [
        make_disjoint_window(w)
        for w in get_rolling_token_windows(
            tokens, prefix_token=1, max_seq_len=max_seq_len, context_len=1
        )
    ]
    assert rolling_windows(tokens, 1, max_seq_len) == [(list(a), list(b)) for a, b in want]
    predicted = [t for _, cont in rolling_windows(tokens, 1, max_seq_len) for t in cont]
    assert predicted == tokens  # every token predicted exactly once


@pytest.mark.slow
def test_rolling_requests_fit_the_context_and_cover_the_text() -> None:
    tok = bundled_tokenizer()
    text = " ".join(f"word{i}" for i in range(200))
    requests, owners = anyio.run(
        rolling_requests,
        "m",
        [text, ""],
        HFTokenizer(tok, 64),
        None,
    )
    ids = tok([text]).input_ids[0]
    assert len(owners[0]) > 1 and all(len(requests[j].body["prompt"]) + 1 <= 64 for j in owners[0])
    scored = [
        t
        for j in owners[0]
        for t in requests[j].body["prompt"][slice(*(requests[j].score_span or (0, 0)))]
    ]
    assert scored == ids
    assert [requests[j].error.code for j in owners[1]] == ["invalid_request"]  # type: ignore[union-attr]


# ------------------------------------------------------------------------------ decoding


def _request(prompt: list[int], start: int) -> Request:
    return Request(
        index=0,
        body={"model": "m", "prompt": prompt},
        endpoint=Endpoint.completions,
        score_span=(start, len(prompt)),
    )


def test_both_answer_shapes_give_the_same_score() -> None:
    prompt = [10, 11, 12, 13]
    entries: list[Any] = [
        None,
        {
            "11": {"logprob": -1.5, "rank": 2, "decoded_token": " b"},
            "9": {"logprob": -0.2, "rank": 1, "decoded_token": " x"},
        },
        {"12": {"logprob": -0.3, "rank": 1, "decoded_token": " c"}},
        {"13": {"logprob": -0.7, "rank": 1, "decoded_token": " d"}},
    ]
    vllm = {"choices": [{"text": "", "prompt_logprobs": entries}]}
    echo = {
        "choices": [
            {
                "text": "a b c d e",
                "logprobs": {
                    "tokens": ["a", " b", " c", " d", " e"],
                    "token_logprobs": [None, -1.5, -0.3, -0.7, -0.1],
                    "top_logprobs": [
                        None,
                        {" b": -1.5, " x": -0.2},
                        {" c": -0.3},
                        {" d": -0.7},
                        {" e": -0.1},
                    ],
                },
            }
        ]
    }
    for start, logprob, greedy in ((2, -1.0, True), (1, -2.5, False)):
        for body in (vllm, echo):
            got = to_loglikelihood(_request(prompt, start), Result(status_code=200, body=body))
            assert got.error is None and got.logprob == pytest.approx(logprob)
            assert got.is_greedy is greedy and got.num_tokens == len(prompt) - start


def test_a_rank_says_whether_a_token_is_greedy() -> None:
    """vLLM's rank (1 + how many tokens are more likely) decides, even when the more likely
    token is not among the entries (a teacher-forced step reports the forced token alone);
    without a rank the entries are compared."""
    prompt = [10, 11, 12]

    def score(entries: list[Any]) -> Any:
        body = {"choices": [{"text": "", "prompt_logprobs": [None, *entries]}]}
        return to_loglikelihood(_request(prompt, 1), Result(status_code=200, body=body))

    forced = score([{"11": {"logprob": -4.0, "rank": 7}}, {"12": {"logprob": -0.1, "rank": 1}}])
    assert forced.is_greedy is False and forced.logprob == pytest.approx(-4.1)
    greedy = score([{"11": {"logprob": -4.0, "rank": 1}}, {"12": {"logprob": -0.1, "rank": 1}}])
    assert greedy.is_greedy is True
    unranked = score([{"11": {"logprob": -4.0}, "5": {"logprob": -1.0}}, {"12": {"logprob": -0.1}}])
    assert unranked.is_greedy is False


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"choices": []},
        {"choices": [{"text": "x"}]},
        {"choices": [{"prompt_logprobs": [None]}]},
        {"choices": [{"logprobs": {"token_logprobs": [None], "top_logprobs": [None]}}]},
    ],
)
def test_answers_without_the_prompts_logprobs_are_per_item_errors(body: dict[str, Any]) -> None:
    got = to_loglikelihood(_request([1, 2, 3], 1), Result(status_code=200, body=body))
    assert got.error is not None and got.error.code == ErrorCode.bad_upstream_response


def test_vllm_body_asks_for_prompt_logprobs_only() -> None:
    body = {"model": "m", "prompt": [1, 2], "max_tokens": 1, "echo": True, "logprobs": 1}
    assert prompt_logprobs_body(body) == {
        "model": "m",
        "prompt": [1, 2],
        "max_tokens": 1,
        "prompt_logprobs": 1,
    }


def test_rolling_windows_combine_or_fail_together() -> None:
    from batchclient import BatchItemError, LoglikelihoodResponse

    parts = [
        LoglikelihoodResponse(logprob=-1.0, is_greedy=True, num_tokens=3, custom_id="t"),
        LoglikelihoodResponse(logprob=-2.0, is_greedy=False, num_tokens=2, custom_id="t"),
    ]
    total = combine_windows(parts)
    assert (total.logprob, total.is_greedy, total.num_tokens, total.custom_id) == (
        -3.0,
        False,
        5,
        "t",
    )
    bad = BatchItemError(code="timeout", message="late")
    assert combine_windows([parts[0], LoglikelihoodResponse(error=bad)]).error == bad
    assert split_pair("abc  ", "d") == ("abc", "  d")
