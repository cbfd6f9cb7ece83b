//go:build linux

package nftables

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
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
	if err := (&Proxier{NFT: spy, Options: opts(), FullSyncBatch: -1}).Sync(context.Background(), snap); err != nil {
		t.Fatal(err)
	}
	if spy.runs != 1 {
		t.Fatalf("FullSyncBatch -1 ran %d transactions", spy.runs)
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
	p := &Proxier{NFT: spy, Options: opts(), FullSyncBatch: 2}
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
	if got, want := settle(t, p, fake, next), oneTransaction(t, next); got != want {
		t.Fatalf("after the partial sync:\n%s\nwant:\n%s", got, want)
	}
}

// serviceRules is what a port's traffic meets in fake's table: its
// service chain's rules and those of the chains they go to, in order.
func serviceRules(fake *knftables.Fake, name lb.ServicePortName) string {
	var b strings.Builder
	seen := map[string]bool{}
	var walk func(chain string)
	walk = func(chain string) {
		if seen[chain] {
			return
		}
		seen[chain] = true
		c := fake.Table.Chains[chain]
		if c == nil {
			fmt.Fprintf(&b, "%s: missing\n", chain)
			return
		}
		for _, r := range c.Rules {
			fmt.Fprintf(&b, "%s: %s\n", chain, r.Rule)
			for _, f := range strings.Fields(r.Rule) {
				if strings.HasPrefix(f, endpointPrefix) {
					walk(f)
				}
			}
		}
	}
	walk(ServiceChain(name))
	return b.String()
}

// movedPorts is freshPorts(n) whose ports with endpoints have moved them
// by v.
func movedPorts(n, v int) *lb.Snapshot {
	var ports []*lb.ServicePort
	for _, sp := range freshPorts(n).Sorted() {
		c := *sp
		c.Endpoints = nil
		for _, e := range sp.Endpoints {
			a := e.Addr.Addr().As4()
			a[3] += byte(v)
			c.Endpoints = append(c.Endpoints, ep(netip.AddrPortFrom(netip.AddrFrom4(a), e.Addr.Port()).String()))
		}
		ports = append(ports, &c)
	}
	return snapOf(ports...)
}

// A table that holds chains (a restart, the hourly resync) is rewritten in
// batches of whole services: after every transaction each service's
// traffic meets its old rules or its new ones, never a mix, and a service
// that goes keeps its chains until the last. The result is one
// transaction's. A table too small to batch is one transaction.
func TestPopulatedTableIsRewrittenServiceByService(t *testing.T) {
	old, next := movedPorts(8, 0), movedPorts(7, 10) // every port moves; s7 goes
	oldT, nextT := knftables.NewFake(knftables.IPv4Family, Table), knftables.NewFake(knftables.IPv4Family, Table)
	for _, c := range []struct {
		f *knftables.Fake
		s *lb.Snapshot
	}{{oldT, old}, {nextT, next}} {
		if err := (&Proxier{NFT: c.f, Options: opts(), FullSyncBatch: -1}).Sync(context.Background(), c.s); err != nil {
			t.Fatal(err)
		}
	}
	fake := knftables.NewFake(knftables.IPv4Family, Table)
	if err := (&Proxier{NFT: fake, Options: opts(), FullSyncBatch: -1}).Sync(context.Background(), old); err != nil {
		t.Fatal(err)
	}
	gone := ServiceChain(old.Sorted()[7].Name)
	var wentAt []int
	spy := &spyNFT{Fake: fake}
	spy.check = func(run int) {
		for _, sp := range next.Sorted() {
			got := serviceRules(fake, sp.Name)
			if got != serviceRules(oldT, sp.Name) && got != serviceRules(nextT, sp.Name) {
				t.Errorf("after transaction %d %v meets:\n%swant its old rules:\n%sor its new ones:\n%s", run, sp.Name, got, serviceRules(oldT, sp.Name), serviceRules(nextT, sp.Name))
			}
		}
		if fake.Table.Chains[gone] == nil {
			wentAt = append(wentAt, run)
		}
	}
	if fake.Table.Chains[gone] == nil {
		t.Fatalf("%s not in the old table", gone)
	}
	restarted := &Proxier{NFT: spy, Options: opts(), FullSyncBatch: 2}
	if err := restarted.Sync(context.Background(), next); err != nil {
		t.Fatal(err)
	}
	if want := 4 + 1; spy.runs != want { // 7 ports in 2s, then the maps
		t.Fatalf("a restart's full sync ran %d transactions; want %d", spy.runs, want)
	}
	// Flushed by the last, deleted by a sync a second later.
	if len(wentAt) != 0 || len(fake.Table.Chains[gone].Rules) != 0 {
		t.Fatalf("the gone service's chain went after transactions %v of %d, or kept rules; want it flushed, and there", wentAt, spy.runs)
	}
	if got, want := settle(t, restarted, fake, next), normalized(nextT.Dump()); got != want {
		t.Fatalf("after the restart:\n%s\nwant:\n%s", got, want)
	}
	small := &spyNFT{Fake: knftables.NewFake(knftables.IPv4Family, Table)}
	if err := (&Proxier{NFT: small, Options: opts(), FullSyncBatch: 10}).Sync(context.Background(), old); err != nil || small.runs != 1 {
		t.Fatalf("8 ports with a batch of 10: %d transactions, %v; want 1", small.runs, err)
	}
}

// A full sync in batches that failed is followed by one in a single
// transaction (kube-proxy's), which cannot fail the way a batch did.
func TestFullSyncAfterAFailedBatchIsOneTransaction(t *testing.T) {
	fake := knftables.NewFake(knftables.IPv4Family, Table)
	if err := (&Proxier{NFT: fake, Options: opts(), FullSyncBatch: -1}).Sync(context.Background(), movedPorts(8, 0)); err != nil {
		t.Fatal(err)
	}
	spy := &spyNFT{Fake: fake, failAt: 2}
	p := &Proxier{NFT: spy, Options: opts(), FullSyncBatch: 2}
	if err := p.Sync(context.Background(), movedPorts(8, 10)); err == nil {
		t.Fatal("the failed batch was not reported")
	}
	before := spy.runs
	if err := p.Sync(context.Background(), movedPorts(8, 10)); err != nil {
		t.Fatal(err)
	}
	if spy.runs-before != 1 {
		t.Fatalf("the full sync after a failed batch ran %d transactions; want 1", spy.runs-before)
	}
	if got, want := settle(t, p, fake, movedPorts(8, 10)), oneTransaction(t, movedPorts(8, 10)); got != want {
		t.Fatalf("after the resync:\n%s\nwant:\n%s", got, want)
	}
	// Then batches again.
	before = spy.runs
	p.FullSyncPeriod = time.Nanosecond
	if err := p.Sync(context.Background(), movedPorts(8, 20)); err != nil || spy.runs-before < 2 {
		t.Fatalf("the next full sync ran %d transactions (%v); want batches again", spy.runs-before, err)
	}
}

// A batch of a first sync that fails leaves no base chain in the table, so
// nothing it wrote is live; the sync says so, and the next one lists the
// table and rewrites it whole, in one transaction.
func TestFailedFreshBatchIsRecoveredByTheNextSync(t *testing.T) {
	for failAt := 1; failAt <= 5; failAt++ {
		snap := freshPorts(7)
		fake := knftables.NewFake(knftables.IPv4Family, Table)
		spy := &spyNFT{Fake: fake, failAt: failAt}
		p := &Proxier{NFT: spy, Options: opts(), FullSyncBatch: 2}
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
	if err := (&Proxier{NFT: spy, Options: opts(), FullSyncBatch: 3}).Sync(context.Background(), snap); err != nil {
		t.Fatal(err)
	}
	for _, sp := range snap.Sorted() {
		svc := ServiceChain(sp.Name)
		for _, e := range sp.Endpoints {
			if ec := EndpointChain(sp.Name, e.Addr.AddrPort()); seen[ec] != seen[svc] {
				t.Errorf("%s came in transaction %d, its service chain in %d", ec, seen[ec], seen[svc])
			}
		}
	}
	if seen[ServiceChain(snap.Sorted()[0].Name)] == seen[ServiceChain(snap.Sorted()[8].Name)] {
		t.Fatal("the first and last ports came in one transaction: no batches")
	}
}

// A family none of whose ports has an address of it (the IPv6 table of an
// IPv4 cluster) still gets its static chains before the base chains that
// jump to them: the first sync succeeds at once. (It failed, and the
// table came 30 s later with the retry.)
func TestFreshTableOfAFamilyWithoutPorts(t *testing.T) {
	for _, n := range []int{0, 2, 4} { // none, a batch, two batches of the other family
		fake := knftables.NewFake(knftables.IPv6Family, Table)
		spy := &spyNFT{Fake: fake}
		o := opts()
		o.IPv6 = true
		p := &Proxier{NFT: spy, Options: o, FullSyncBatch: 2}
		if err := p.Sync(context.Background(), freshPorts(n+1)); err != nil {
			t.Fatalf("%d IPv4 ports in the IPv6 table: %v", n+1, err)
		}
		want := knftables.NewFake(knftables.IPv6Family, Table)
		if err := (&Proxier{NFT: want, Options: o, FullSyncBatch: -1}).Sync(context.Background(), freshPorts(n+1)); err != nil {
			t.Fatal(err)
		}
		if got, want := normalized(fake.Dump()), normalized(want.Dump()); got != want {
			t.Fatalf("%d IPv4 ports in the IPv6 table:\n%s\nwant:\n%s", n+1, got, want)
		}
	}
}

// listCounter counts the table's listings.
type listCounter struct {
	*knftables.Fake
	lists int
}

func (l *listCounter) ListAll(ctx context.Context) (map[string][]string, error) {
	l.lists++
	return l.Fake.ListAll(ctx)
}

// A full sync lists the table only when what it holds is unknown: the
// first sync, one after a failure, one after an options change. The
// hourly one, over a table that holds what was applied, makes the applied
// ports' objects again instead (a listing at 10k Services took 20 s), and
// writes the same table. A service chain its own syncs did not make (an
// earlier run's, left when that run's partial sync failed) goes at the
// next listing. The proxier keeps no set of the table's chains between
// syncs.
func TestFullSyncListsTheTableOnlyWhenItsContentIsUnknown(t *testing.T) {
	for _, batch := range []int{-1, 2} {
		nft := &listCounter{Fake: knftables.NewFake(knftables.IPv4Family, Table)}
		p := &Proxier{NFT: nft, Options: opts(), FullSyncBatch: batch}
		if err := p.Sync(context.Background(), freshPorts(5)); err != nil {
			t.Fatal(err)
		}
		if nft.lists != 1 {
			t.Fatalf("batch %d: the first sync listed the table %d times, want once", batch, nft.lists)
		}
		if p.chains != nil || p.sets != nil {
			t.Fatalf("batch %d: the proxier kept the table's chains (%d) or sets (%d) after the sync", batch, len(p.chains), len(p.sets))
		}
		p.FullSyncPeriod = time.Nanosecond
		if st, err := p.SyncStats(context.Background(), movedPorts(5, 10)); err != nil || !st.Full {
			t.Fatalf("batch %d: %+v %v, want a full sync", batch, st, err)
		}
		if nft.lists != 1 {
			t.Fatalf("batch %d: the hourly full sync listed the table", batch)
		}
		if got, want := settle(t, p, nft.Fake, movedPorts(5, 10)), oneTransaction(t, movedPorts(5, 10)); got != want {
			t.Fatalf("batch %d: after the hourly full sync:\n%s\nwant:\n%s", batch, got, want)
		}
		leftover := ServiceChain(spn("gone", "old", "p"))
		tx := nft.NewTransaction()
		tx.Add(&knftables.Chain{Name: leftover})
		if err := nft.Fake.Run(context.Background(), tx); err != nil {
			t.Fatal(err)
		}
		p.Options.MasqueradeBit = 15
		if st, err := p.SyncStats(context.Background(), movedPorts(5, 20)); err != nil || !st.Full {
			t.Fatalf("batch %d: %+v %v, want a full sync after the options changed", batch, st, err)
		}
		if nft.lists != 2 {
			t.Fatalf("batch %d: the full sync after an options change listed the table %d times, want once", batch, nft.lists-1)
		}
		settle(t, p, nft.Fake, movedPorts(5, 20))
		if nft.Table.Chains[leftover] != nil {
			t.Fatalf("batch %d: the full sync left %s in the table", batch, leftover)
		}
	}
}
