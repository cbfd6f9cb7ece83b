#!/usr/bin/env bash
# Fetch (once) the Debian cloud kernel the VM tests boot, unpack it and index
# its modules, all under a cache outside the repo. Nothing is installed on
# the host. Prints the kernel directory (KDIR) and version on stdout:
#   KDIR=/root/.cache/sluice/vm/6.1.0-56-cloud-amd64 KVER=6.1.0-56-cloud-amd64
set -euo pipefail
CACHE="${SLUICE_CACHE:-$HOME/.cache/sluice}/vm"
mkdir -p "$CACHE"
need=""
for t in qemu-system-x86_64 cpio depmod modprobe; do command -v "$t" >/dev/null || need=1; done
[ -x /bin/busybox ] || need=1
if [ -n "$need" ]; then
  if [ "$(id -u)" != 0 ]; then echo "build-vm-kernel: need root to apt-get install qemu-system-x86 busybox-static cpio kmod" >&2; exit 1; fi
  apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq qemu-system-x86 busybox-static cpio kmod >&2
fi
# The package linux-image-cloud-amd64 points at today's ABI; resolve it, and
# keep using a cached kernel when the package index cannot be read.
pkg=$(apt-cache depends linux-image-cloud-amd64 2>/dev/null | awk '/Depends: linux-image-/ {print $2; exit}')
if [ -z "$pkg" ]; then
  apt-get update -qq >&2 || true
  pkg=$(apt-cache depends linux-image-cloud-amd64 2>/dev/null | awk '/Depends: linux-image-/ {print $2; exit}')
fi
if [ -z "$pkg" ]; then
  pkg=$(ls -d "$CACHE"/linux-image-*/ 2>/dev/null | tail -1 | xargs -r basename)
  [ -n "$pkg" ] || { echo "build-vm-kernel: cannot resolve linux-image-cloud-amd64 (apt-get update?) and no kernel is cached" >&2; exit 1; }
fi
kver=${pkg#linux-image-}
kdir="$CACHE/$pkg"
if [ ! -f "$kdir/.done" ]; then
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  (cd "$tmp" && apt-get download "$pkg" >&2)
  rm -rf "$kdir"
  mkdir -p "$kdir"
  dpkg -x "$tmp"/*.deb "$kdir"
  depmod -b "$kdir" "$kver"
  touch "$kdir/.done"
fi
echo "KDIR=$kdir KVER=$kver"
