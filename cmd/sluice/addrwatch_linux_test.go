package main

import (
	"errors"
	"net"
	"net/netip"
	"os/exec"
	"slices"
	"testing"

	"github.com/sluice-proxy/sluice/controlplane/kube/kubetest"
)

// In the tests' private network namespace: the watch says nothing changed
// until an address is added or removed, and the local set, listed only
// then, follows both.
func TestAddrWatchSeesAddressChanges(t *testing.T) {
	if !inPrivateNetns() {
		kubetest.Require(t, errors.New("the address watch test adds addresses: it needs a private network namespace, which needs root"))
	}
	w, err := newAddrWatch()
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	dumps := 0
	l := &localAddrs{watch: w, dump: func() ([]net.Addr, error) { dumps++; return net.InterfaceAddrs() }}
	l.refresh()
	if dumps != 1 || !l.has(netip.MustParseAddr("127.0.0.1")) {
		t.Fatalf("first refresh: %d dumps, addresses %v", dumps, l.list())
	}
	l.refresh()
	l.refresh()
	if dumps != 1 {
		t.Fatalf("%d dumps with no address change, want none after the first", dumps)
	}
	const addr = "192.0.2.77"
	if err := addLocalAddr(addr); err != nil {
		t.Fatal(err)
	}
	l.refresh()
	if dumps != 2 || !l.has(netip.MustParseAddr(addr)) {
		t.Fatalf("after adding %s: %d dumps, addresses %v", addr, dumps, l.list())
	}
	if out, err := exec.Command("ip", "addr", "del", addr+"/32", "dev", "lo").CombinedOutput(); err != nil {
		t.Fatalf("ip addr del: %v %s", err, out)
	}
	l.refresh()
	if dumps != 3 || slices.Contains(l.list(), netip.MustParseAddr(addr)) {
		t.Fatalf("after removing %s: %d dumps, addresses %v", addr, dumps, l.list())
	}
}
