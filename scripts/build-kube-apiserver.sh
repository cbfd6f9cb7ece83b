#!/usr/bin/env bash
# Builds kube-apiserver from the Go module proxy into a cache outside the
# repository, once. Prints the binary's path. Used by `make test` (the
# controlplane/kube integration tests need a real API server).
# Recipe: ../shared/TESTBEDS.md §2 (a scratch module pinning k8s.io/kubernetes
# with every staging module replaced by its matching v0.x.y tag).
set -euo pipefail
K8S_VERSION=${K8S_VERSION:-v1.34.2}
STAGING_VERSION=v0.${K8S_VERSION#v1.}
CACHE=${SLUICE_CACHE:-$HOME/.cache/sluice}
OUT=$CACHE/kube-apiserver-$K8S_VERSION
if [ -x "$OUT" ]; then echo "$OUT"; exit 0; fi
GO=${GO:-go}
work=$(mktemp -d "$CACHE/build-apiserver.XXXXXX" 2>/dev/null || { mkdir -p "$CACHE"; mktemp -d "$CACHE/build-apiserver.XXXXXX"; })
trap 'rm -rf "$work"' EXIT
cd "$work"
staging="api apiextensions-apiserver apimachinery apiserver cli-runtime client-go cloud-provider
cluster-bootstrap code-generator component-base component-helpers controller-manager cri-api
cri-client csi-translation-lib dynamic-resource-allocation endpointslice externaljwt kms
kube-aggregator kube-controller-manager kube-proxy kube-scheduler kubectl kubelet metrics
mount-utils pod-security-admission sample-apiserver sample-cli-plugin sample-controller"
{
  echo "module sluice.local/apiserver-build"
  echo
  echo "go 1.24"
  echo
  echo "require k8s.io/kubernetes $K8S_VERSION"
  echo
  for m in $staging; do echo "replace k8s.io/$m => k8s.io/$m $STAGING_VERSION"; done
} > go.mod
cat > tools.go <<'GO'
//go:build tools

package tools

import _ "k8s.io/kubernetes/cmd/kube-apiserver"
GO
echo "building kube-apiserver $K8S_VERSION into $OUT (a cold build takes ~7 minutes on 2 cores)" >&2
GOFLAGS=-mod=mod "$GO" mod tidy >&2
CGO_ENABLED=0 GOFLAGS=-mod=mod "$GO" build -trimpath -ldflags "-s -w" -o "$work/kube-apiserver" k8s.io/kubernetes/cmd/kube-apiserver >&2
mv "$work/kube-apiserver" "$OUT.tmp" && mv "$OUT.tmp" "$OUT"
echo "$OUT"
