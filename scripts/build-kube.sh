#!/usr/bin/env bash
# Builds a Kubernetes component (kube-apiserver, the default, or kube-proxy)
# from the Go module proxy into a cache outside the repository, once.
# Prints the binary's path. Used by `make test`: the integration tests need
# a real API server, and upstream kube-proxy runs beside sluice as the
# reference its nftables rules are compared with.
# Recipe: ../shared/TESTBEDS.md §2 (a scratch module pinning k8s.io/kubernetes
# with every staging module replaced by its matching v0.x.y tag).
set -euo pipefail
COMPONENT=${1:-kube-apiserver}
case "$COMPONENT" in kube-apiserver|kube-proxy) ;; *) echo "build-kube: unknown component $COMPONENT" >&2; exit 2;; esac
K8S_VERSION=${K8S_VERSION:-v1.34.2}
STAGING_VERSION=v0.${K8S_VERSION#v1.}
CACHE=${SLUICE_CACHE:-$HOME/.cache/sluice}
OUT=$CACHE/$COMPONENT-$K8S_VERSION
if [ -x "$OUT" ]; then echo "$OUT"; exit 0; fi
GO=${GO:-go}
work=$(mktemp -d "$CACHE/build-$COMPONENT.XXXXXX" 2>/dev/null || { mkdir -p "$CACHE"; mktemp -d "$CACHE/build-$COMPONENT.XXXXXX"; })
trap 'rm -rf "$work"' EXIT
cd "$work"
staging="api apiextensions-apiserver apimachinery apiserver cli-runtime client-go cloud-provider
cluster-bootstrap code-generator component-base component-helpers controller-manager cri-api
cri-client csi-translation-lib dynamic-resource-allocation endpointslice externaljwt kms
kube-aggregator kube-controller-manager kube-proxy kube-scheduler kubectl kubelet metrics
mount-utils pod-security-admission sample-apiserver sample-cli-plugin sample-controller"
{
  echo "module sluice.local/$COMPONENT-build"
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

import _ "k8s.io/kubernetes/cmd/COMPONENT"
GO
sed -i "s#COMPONENT#$COMPONENT#" tools.go
echo "building $COMPONENT $K8S_VERSION into $OUT (a cold build takes ~7 minutes on 2 cores)" >&2
GOFLAGS=-mod=mod "$GO" mod tidy >&2
CGO_ENABLED=0 GOFLAGS=-mod=mod "$GO" build -trimpath -ldflags "-s -w" -o "$work/$COMPONENT" "k8s.io/kubernetes/cmd/$COMPONENT" >&2
mv "$work/$COMPONENT" "$OUT.tmp" && mv "$OUT.tmp" "$OUT"
echo "$OUT"
