//go:build linux

package nftables

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/knftables"

	"github.com/sluice-proxy/sluice/lb"
)

// spyNFT counts the transactions run against a fake, can fail the nth,
// and calls check after each that succeeded.
type spyNFT struct {
	*knftables.Fake
	runs   int
	failAt int // 1-based; 0: never
	check  func(run int)
}

func (s *spyNFT) Run(ctx context.Context, tx *knftables.Transaction) error {
	s.runs++
	if s.runs == s.failAt {
		return errors.New("injected failure")
	}
	if err := s.Fake.Run(ctx, tx); err != nil {
		return err
	}
	if s.check != nil {
		s.check(s.runs)
	}
	return nil
}

// freshPorts are n service ports of every shape a bundle has: endpoints
// with affinity, a NodePort with externalTrafficPolicy Local, none.
func freshPorts(n int) *lb.Snapshot {
	var ports []*lb.ServicePort
	for i := range n {
		sp := port(fmt.Sprintf("s%d", i), fmt.Sprintf("10.96.0.%d", i+1))
		for j := range i % 3 {
			sp.Endpoints = append(sp.Endpoints, ep(fmt.Sprintf("10.244.%d.%d:8080", i, j+1)))
		}
		switch i % 4 {
		case 1:
			sp.NodePort = uint16(30000 + i)
			sp.ExternalLocal = true
		case 2:
			sp.Affinity = lb.Affinity{ClientIP: true, Timeout: time.Hour}
		}
		ports = append(ports, sp)
	}
	return snapOf(ports...)
}

// oneTransaction is the table a single-transaction full sync of snap
// writes onto an empty table.
func oneTransaction(t *testing.T, snap *lb.Snapshot) string {
	t.Helper()
	fake := knftables.NewFake(knftables.IPv4Family, Table)
	spy := &spyNFT{Fake: fake}
	if err := (&Proxier{NFT: spy, Options: opts(), FreshBatch: -1}).Sync(context.Background(), snap); err != nil {
		t.Fatal(err)
	}
	if spy.runs != 1 {
		t.Fatalf("FreshBatch -1 ran %d transactions", spy.runs)
	}
	return normalized(fake.Dump())
}

// A first sync onto an empty table goes in batches of ports, and the
// base chains, which make the table live, come in the last transaction
// alone: until then no chain is hooked, so traffic sees the whole table
// at once. The result is the table one transaction writes.
func TestFreshTableIsWrittenInBatchesAndHookedLast(t *testing.T) {
	snap := freshPorts(7)
	fake := knftables.NewFake(knftables.IPv4Family, Table)
	spy := &spyNFT{Fake: fake}
	var hookedAt []int
	spy.check = func(run int) {
		for name := range hookedChains {
			if fake.Table.Chains[name] != nil {
				hookedAt = append(hookedAt, run)
				return
			}
		}
	}
	p := &Proxier{NFT: spy, Options: opts(), FreshBatch: 2}
	st, err := p.SyncStats(context.Background(), snap)
	if err != nil || !st.Full {
		t.Fatalf("first sync: %+v %v", st, err)
	}
	if want := 4 + 1; spy.runs != want { // 7 ports in 2s, then the hooks
		t.Fatalf("%d transactions; want %d", spy.runs, want)
	}
	if len(hookedAt) == 0 || hookedAt[0] != spy.runs {
		t.Fatalf("a base chain was in the table after transactions %v of %d; want only after the last", hookedAt, spy.runs)
	}
	if got, want := normalized(fake.Dump()), oneTransaction(t, snap); got != want {
		t.Fatalf("batched table:\n%s\nwant (one transaction):\n%s", got, want)
	}
	// What it recorded is what the table holds: a partial sync of one
	// changed port writes that port alone and converges.
	ports := map[lb.ServicePortName]*lb.ServicePort{}
	for name, sp := range snap.Ports.All() {
		ports[name] = sp
	}
	changed := *snap.Sorted()[4]
	changed.Endpoints = []lb.Endpoint{ep("10.244.99.1:8080")}
	ports[changed.Name] = &changed
	next := lb.NewSnapshot(ports)
	st, err = p.SyncStats(context.Background(), next)
	if err != nil || st.Full || st.Changed != 1 {
		t.Fatalf("partial sync after a batched one: %+v %v", st, err)
	}
	if got, want := normalized(fake.Dump()), oneTransaction(t, next); got != want {
		t.Fatalf("after the partial sync:\n%s\nwant:\n%s", got, want)
	}
}

// A table that holds chains (a restart, or the hourly resync) is rewritten
// in one transaction: its chains may be live. So is a table too small to
// batch.
func TestPopulatedTableIsRewrittenInOneTransaction(t *testing.T) {
	snap := freshPorts(7)
	fake := knftables.NewFake(knftables.IPv4Family, Table)
	if err := (&Proxier{NFT: fake, Options: opts(), FreshBatch: -1}).Sync(context.Background(), snap); err != nil {
		t.Fatal(err)
	}
	spy := &spyNFT{Fake: fake}
	restarted := &Proxier{NFT: spy, Options: opts(), FreshBatch: 2}
	if err := restarted.Sync(context.Background(), freshPorts(6)); err != nil {
		t.Fatal(err)
	}
	if spy.runs != 1 {
		t.Fatalf("a restart's full sync ran %d transactions; want 1", spy.runs)
	}
	if got, want := normalized(fake.Dump()), oneTransaction(t, freshPorts(6)); got != want {
		t.Fatalf("after the restart:\n%s\nwant:\n%s", got, want)
	}
	small := &spyNFT{Fake: knftables.NewFake(knftables.IPv4Family, Table)}
	if err := (&Proxier{NFT: small, Options: opts(), FreshBatch: 10}).Sync(context.Background(), snap); err != nil || small.runs != 1 {
		t.Fatalf("7 ports with a batch of 10: %d transactions, %v; want 1", small.runs, err)
	}
}

// A batch that fails leaves no base chain in the table, so nothing it
// wrote is live; the sync says so, and the next one lists the table and
// rewrites it whole, in one transaction.
func TestFailedFreshBatchIsRecoveredByTheNextSync(t *testing.T) {
	for failAt := 1; failAt <= 5; failAt++ {
		snap := freshPorts(7)
		fake := knftables.NewFake(knftables.IPv4Family, Table)
		spy := &spyNFT{Fake: fake, failAt: failAt}
		p := &Proxier{NFT: spy, Options: opts(), FreshBatch: 2}
		err := p.Sync(context.Background(), snap)
		if err == nil || !strings.Contains(err.Error(), "injected failure") || !strings.Contains(err.Error(), "first sync onto an empty table") {
			t.Fatalf("transaction %d failed: Sync said %v", failAt, err)
		}
		if fake.Table != nil {
			for name := range hookedChains {
				if fake.Table.Chains[name] != nil {
					t.Fatalf("transaction %d failed, and base chain %s is in the table", failAt, name)
				}
			}
		}
		before := spy.runs
		if err := p.Sync(context.Background(), snap); err != nil {
			t.Fatalf("the sync after transaction %d failed: %v", failAt, err)
		}
		if failAt > 1 && spy.runs-before != 1 {
			t.Fatalf("after a failed batch (transaction %d) the next sync ran %d transactions; want 1 (the table holds chains)", failAt, spy.runs-before)
		}
		if got, want := normalized(fake.Dump()), oneTransaction(t, snap); got != want {
			t.Fatalf("after transaction %d failed and a resync:\n%s\nwant:\n%s", failAt, got, want)
		}
	}
}

// Batches keep a port's objects together: a service chain's vmap names
// endpoint chains of the same batch, and its map elements come with it.
func TestFreshBatchesKeepAPortWhole(t *testing.T) {
	snap := freshPorts(9)
	fake := knftables.NewFake(knftables.IPv4Family, Table)
	spy := &spyNFT{Fake: fake}
	seen := map[string]int{} // chain -> the transaction that first held it
	spy.check = func(run int) {
		for name := range fake.Table.Chains {
			if _, ok := seen[name]; !ok {
				seen[name] = run
			}
		}
	}
	if err := (&Proxier{NFT: spy, Options: opts(), FreshBatch: 3}).Sync(context.Background(), snap); err != nil {
		t.Fatal(err)
	}
	for _, sp := range snap.Sorted() {
		svc := ServiceChain(sp.Name)
		for _, e := range sp.Endpoints {
			if ec := EndpointChain(sp.Name, e.Addr); seen[ec] != seen[svc] {
				t.Errorf("%s came in transaction %d, its service chain in %d", ec, seen[ec], seen[svc])
			}
		}
	}
	if seen[ServiceChain(snap.Sorted()[0].Name)] == seen[ServiceChain(snap.Sorted()[8].Name)] {
		t.Fatal("the first and last ports came in one transaction: no batches")
	}
}
