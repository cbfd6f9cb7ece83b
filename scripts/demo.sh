#!/usr/bin/env bash
# make run: start the demo backends and sluice on examples/, on loopback only.
# Ctrl-C stops both; nothing is left running.
set -euo pipefail
cd "$(dirname "$0")/.."
backend_pid=""
cleanup() {
  if [ -n "$backend_pid" ]; then kill "$backend_pid" 2>/dev/null || true; wait "$backend_pid" 2>/dev/null || true; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

bin/sluice-demo-backend &
backend_pid=$!

cat <<MSG

  sluice is starting on the manifests in examples/ (userspace mode).
  Try, in another terminal:

      curl 127.0.0.1:30080          # repeat: backend-1, backend-2, backend-3 take turns

  UDP:  echo hi | socat - UDP:127.0.0.1:30053     (if socat is installed)
  Admin: bin/sluice status ; curl 127.0.0.1:10256/healthz ; curl 127.0.0.1:10249/metrics
  Edit examples/demo.yaml while it runs: changes apply without a restart.
  Ctrl-C stops everything.

MSG
# sluice runs in the foreground so Ctrl-C reaches it directly and it drains.
bin/sluice --manifests examples/ --bind-address 127.0.0.1 --userspace-capture=none \
  --healthz-bind-address 127.0.0.1:10256 --metrics-bind-address 127.0.0.1:10249 \
  --bind-address-hard-fail "$@" || status=$?
exit "${status:-0}"
