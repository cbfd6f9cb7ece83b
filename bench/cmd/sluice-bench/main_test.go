//go:build linux

package main

import (
	"slices"
	"strings"
	"testing"
)

func TestGuestSetup(t *testing.T) {
	g, err := guestSetup("direct,sluice-eventloop,haproxy,haproxy-splice,nginx,sluice-ipvs")
	if err != nil {
		t.Fatal(err)
	}
	if g.kernelModes != "ipvs" {
		t.Errorf("kernel modes %q, want ipvs (only the kernel modes named get a node)", g.kernelModes)
	}
	n := 0
	for _, tool := range g.tools {
		if tool == "haproxy" {
			n++
		}
	}
	if n != 1 || !slices.Contains(g.tools, "nginx") || !slices.Contains(g.tools, "wrk") {
		t.Errorf("tools %v: want the load generators, haproxy once and nginx", g.tools)
	}
	if !strings.Contains(g.prepare, "nobody") {
		t.Errorf("nginx's workers need a nobody user in the guest: %q", g.prepare)
	}

	g, err = guestSetup("sluice-goroutine,naive-go")
	if err != nil || g.kernelModes != "none" || g.prepare != "" || slices.Contains(g.tools, "haproxy") {
		t.Errorf("user-space systems only: %+v, %v", g, err)
	}
	if _, err := guestSetup("sluice-eventloop,envoy"); err == nil || !strings.Contains(err.Error(), `"envoy"`) {
		t.Errorf("an unknown system must be refused by name, got %v", err)
	}
}
