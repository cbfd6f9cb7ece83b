#!/usr/bin/env bash
# Builds sluice's container image as an OCI archive, bin/sluice-image.tar
# (make image), with no registry and no container engine: Debian bookworm's
# essential packages plus what the kernel modes exec (iptables with both
# backends, ipset, nftables, conntrack, kmod), made by mmdebstrap and cached
# outside the repository; a static sluice on top (cmd/sluice-image).
# SOURCE_DATE_EPOCH fixes every timestamp, so the same Debian packages and
# the same sluice give the same image. Prints the archive's path.
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE=${SLUICE_CACHE:-$HOME/.cache/sluice}
GO=${GO:-go}
SUITE=${SLUICE_IMAGE_SUITE:-bookworm}
PACKAGES=iptables,nftables,ipset,conntrack,kmod
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-1700000000}
ROOTFS=$CACHE/image-rootfs-$SUITE-$(echo "$PACKAGES $SOURCE_DATE_EPOCH" | sha256sum | cut -c1-12).tar
OUT=${SLUICE_IMAGE:-bin/sluice-image.tar}
VERSION=${VERSION:-$(git describe --always --dirty 2>/dev/null || echo dev)}

if [ ! -s "$ROOTFS" ]; then
  command -v mmdebstrap >/dev/null || { echo "build-image: mmdebstrap is missing (apt-get install mmdebstrap)" >&2; exit 1; }
  mkdir -p "$CACHE"
  echo "build-image: making the Debian $SUITE root filesystem into $ROOTFS (once; ~30 s)" >&2
  mmdebstrap --quiet --format=tar --variant=essential --include="$PACKAGES" \
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-exclude=/usr/share/info/*' \
    "$SUITE" "$ROOTFS.tmp" >&2
  mv "$ROOTFS.tmp" "$ROOTFS"
fi
mkdir -p bin
CGO_ENABLED=0 "$GO" build -trimpath -ldflags "-s -w -X main.version=$VERSION" -o bin/sluice-static ./cmd/sluice
"$GO" run ./cmd/sluice-image --rootfs "$ROOTFS" --binary bin/sluice-static --out "$OUT" \
  --version "$VERSION" --epoch "$SOURCE_DATE_EPOCH" >&2
echo "$OUT"
