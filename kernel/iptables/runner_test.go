package iptables

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
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

// A restore (or save) is never given a deadline by default: one slower
// than any timeout still completes, where the old one-minute limit killed
// every sync of a large node and left it with no rules (issue 18). The
// run function here is the slow runner: it finishes only after the
// context would have been cancelled by any timeout the runner kept, so it
// fails if the restore carries one.
func TestRestoreIsNotKilledForBeingSlow(t *testing.T) {
	var deadlines []string
	e := &Exec{Command: "iptables-nft", Timeout: time.Millisecond, Run: func(ctx context.Context, name string, args []string, _ []byte) ([]byte, error) {
		if d, ok := ctx.Deadline(); ok {
			deadlines = append(deadlines, name)
			<-ctx.Done() // slower than the deadline: killed
			return nil, fmt.Errorf("%s killed at its deadline %s: %w", name, d.Format(time.StampMilli), ctx.Err())
		}
		return []byte("*nat\n:PREROUTING ACCEPT [0:0]\nCOMMIT\n"), nil
	}}
	if err := e.Restore([]byte("*nat\nCOMMIT\n")); err != nil {
		t.Fatalf("restore: %v", err)
	}
	if _, err := e.Chains("nat"); err != nil {
		t.Fatalf("save: %v", err)
	}
	if len(deadlines) != 0 {
		t.Fatalf("given a deadline: %v", deadlines)
	}
	// One-rule commands keep theirs (they are O(1) and must not hang a sync).
	if err := e.EnsureChain("nat", "KUBE-SERVICES"); err == nil || !errors.Is(err, context.DeadlineExceeded) && !strings.Contains(err.Error(), "deadline") {
		t.Fatalf("-N past its timeout: %v, want the deadline", err)
	}
	// A restore timeout is still there for who asks (the sync bench does).
	e.RestoreTimeout = time.Millisecond
	if err := e.Restore([]byte("*nat\nCOMMIT\n")); err == nil {
		t.Fatal("restore with RestoreTimeout set outlived it")
	}
}

// --random-fully is used when iptables has it (1.6.2 and later), as
// kube-proxy decides (issue 18's parity gap).
func TestHasRandomFullyFromTheVersion(t *testing.T) {
	for out, want := range map[string]bool{
		"iptables v1.8.9 (nf_tables)\n": true,
		"iptables v1.8.7 (legacy)\n":    true,
		"iptables v1.6.2\n":             true,
		"iptables v1.6.1\n":             false,
		"iptables v1.4.21\n":            false,
		"garbage":                       false,
	} {
		e := &Exec{Command: "iptables", Run: func(_ context.Context, _ string, args []string, _ []byte) ([]byte, error) {
			return []byte(out), nil
		}}
		if got := e.HasRandomFully(); got != want {
			t.Errorf("%q: HasRandomFully %v, want %v", out, got, want)
		}
	}
}
