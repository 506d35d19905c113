#!/usr/bin/env bash
# `make setup`'s main install (`pip install '.[cpu,dev]'`, non-editable here) into a new virtual environment,
# as pip does it (byte-compiling each file as it installs it, one at a time: side `pip`) and as the Makefile
# does it (`pip install --no-compile`, then compileall on every core: side `compileall`), then a first import
# of vLLM, Ray and transformers from it. One JSON row per side on stdout.
#
#     bash bench/install_bytecode.sh pip compileall >> bench/results/install-bytecode-native-bf16.jsonl
#
# Needs a clone whose pip already has the wheels at hand (a machine that ran `make setup` once): it measures
# installing, not downloading. Each side's venv is removed after its row.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
seconds() { python3 -c "import time; print(round(time.time() - $1, 1))"; }
compile_all='import compileall, sysconfig; compileall.compile_dir(sysconfig.get_paths()["purelib"], quiet=2, workers=0)'
for side in "$@"; do
  case "$side" in
    pip) no_compile="" ;;
    compileall) no_compile="--no-compile" ;;
    *) echo "unknown side '$side': give pip or compileall" >&2; exit 2 ;;
  esac
  venv="$work/venv-$side"
  python3 -m venv "$venv"
  cd "$repo"
  t0=$(date +%s.%N)
  "$venv/bin/python" -m pip install -q $no_compile '.[cpu,dev]'
  install_s=$(seconds "$t0")
  compile_s=0
  if [ "$side" = compileall ]; then
    t1=$(date +%s.%N)
    "$venv/bin/python" -c "$compile_all"
    compile_s=$(seconds "$t1")
  fi
  "$venv/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec
  cd "$work"
  t2=$(date +%s.%N)
  "$venv/bin/python" -c "import vllm; from vllm.v1.engine.async_llm import AsyncLLM; import ray; import transformers"
  import_s=$(seconds "$t2")
  commit=$(git -C "$repo" describe --always --dirty)
  printf '{"bench": "install-bytecode", "side": "%s", "install_s": %s, "compile_s": %s, ' \
    "$side" "$install_s" "$compile_s"
  printf '"first_import_s": %s, "commit": "%s", "cores": %s, "date": "%s"}\n' \
    "$import_s" "$commit" "$(nproc)" "$(date -u '+%Y-%m-%d %H:%M')"
  rm -rf "$venv"
done
