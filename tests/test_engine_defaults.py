"""The engine defaults chosen by the hardware (``batchclient._engine_defaults``): pure, no
engine. The engine-level checks (the started engine and server run the chosen dtype) are in
``test_engine_dtype.py``."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import pytest

from batchclient import _engine_defaults as d

AMD_AVX2 = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 7B13
flags\t\t: fpu vme de pse tsc msr sse sse2 ssse3 fma sse4_1 sse4_2 avx f16c avx2 bmi2

processor\t: 1
flags\t\t: fpu vme de pse tsc msr sse sse2 ssse3 fma sse4_1 sse4_2 avx f16c avx2 bmi2
"""
AVX512_BF16 = "processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512bw avx512_bf16 avx512_vnni\n"
AMX = "flags\t\t: fpu avx2 avx512f avx512_bf16 amx_bf16 amx_tile amx_int8\n"
# a flag that only contains the name must not count
LOOKALIKE = "flags\t\t: fpu avx2 avx512f xavx512_bf16 amx_bf16_off\n"
ARM = "processor\t: 0\nFeatures\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics\n"


def test_cpu_without_bfloat16_arithmetic_runs_float32() -> None:
    for text in (AMD_AVX2, LOOKALIKE, ARM, "", None):
        choice = d.choose_dtype(cpu=True, cpuinfo=text if text is not None else "")
        assert choice.value == "float32", text
        assert choice.reason == "no bfloat16 arithmetic on this CPU"


def test_cpu_with_bfloat16_arithmetic_runs_bfloat16() -> None:
    assert d.choose_dtype(cpu=True, cpuinfo=AVX512_BF16) == d.Choice(
        "bfloat16", "this CPU has AVX512-BF16"
    )
    assert d.choose_dtype(cpu=True, cpuinfo=AMX) == d.Choice("bfloat16", "this CPU has AMX")


def test_an_explicit_dtype_always_wins() -> None:
    for cpuinfo in (AMD_AVX2, AMX):
        for cpu in (True, False):
            assert d.choose_dtype("float16", cpu=cpu, cpuinfo=cpuinfo) == d.Choice(
                "float16", "given"
            )
    # "auto" given is the caller's choice too (the checkpoint's dtype)
    assert d.choose_dtype("auto", cpu=True, cpuinfo=AMD_AVX2).value == "auto"


def test_gpus_keep_the_checkpoints_dtype() -> None:
    for cpuinfo in (AMD_AVX2, AMX):
        assert d.choose_dtype(cpu=False, cpuinfo=cpuinfo).value == "auto"


def test_this_machines_flags_are_read() -> None:
    text = d.read_cpuinfo()
    if text is None:
        pytest.skip("no /proc/cpuinfo here")
    has_bf16 = {"avx512_bf16", "amx_bf16"} & d.cpu_flags(text)
    assert d.choose_dtype(cpu=True).value == ("bfloat16" if has_bf16 else "float32")


def test_kv_cache_two_gib_on_cpu_unless_something_sizes_it() -> None:
    assert d.choose_kv_cache({}, cpu=True, environ={}).value == 2 << 30
    assert d.choose_kv_cache({"kv_cache_memory_bytes": None}, cpu=True, environ={}).value == (
        2 << 30
    )
    for given, env in (
        ({"kv_cache_memory_bytes": 1 << 30}, {}),
        ({"gpu_memory_utilization": 0.3}, {}),
        ({}, {"VLLM_CPU_KVCACHE_SPACE": "4"}),
    ):
        choice = d.choose_kv_cache(given, cpu=True, environ=env)
        assert choice.value is None and "given" in choice.reason
    assert d.choose_kv_cache({}, cpu=False, environ={}).value is None


def test_cores_every_core_unless_given_or_the_variable_is_set() -> None:
    assert d.choose_cores(cpu=True, environ={}) == d.Choice(
        d.affinity(), "every core of this process's affinity"
    )
    assert d.choose_cores([3, 2, 2], cpu=True, environ={}) == d.Choice([2, 3], "given")
    assert d.choose_cores([0], cpu=True, environ={d.THREADS_BIND: "auto"}).value is None
    assert d.choose_cores(cpu=False, environ={}).value is None


def test_apply_adds_only_what_was_not_given() -> None:
    chosen = d.decide({}, cpu=True, cpuinfo=AMD_AVX2, environ={})
    assert chosen.apply({"model": "m"}) == {
        "model": "m",
        "dtype": "float32",
        "kv_cache_memory_bytes": 2 << 30,
        "enable_prefix_caching": True,
    }
    given = {"dtype": "bfloat16", "kv_cache_memory_bytes": 1 << 30, "enable_prefix_caching": False}
    mine = d.decide(given, cpu=True, cpuinfo=AMD_AVX2, environ={})
    assert mine.apply(given) == given
    gpu = d.decide({}, cpu=False, cpuinfo=AMD_AVX2, environ={})
    assert gpu.apply({}) == {"dtype": "auto", "enable_prefix_caching": True}


def test_prefix_caching_on_for_generating_models_unless_given() -> None:
    assert d.choose_prefix_caching({}).value is True
    assert d.choose_prefix_caching({"enable_prefix_caching": False}).value is None
    assert d.choose_prefix_caching({"no_enable_prefix_caching": True}).value is None
    # pooling models keep vLLM's choice (off for mean/CLS pooling, which cannot share blocks)
    assert d.choose_prefix_caching({"runner": "pooling"}).value is None


def test_the_choices_are_logged_in_one_line(caplog: pytest.LogCaptureFixture) -> None:
    chosen = d.decide({}, cpu=True, cpuinfo=AMD_AVX2, environ={}, cores=[0, 1])
    with caplog.at_level(logging.INFO, logger="batchclient"):
        chosen.log("vLLM engine", "0-1")
    (record,) = [r for r in caplog.records if r.name == "batchclient"]
    assert record.levelno == logging.INFO
    assert record.getMessage() == (
        "vLLM engine: dtype=float32 (no bfloat16 arithmetic on this CPU); "
        "kv_cache_memory_bytes=2 GiB (the CPU default); "
        "enable_prefix_caching=True (shared prefixes reuse their KV cache); "
        "threads bound to 0-1 (given)"
    )
    given = d.decide({"dtype": "float32"}, cpu=False, environ={})
    assert given.describe(None).startswith("dtype=float32 (given); KV cache: vLLM's")


@pytest.mark.slow
def test_the_platform_check_imports_neither_vllm_nor_torch() -> None:
    code = (
        "import sys; from batchclient import _engine_defaults as d; "
        "d.vllm_on_cpu(); d.decide({}); "
        "bad = [m for m in ('vllm', 'torch') if m in sys.modules]; assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


@pytest.mark.slow  # a child process that imports vLLM and torch: 7 s of CPU, 20 s on a busy one
def test_this_machine_runs_vllm_on_the_cpu() -> None:
    """The cheap rule agrees with vLLM's own platform here (a CPU build)."""
    pytest.importorskip("vllm")
    code = (
        "from batchclient import _engine_defaults as d; cheap = d.vllm_on_cpu(); "
        "from vllm.platforms import current_platform; "
        "assert cheap == current_platform.is_cpu(), (cheap, current_platform)"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


async def test_the_inline_identity_holds_the_dtype(tmp_path: Path) -> None:
    """Before any engine starts: the chosen dtype, or the one given, is part of the provider's
    identity and of its cache identity (it changes the answers)."""
    from batchclient.inline import VLLMProvider

    chosen = d.choose_dtype(cpu=d.vllm_on_cpu()).value
    default = VLLMProvider(str(tmp_path))
    assert default.dtype == chosen and default.identity()["dtype"] == chosen
    assert (await default.cache_identity("m"))["engine_args"]["dtype"] == chosen
    given = VLLMProvider(str(tmp_path), dtype="float16")
    assert given.identity()["dtype"] == "float16"
    assert (await given.cache_identity("m"))["engine_args"]["dtype"] == "float16"
