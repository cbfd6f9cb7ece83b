package main

import (
	"path/filepath"
	"strings"
	"testing"
)

// --detect-local-mode=InterfaceNamePrefix, in both rule modes, on packets:
// a pod (a namespace behind a node interface named b*) reaches a cluster
// IP with its own address, and a client behind c0 is masqueraded to the
// node's address. --cluster-cidr names none of these addresses, so
// rules written from it, which sluice wrote whatever the mode said,
// masquerade the pod too and fail the test.
func TestLocalTrafficByInterfaceInNetns(t *testing.T) {
	for _, mode := range []string{"nftables", "iptables"} {
		t.Run(mode, func(t *testing.T) {
			b := newNetnsBed(t)
			b.startBackends("b", "10.244.0.5", "10.244.0.6")
			// The pod: its own namespace, behind the node's b2.
			pod := b.client + "-pod"
			b.ip("netns", "add", pod)
			t.Cleanup(func() { b.ip("netns", "del", pod) })
			b.ip("-n", pod, "link", "set", "lo", "up")
			b.ip("-n", b.node, "link", "add", "b2", "type", "veth", "peer", "name", "eth0", "netns", pod)
			b.ip("-n", b.node, "addr", "add", "10.244.1.1/24", "dev", "b2")
			b.ip("-n", pod, "addr", "add", "10.244.1.9/24", "dev", "eth0")
			b.ip("-n", b.node, "link", "set", "b2", "up")
			b.ip("-n", pod, "link", "set", "eth0", "up")
			b.ip("-n", pod, "route", "add", "default", "via", "10.244.1.1")

			dir := t.TempDir()
			writeFile(t, filepath.Join(dir, "svc.yaml"), iptablesManifest)
			p := b.start(b.node, nil, sluiceBin, "--proxy-mode="+mode, "--mode-fallback=false", "--hostname-override=node-a", "--iptables-backend=nft",
				"--manifests", dir, "--cluster-cidr=10.99.0.0/16", "--detect-local-mode=InterfaceNamePrefix", "--pod-interface-name-prefix=b",
				"--healthz-bind-address=", "--metrics-bind-address=")
			p.waitLog("state applied")
			peers := func(ns string) map[string]int {
				got := map[string]int{}
				for _, a := range triesIn(b, ns, "peer", "10.96.0.10:80", 10) {
					_, from, _ := strings.Cut(a, " from ")
					if strings.HasPrefix(a, "error") {
						from = a
					}
					got[from]++
				}
				return got
			}
			if got := peers(pod); got["10.244.1.9"] != 10 {
				t.Errorf("the pod's traffic, seen by the backends as from %v; want its own address, unmasqueraded", got)
			}
			if got := peers(b.client); got["10.244.0.1"] != 10 {
				t.Errorf("the client's traffic, seen by the backends as from %v; want the node's address (masqueraded)", got)
			}
		})
	}
}
