#!/usr/bin/env bash
# make run: start the demo backends and sluice on examples/, on loopback only.
# Ctrl-C stops both, as does SIGINT or SIGTERM to make's PID (make itself
# only waits for its children then; see watch_make); nothing is left running.
set -euo pipefail
cd "$(dirname "$0")/.."
backend_pid="" sluice_pid="" watcher_pid=""
cleanup() {
  if [ -n "$watcher_pid" ]; then kill "$watcher_pid" 2>/dev/null || true; fi
  if [ -n "$sluice_pid" ]; then kill -INT "$sluice_pid" 2>/dev/null || true; wait "$sluice_pid" 2>/dev/null || true; fi
  if [ -n "$backend_pid" ]; then kill "$backend_pid" 2>/dev/null || true; wait "$backend_pid" 2>/dev/null || true; fi
}
trap cleanup EXIT
# A signal to this script is passed to sluice, which drains; the script
# goes on waiting for it below.
trap 'if [ -n "$sluice_pid" ]; then kill -INT "$sluice_pid" 2>/dev/null || true; else exit 130; fi' INT TERM

# watch_make stops sluice when make, our parent, is signalled. GNU make
# catches SIGINT, SIGTERM and SIGHUP, resets that signal's handler to the
# default, and waits for its children before dying of it: so a signal sent
# to make's PID alone (not to the terminal's process group, as Ctrl-C is)
# would otherwise leave make, this script and sluice running. The reset
# shows in make's SigCgt mask in /proc.
watch_make() {
  local parent=$PPID start now
  [ "$(cat "/proc/$parent/comm" 2>/dev/null)" = make ] || return 0
  start=$(grep '^SigCgt:' "/proc/$parent/status") || return 0
  while sleep 0.3; do
    now=$(grep '^SigCgt:' "/proc/$parent/status" 2>/dev/null) || break
    [ "$now" = "$start" ] || break
  done
  kill -INT "$sluice_pid" 2>/dev/null || true
}

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
bin/sluice --manifests examples/ --bind-address 127.0.0.1 --userspace-capture=none \
  --healthz-bind-address 127.0.0.1:10256 --metrics-bind-address 127.0.0.1:10249 \
  --bind-address-hard-fail "$@" &
sluice_pid=$!
watch_make &
watcher_pid=$!
# Wait for sluice to end, past the signals trapped above (a trapped signal
# interrupts wait).
status=0
while :; do
  wait "$sluice_pid" && status=0 || status=$?
  kill -0 "$sluice_pid" 2>/dev/null || break
done
sluice_pid=""
exit "$status"
