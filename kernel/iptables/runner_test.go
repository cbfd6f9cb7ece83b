package iptables

import (
	"context"
	"errors"
	"strings"
	"testing"
)

// On the legacy backend, a table that was never loaded is reported empty
// without running iptables-legacy-save, which would load it.
func TestExecDoesNotLoadLegacyTables(t *testing.T) {
	var ran []string
	e := &Exec{
		Command: "iptables",
		Run: func(_ context.Context, name string, args []string, _ []byte) ([]byte, error) {
			ran = append(ran, name+" "+strings.Join(args, " "))
			if len(args) == 1 && args[0] == "--version" {
				return []byte("iptables v1.8.9 (legacy)\n"), nil
			}
			return []byte("*nat\n:PREROUTING ACCEPT [0:0]\n:KUBE-SERVICES - [0:0]\nCOMMIT\n"), nil
		},
		ReadFile: func(name string) ([]byte, error) {
			if name != "/proc/net/ip_tables_names" {
				return nil, errors.New("unexpected file " + name)
			}
			return []byte("nat\n"), nil
		},
	}
	if chains, err := e.Chains("filter"); err != nil || chains != nil {
		t.Fatalf("filter (not loaded): %v %v", chains, err)
	}
	chains, err := e.Chains("nat")
	if err != nil || strings.Join(chains, ",") != "PREROUTING,KUBE-SERVICES" {
		t.Fatalf("nat: %v %v", chains, err)
	}
	if strings.Join(ran, "|") != "iptables --version|iptables-save -t nat" {
		t.Fatalf("ran %q", ran)
	}
	nft := &Exec{Command: "ip6tables-nft", Run: func(_ context.Context, name string, args []string, _ []byte) ([]byte, error) {
		return []byte("*filter\n:INPUT ACCEPT [0:0]\nCOMMIT\n"), nil
	}, ReadFile: func(string) ([]byte, error) { return nil, errors.New("must not be read for nft") }}
	if chains, err := nft.Chains("filter"); err != nil || len(chains) != 1 {
		t.Fatalf("nft filter: %v %v", chains, err)
	}
}
