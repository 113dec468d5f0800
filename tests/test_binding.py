"""Thread binding of CPU engines (``batchclient.inline._binding``): pure, no engine."""

from __future__ import annotations

import os

import pytest

from batchclient.inline import _binding


def test_core_lists_in_vllm_syntax() -> None:
    assert _binding.core_list([0, 1]) == "0-1"
    assert _binding.core_list([5, 0, 1, 2]) == "0-2,5"
    assert _binding.core_list([3]) == "3"


def test_split_and_masks() -> None:
    assert _binding.split([0, 1, 2, 3], 2) == [[0, 1], [2, 3]]
    assert _binding.split([0, 1, 2], 2) == [[0], [1]]  # the leftover core stays free
    assert _binding.split([0], 2) == []
    assert _binding.bind_mask([0, 1]) == "0-1"
    assert _binding.bind_mask([0, 1], 2) == "0|1"
    assert _binding.bind_mask([0], 2) is None  # too few cores: vLLM's own default stays


def test_workers_count_every_parallel_rank() -> None:
    assert _binding.engine_workers({}) == 1
    assert _binding.engine_workers({"tensor_parallel_size": 2, "pipeline_parallel_size": 2}) == 4
    assert _binding.engine_workers({"data_parallel_size": 2, "tensor_parallel_size": None}) == 2


def test_default_is_every_core_unless_the_caller_set_the_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(_binding.THREADS_BIND, raising=False)
    assert _binding.default_mask({}, [0, 1]) == "0-1"
    assert _binding.default_mask({"tensor_parallel_size": 2}, [0, 1, 2, 3]) == "0-1|2-3"
    assert _binding.default_mask({}) == _binding.bind_mask(sorted(os.sched_getaffinity(0)))
    monkeypatch.setenv(_binding.THREADS_BIND, "auto")
    assert _binding.default_mask({}, [0, 1]) is None


def test_bound_sets_the_variable_only_while_the_engine_starts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(_binding.THREADS_BIND, raising=False)
    with _binding.bound("0-1"):
        assert os.environ[_binding.THREADS_BIND] == "0-1"
    assert _binding.THREADS_BIND not in os.environ
    monkeypatch.setenv(_binding.THREADS_BIND, "0")
    with _binding.bound("1"):
        assert os.environ[_binding.THREADS_BIND] == "1"
    assert os.environ[_binding.THREADS_BIND] == "0"
    with _binding.bound(None):
        assert os.environ[_binding.THREADS_BIND] == "0"
