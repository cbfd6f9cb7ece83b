//go:build linux

package nftables

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/knftables"
)

// busyNFT is the fake as a kernel before Linux 6.2 behaves (kube-proxy's
// reason to delete stale chains late): a chain that a rule or a map
// element refers to when a transaction starts cannot be deleted in that
// transaction, even when the transaction removes the reference first
// (the kernel lets go of it only after the commit). The whole transaction
// fails, as nft's "Device or resource busy" does. refuseDelete makes the
// next transaction that deletes a chain fail anyway.
type busyNFT struct {
	*knftables.Fake
	runs         int
	refuseDelete bool
}

var errBusy = errors.New("could not process rule: device or resource busy")

func (b *busyNFT) Run(ctx context.Context, tx *knftables.Transaction) error {
	b.runs++
	table := b.Table
	for _, l := range strings.Split(tx.String(), "\n") {
		name, ok := strings.CutPrefix(l, "delete chain ip "+Table+" ")
		if !ok {
			continue
		}
		if b.refuseDelete {
			b.refuseDelete = false
			return errBusy
		}
		if table == nil {
			continue
		}
		refers := func(words string) bool {
			w := strings.Fields(words)
			for i := 1; i < len(w); i++ {
				if (w[i-1] == "goto" || w[i-1] == "jump") && w[i] == name {
					return true
				}
			}
			return false
		}
		for _, c := range table.Chains {
			for _, r := range c.Rules {
				if refers(r.Rule) {
					return errBusy
				}
			}
		}
		for _, m := range table.Maps {
			for _, e := range m.Elements {
				if len(e.Value) == 1 && refers(e.Value[0]) {
					return errBusy
				}
			}
		}
	}
	return b.Fake.Run(ctx, tx)
}

// A service port or an endpoint that goes away leaves its chains flushed;
// a sync at least StaleChainDelay later deletes them in a transaction of
// its own after the sync's, as kube-proxy's does (before it), so that a kernel before 6.2, which still
// holds a chain a deleted map element pointed to, fails no sync. A stale
// chain used again is kept; a failed deletion is reported, makes the next
// sync full and is tried again later.
func TestStaleChainsAreDeletedByASyncASecondLater(t *testing.T) {
	ctx := context.Background()
	nft := &busyNFT{Fake: knftables.NewFake(knftables.IPv4Family, Table)}
	now := time.Unix(1_000_000, 0)
	p := &Proxier{NFT: nft, Options: opts(), Now: func() time.Time { return now }}
	e1, e2 := netip.MustParseAddrPort("10.244.1.1:8080"), netip.MustParseAddrPort("10.244.1.2:8080")
	web := port("web", "10.96.0.10", ep(e1.String()), ep(e2.String()))
	gone := port("gone", "10.96.0.11", ep(e1.String()))
	if err := p.Sync(ctx, snapOf(web, gone)); err != nil {
		t.Fatal(err)
	}
	chain := func(name string) *knftables.FakeChain { return nft.Table.Chains[name] }
	staleNames := []string{ServiceChain(gone.Name), EndpointChain(gone.Name, e1), EndpointChain(web.Name, e2)}

	// The port and an endpoint go: the sync succeeds and flushes their
	// chains.
	now = now.Add(100 * time.Millisecond)
	webOne := port("web", "10.96.0.10", ep(e1.String()))
	if st, err := p.SyncStats(ctx, snapOf(webOne)); err != nil || st.Full || st.CleanupErr != nil {
		t.Fatalf("the sync that drops a port and an endpoint: %+v %v", st, err)
	}
	for _, c := range staleNames {
		if ch := chain(c); ch == nil || len(ch.Rules) != 0 {
			t.Fatalf("%s not there and flushed: %+v", c, ch)
		}
	}
	// Less than the delay later: they stay.
	now = now.Add(StaleChainDelay / 2)
	if err := p.Sync(ctx, snapOf(webOne)); err != nil {
		t.Fatal(err)
	}
	for _, c := range staleNames {
		if chain(c) == nil {
			t.Fatalf("%s deleted before its delay", c)
		}
	}
	// The delay past: one transaction deletes them (the sync itself has
	// nothing to write).
	now = now.Add(StaleChainDelay / 2)
	before := nft.runs
	if st, err := p.SyncStats(ctx, snapOf(webOne)); err != nil || st.CleanupErr != nil || st.StaleDeleted != len(staleNames) || nft.runs-before != 1 {
		t.Fatalf("the sync after the delay: %+v %v, %d transactions; want 1", st, err, nft.runs-before)
	}
	for _, c := range staleNames {
		if chain(c) != nil {
			t.Fatalf("%s left after its delay", c)
		}
	}
	if p.StaleChains() {
		t.Fatal("stale chains still listed")
	}

	// An endpoint that goes and comes back within the delay keeps its
	// chain, rules and all.
	now = now.Add(time.Second)
	if err := p.Sync(ctx, snapOf(web)); err != nil {
		t.Fatal(err)
	}
	now = now.Add(time.Second)
	if err := p.Sync(ctx, snapOf(webOne)); err != nil {
		t.Fatal(err)
	}
	now = now.Add(StaleChainDelay / 2)
	if err := p.Sync(ctx, snapOf(web)); err != nil {
		t.Fatal(err)
	}
	now = now.Add(2 * StaleChainDelay)
	if err := p.Sync(ctx, snapOf(web)); err != nil {
		t.Fatal(err)
	}
	if ch := chain(EndpointChain(web.Name, e2)); ch == nil || len(ch.Rules) == 0 {
		t.Fatalf("the endpoint that came back lost its chain: %+v", ch)
	}

	// A deletion that fails is reported, not the sync's failure; the next
	// sync is full, finds the chain and flushes and marks it again, and
	// one a second later deletes it.
	now = now.Add(time.Second)
	if err := p.Sync(ctx, snapOf(webOne)); err != nil {
		t.Fatal(err)
	}
	now = now.Add(StaleChainDelay)
	nft.refuseDelete = true
	st, err := p.SyncStats(ctx, snapOf(webOne))
	if err != nil || st.CleanupErr == nil {
		t.Fatalf("a refused deletion: %+v %v; want a cleanup error, and the sync standing", st, err)
	}
	now = now.Add(100 * time.Millisecond)
	if st, err := p.SyncStats(ctx, snapOf(webOne)); err != nil || !st.Full || st.CleanupErr != nil {
		t.Fatalf("the sync after a refused deletion: %+v %v; want a full one", st, err)
	}
	if ch := chain(EndpointChain(web.Name, e2)); ch == nil || len(ch.Rules) != 0 || !p.StaleChains() {
		t.Fatalf("after the refused deletion the chain is not there, flushed and stale: %+v", ch)
	}
	now = now.Add(StaleChainDelay)
	if st, err := p.SyncStats(ctx, snapOf(webOne)); err != nil || st.CleanupErr != nil || st.StaleDeleted != 1 {
		t.Fatalf("the next sync: %+v %v", st, err)
	}
	if chain(EndpointChain(web.Name, e2)) != nil {
		t.Fatal("the chain whose deletion failed is still there")
	}
}
