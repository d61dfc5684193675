#!/usr/bin/env bash
# Set everything up and run the test suite (README command 2; .ci/run calls exactly this).
# Before the suite: ruff (lint + format check), mypy, and the doctests of the packages; the
# suite runs even when one of them fails, and the script then fails.
# Starts dockerd for the Docker sandbox tests if no engine is running, and stops it after.
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh || { echo "setup failed" >&2; exit 1; }
BIN="${WMRL_VENV:-.venv}/bin"
PY="$BIN/python"

checks_failed=""
check() {
  echo "== $*" >&2
  "$@" || checks_failed="$checks_failed
  $*"
}
check "$BIN/ruff" check .
check "$BIN/ruff" format --check .
check "$BIN/mypy"
# Every >>> example in the packages (conftest.py says which modules are not collected).
check "$PY" -m pytest -q -p no:cacheprovider --doctest-modules wmrl_envs wrappers agents benchmarks

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

"$PY" -m pytest -q -ra --durations=25 "$@"  # the slowest tests: the suite must stay under ~20 min on 2 cores
rc=$?
if [ "$rc" = 5 ]; then echo "pytest collected no tests: treating as failure" >&2; rc=1; fi
if [ -n "$checks_failed" ]; then
  echo "failed checks:$checks_failed" >&2
  [ "$rc" = 0 ] && rc=1
fi
exit "$rc"
