#!/usr/bin/env bash
# Set everything up and run the test suite (README command 2; .ci/run calls exactly this).
# Starts dockerd for the Docker sandbox tests if no engine is running, and stops it after.
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh || { echo "setup failed" >&2; exit 1; }
PY="${WMRL_VENV:-.venv}/bin/python"

dockerd_pid=""
stop_dockerd() { [ -n "$dockerd_pid" ] && kill "$dockerd_pid" 2>/dev/null && wait "$dockerd_pid" 2>/dev/null; true; }
trap stop_dockerd EXIT
if command -v dockerd >/dev/null && ! docker info >/dev/null 2>&1; then
  dockerd >/tmp/wmrl-dockerd.log 2>&1 &
  dockerd_pid=$!
  for _ in $(seq 60); do docker info >/dev/null 2>&1 && break; sleep 0.5; done
  docker info >/dev/null 2>&1 || echo "warning: dockerd did not start (see /tmp/wmrl-dockerd.log)" >&2
fi
if docker info >/dev/null 2>&1; then
  # The sandbox image is built offline (debootstrap); a no-op when it exists.
  "$PY" -m wmrl_envs.sandbox.cli build-image --if-missing || echo "warning: sandbox image build failed" >&2
fi

"$PY" -m pytest -q -ra "$@"
rc=$?
if [ "$rc" = 5 ]; then echo "pytest collected no tests: treating as failure" >&2; rc=1; fi
exit "$rc"
