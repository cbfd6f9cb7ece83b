# sluice: see README.md. `make help` lists the targets.
SHELL := /usr/bin/env bash
GO ?= go
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -X main.version=$(VERSION)
# Every binary is built as the image's is (static, paths trimmed), and vet
# and staticcheck compile as the race-enabled tests do: a cold machine then
# compiles the ~1,000 dependencies twice (static, race) instead of three
# times; the default build's copy cost ~5 minutes of a fresh `make test`.
STATIC := CGO_ENABLED=0
BUILDFLAGS := -trimpath
# Tools are cached outside the repo so a fresh clone reuses them.
TOOLS_DIR ?= $(HOME)/.cache/sluice/tools
STATICCHECK_VERSION := v0.7.0
STATICCHECK := $(TOOLS_DIR)/staticcheck-$(STATICCHECK_VERSION)
# Fuzz budgets are execution counts, not durations: a duration races Go
# 1.26's fuzz coordinator at the deadline (golang/go#75804) and fails with a
# bare "context deadline exceeded" that is no finding. Each is a few seconds.
FUZZ_SCALE ?= 1

.PHONY: help build build-demo run image image-test test test-vm test-deps test-unit test-race fuzz verify vet fmt-check staticcheck windows bench bench-smoke bench-vm bench-vm-idle bench-api-churn bench-sync bench-kube-sync bench-sync-fake bench-engines bench-deps clean

help: ## list the targets
	@grep -E '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-12s %s\n", $$1, $$2}'

build: build-demo ## build bin/sluice, bin/sluice-demo-backend and bin/sluice-bench
	$(STATIC) $(GO) build $(BUILDFLAGS) -o bin/sluice-bench ./bench/cmd/sluice-bench

build-demo: ## build only what `make run` runs: bin/sluice and bin/sluice-demo-backend
	$(STATIC) $(GO) build $(BUILDFLAGS) -ldflags "$(LDFLAGS)" -o bin/sluice ./cmd/sluice
	$(STATIC) $(GO) build $(BUILDFLAGS) -o bin/sluice-demo-backend ./bench/backends

run: build-demo ## run the demo: three loopback backends and sluice on examples/ (Ctrl-C stops all)
	./scripts/demo.sh

test: test-deps image verify test-race fuzz ## everything CI runs: installs the test beds, builds the image, checks, race-enabled tests, short fuzzing

image: ## bin/sluice-image.tar, an OCI image archive (Debian + sluice; no registry, reproducible; base cached in ~/.cache/sluice)
	@GO=$(GO) VERSION=$(VERSION) ./scripts/build-image.sh >/dev/null

image-test: image ## run the image with podman in the tests' private network namespace: tools, --version, manifests mode with traffic
	$(GO) test -count=1 -v -run '^TestImage$$' ./cmd/sluice

TEST_PACKAGES := etcd-server iproute2 iptables ipset nftables podman runc mmdebstrap gcc linux-perf

test-deps: ## install etcd, iproute2, iptables, ipset, nftables (copied into the VM guest), podman, runc and mmdebstrap (the image), gcc (the bench's C floor relay), linux-perf (the bench's user-time samples) and the VM tools (Debian), build kube-apiserver and fetch the VM kernel once into ~/.cache/sluice
	@missing=""; for t in etcd ip iptables-legacy iptables-nft ipset nft podman runc mmdebstrap cc perf; do command -v $$t >/dev/null || missing=1; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" != 0 ]; then echo "test-deps: need root to apt-get install $(TEST_PACKAGES)"; exit 1; fi; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(TEST_PACKAGES) >/dev/null; \
	fi
	@GO=$(GO) ./scripts/build-kube.sh kube-apiserver >/dev/null
	@GO=$(GO) ./scripts/build-kube.sh kube-proxy >/dev/null
	@./scripts/build-vm-kernel.sh >/dev/null

test-unit: ## tests without -race (quick)
	$(GO) test -count=1 ./...

test-vm: ## the VM suite alone: IPVS mode and SCTP under qemu (Debian cloud kernel cached in ~/.cache/sluice/vm), and IPVS mode's parity with upstream kube-proxy in a VM of its own
	$(GO) test -count=1 -timeout 15m -v -run TestVMSuite ./vmtest
	$(GO) test -count=1 -timeout 15m -v -run '^TestIPVSParityWithKubeProxy$$' ./cmd/sluice

# The race runtime sleeps a second as each race-enabled process exits
# (atexit_sleep_ms), and the netns tests run their test binary as a helper
# process hundreds of times: 1.2 s a helper, 0.2 s without the sleep.
# Races are still reported as they are found, and fail the run.
RACE_ENV := GORACE="atexit_sleep_ms=0 $$GORACE"

test-race: ## every test with the race detector; the VM suite and the IPVS parity test (a VM of its own) run last, alone (an emulated guest starved by parallel packages misses handshakes)
	$(RACE_ENV) $(GO) test -race -count=1 -timeout 20m -skip '^TestIPVSParityWithKubeProxy$$' $$($(GO) list ./... | grep -v '/vmtest')
	$(RACE_ENV) $(GO) test -race -count=1 -timeout 15m ./vmtest/...
	$(RACE_ENV) $(GO) test -race -count=1 -timeout 15m -run '^TestIPVSParityWithKubeProxy$$' ./cmd/sluice

fuzz: ## short runs of each fuzz target
	$(GO) test -run '^$$' -fuzz '^FuzzParsePortRange$$' -fuzztime $$((100000*$(FUZZ_SCALE)))x ./config
	$(GO) test -run '^$$' -fuzz '^FuzzParseFlags$$' -fuzztime $$((60000*$(FUZZ_SCALE)))x ./config
	$(GO) test -run '^$$' -fuzz '^FuzzConfigFile$$' -fuzztime $$((30000*$(FUZZ_SCALE)))x ./config
	$(GO) test -run '^$$' -fuzz '^FuzzParseManifest$$' -fuzztime $$((20000*$(FUZZ_SCALE)))x ./controlplane
	$(GO) test -run '^$$' -fuzz '^FuzzYAMLSplitMatchesYAMLReader$$' -fuzztime $$((50000*$(FUZZ_SCALE)))x ./controlplane
	$(GO) test -run '^$$' -fuzz '^FuzzCarriedLoadsMatchColdLoads$$' -fuzztime $$((4000*$(FUZZ_SCALE)))x -fuzzminimizetime 20x ./controlplane

verify: fmt-check vet staticcheck windows ## gofmt, go vet, staticcheck, Windows build

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

vet:
	$(GO) vet -race ./...
	$(GO) vet -race -tags vmguest ./vmtest/...

$(STATICCHECK):
	mkdir -p $(TOOLS_DIR)
	GOBIN=$(TOOLS_DIR)/bin $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)
	mv $(TOOLS_DIR)/bin/staticcheck $(STATICCHECK)

staticcheck: $(STATICCHECK)
	GOFLAGS="-race $$GOFLAGS" $(STATICCHECK) ./...
	GOFLAGS="-race $$GOFLAGS" $(STATICCHECK) -tags vmguest ./vmtest/...

windows: ## the userspace mode must build, and vet with its tests, for Windows nodes (--windows-service included)
	GOOS=windows $(GO) build ./...
	GOOS=windows $(GO) vet ./...

BENCH_PACKAGES := haproxy nginx-light libnginx-mod-stream wrk iperf3 iptables linux-perf gcc

bench-deps: ## install the peers and load generators the bench harness runs (Debian packages)
	@missing=""; for t in haproxy nginx wrk iperf3 iptables-nft-restore iptables-legacy-restore perf cc; do command -v $$t >/dev/null || missing=1; done; \
	[ -f /usr/lib/nginx/modules/ngx_stream_module.so ] || missing=1; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" != 0 ]; then echo "bench-deps: need root to apt-get install $(BENCH_PACKAGES)"; exit 1; fi; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(BENCH_PACKAGES) >/dev/null; \
	fi

bench: build bench-deps ## the benchmark, short mode (about 25 min): sluice vs naive Go, HAProxy, nginx; results in bench/results/
	bin/sluice-bench --mode short

bench-smoke: build bench-deps ## the benchmark harness end to end in < 2 min; asserts no numbers
	bin/sluice-bench --mode smoke
	bin/sluice-bench sync --sizes 100 --rounds 1 --out bench/results

bench-vm: build bench-deps ## the harness inside the VM suite's guest (kernel with IPVS): direct, event loop, iptables and IPVS modes side by side under emulation; results in bench/results/<ts>-vm/
	bin/sluice-bench vm --mode smoke

bench-vm-idle: build bench-deps ## 10k idle connections through each userspace proxy and the peers, in the VM guest (this host's hard descriptor limit, 20,000, stops at 7,500); ~10 min
	bin/sluice-bench vm --mode short --rounds 1 --workloads idle-conns --mem 4096 --timeout 60m \
		--systems sluice-eventloop,sluice-goroutine,naive-go,haproxy,haproxy-splice,nginx \
		--note "The guest's root may raise the descriptor limit (the host's is 20,000, too few for 10k proxied connections), so this run holds the full 10k idle connections."

bench-api-churn: build bench-deps test-deps ## endpoint churn through a real kube-apiserver holding 10k services (sluice's event loop; ~5 min, most of it loading the API server)
	bin/sluice-bench --mode short --rounds 3 --systems sluice-eventloop --workloads churn-api --api-services 10000

bench-sync: build bench-deps ## iptables mode: full and partial sync with real iptables-restore (nft, legacy) in a private netns, 1k and 10k services x 10 endpoints
	bin/sluice-bench sync --sizes 1000,10000 --rounds 1

bench-kube-sync: build bench-deps test-deps ## iptables and nftables modes beside upstream kube-proxy v1.34.2 on the same kube-apiserver (1k services x 10 endpoints, 3 rounds, ~3 min); each one's own sync histograms
	bin/sluice-bench kube-sync --sizes 1000 --rounds 3

bench-sync-fake: ## iptables mode in process: full and partial render, and syncs applied to the stateful fake
	$(GO) test -run '^$$' -bench BenchmarkSync -benchtime 5x ./kernel/iptables

bench-engines: ## Go micro-benchmarks of the engines and the gnet candidate
	$(GO) test -run '^$$' -bench . -benchtime 2s ./listeners

clean:
	rm -rf bin
