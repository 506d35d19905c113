#!/usr/bin/env bash
# `make setup`'s main install into a new virtual environment, as pip does it (byte-compiling each file as it
# installs it, one at a time) and as the Makefile does it (`pip install --no-compile`, then `compileall -j 0`
# on every core), then a first import of vLLM, Ray and transformers from it. One JSON row per side on stdout.
#
#     bash bench/install_bytecode.sh pip compileall >> bench/results/install-bytecode-native-bf16.jsonl
#
# Needs a clone whose pip already has the wheels at hand (a machine that ran `make setup` once): it measures
# installing, not downloading. Each side's venv is removed after its row.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
seconds() { local t0=$1; python3 -c "import time; print(round(time.time() - $t0, 1))"; }
for side in "$@"; do
  venv="$work/venv-$side"
  python3 -m venv "$venv"
  cd "$repo"
  t0=$(date +%s.%N)
  if [ "$side" = pip ]; then
    "$venv/bin/python" -m pip install -q '.[cpu,dev]'
    install_s=$(seconds "$t0"); compile_s=0
  else
    "$venv/bin/python" -m pip install -q --no-compile '.[cpu,dev]'
    install_s=$(seconds "$t0"); t1=$(date +%s.%N)
    "$venv/bin/python" -m compileall -qq -j 0 "$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" || true
    compile_s=$(seconds "$t1")
  fi
  "$venv/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec
  cd "$work"
  t2=$(date +%s.%N)
  "$venv/bin/python" -c "import vllm; from vllm.v1.engine.async_llm import AsyncLLM; import ray; import transformers" 2>/dev/null
  import_s=$(seconds "$t2")
  echo "{\"bench\": \"install-bytecode\", \"side\": \"$side\", \"install_s\": $install_s, \"compile_s\": $compile_s, \"first_import_s\": $import_s, \"commit\": \"$(git -C "$repo" rev-parse --short HEAD)\", \"cores\": $(nproc), \"date\": \"$(date -u '+%Y-%m-%d %H:%M')\"}"
  rm -rf "$venv"
done
