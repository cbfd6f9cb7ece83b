package iptables

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/lb"
)

// restoreSpy counts the restores run against a fake, can fail the nth,
// and calls check after each one that succeeded.
type restoreSpy struct {
	*Fake
	restores int
	failAt   int // 1-based; 0: never
	check    func(n int)
}

func (s *restoreSpy) Restore(data []byte) error {
	s.restores++
	if s.restores == s.failAt {
		return errors.New("injected failure")
	}
	if err := s.Fake.Restore(data); err != nil {
		return err
	}
	if s.check != nil {
		s.check(s.restores)
	}
	return nil
}

// freshState is n service ports of every shape: endpoints local and not,
// affinity, NodePorts with externalTrafficPolicy Local, none.
func freshState(n int) *lb.Snapshot { return versionState(n, 0) }

// versionState is freshState whose even ports' endpoints move with v.
func versionState(n, v int) *lb.Snapshot {
	var ports []*lb.ServicePort
	for i := range n {
		var eps []lb.Endpoint
		for j := range i % 4 {
			eps = append(eps, readyEP(fmt.Sprintf("10.244.%d.%d:8080", i, j+1+(1-i%2)*v*10), j%2 == 0))
		}
		sp := svcPort(fmt.Sprintf("s%d", i), fmt.Sprintf("10.96.0.%d", i+1), eps...)
		if i%3 == 1 {
			sp.NodePort = uint16(30000 + i)
			sp.ExternalLocal = i%2 == 0
		}
		if i%3 == 2 {
			sp.Affinity = lb.Affinity{ClientIP: true, Timeout: time.Hour}
		}
		ports = append(ports, sp)
	}
	return snap(ports...)
}

// oneRestore is the tables a full sync of s in one restore leaves.
func oneRestore(t *testing.T, s *lb.Snapshot) string {
	t.Helper()
	spy := &restoreSpy{Fake: NewFake()}
	if err := (&Proxier{Runner: spy, Options: opts(), FullSyncBatch: -1}).Sync(s); err != nil {
		t.Fatal(err)
	}
	if spy.restores != 1 {
		t.Fatalf("FullSyncBatch -1 ran %d restores", spy.restores)
	}
	return spy.Dump()
}

// natPointsAtServices reports whether a nat top-level chain has a rule,
// which is what makes the per-service chains reachable.
func natPointsAtServices(f *Fake) bool {
	nat := f.Dump()[strings.Index(f.Dump(), "*nat\n"):]
	return strings.Contains(nat, "-A "+ChainServices+" ") || strings.Contains(nat, "-A "+ChainNodePorts+" ")
}

// A first sync onto a nat table without per-service chains writes them in
// restores of FullSyncBatch ports, and the top-level chains that point at
// them only in the last restore: traffic sees one change. The tables equal
// one restore's, and partial syncs go on from them.
func TestFreshNATTableIsWrittenInBatchesAndPointedAtLast(t *testing.T) {
	s := freshState(9) // s0, s4 and s8 have no endpoints (no chains of their own)
	spy := &restoreSpy{Fake: NewFake()}
	var pointedAt []int
	spy.check = func(n int) {
		if natPointsAtServices(spy.Fake) {
			pointedAt = append(pointedAt, n)
		}
	}
	p := &Proxier{Runner: spy, Options: opts(), FullSyncBatch: 2}
	st, err := p.SyncStats(s)
	if err != nil || !st.Full {
		t.Fatalf("first sync: %+v %v", st, err)
	}
	withChains := 0
	for _, sp := range s.Sorted() {
		if len(sp.Endpoints) > 0 { // a port without endpoints has no chains of its own
			withChains++
		}
	}
	if want := (withChains+1)/2 + 1; spy.restores != want {
		t.Fatalf("%d restores for %d ports with chains in batches of 2; want %d", spy.restores, withChains, want)
	}
	if len(pointedAt) == 0 || pointedAt[0] != spy.restores {
		t.Fatalf("the top-level nat chains had rules after restores %v of %d; want only after the last", pointedAt, spy.restores)
	}
	if got, want := spy.Dump(), oneRestore(t, s); got != want {
		t.Fatalf("batched tables:\n%s\nwant (one restore):\n%s", got, want)
	}
	if one, err := (&Proxier{Runner: NewFake(), Options: opts(), FullSyncBatch: -1}).SyncStats(s); err != nil || st.NATRulesTotal != one.NATRulesTotal || st.NATRules != one.NATRules || st.FilterRules != one.FilterRules {
		t.Fatalf("rules written %d/%d, in all %d; one restore's %d/%d, %d (%v): the rules the batches wrote are not counted as written", st.FilterRules, st.NATRules, st.NATRulesTotal, one.FilterRules, one.NATRules, one.NATRulesTotal, err)
	}
	for _, next := range []*lb.Snapshot{freshState(8), freshState(10)} {
		st, err := p.SyncStats(next)
		if err != nil || st.Full {
			t.Fatalf("partial sync after a batched one: %+v %v", st, err)
		}
		if got, want := spy.Dump(), oneRestore(t, next); got != want {
			t.Fatalf("after a partial sync:\n%s\nwant:\n%s", got, want)
		}
	}
}

// A nat table that holds per-service chains (a restart, the hourly resync)
// is rewritten in batches too, each restore replacing whole services'
// chains: after every restore each service sends a packet where the old
// rules or the new ones would, never to a mix, and a service that goes
// keeps its chains until the last restore. The result is one restore's.
func TestPopulatedNATTableIsRewrittenServiceByService(t *testing.T) {
	old, next := versionState(10, 0), versionState(9, 1) // even ports move; s9 goes
	oldRules, nextRules := NewFake(), NewFake()
	syncTo(t, oldRules, opts(), old)
	syncTo(t, nextRules, opts(), next)
	outcomes := func(f *Fake, sp *lb.ServicePort) string {
		return fmt.Sprint(f.Trace("PREROUTING", Packet{Src: podIP, Dst: sp.ClusterIPs[0], Proto: "tcp", DPort: sp.Port, Local: isLocal}))
	}
	f := NewFake()
	syncTo(t, f, opts(), old)
	spy := &restoreSpy{Fake: f}
	gone := ServiceChain(old.Sorted()[9].Name) // s9 has endpoints, so chains
	if !strings.Contains(f.Dump(), ":"+gone+"\n") {
		t.Fatalf("%s not in the old tables", gone)
	}
	var wentAt []int
	spy.check = func(n int) {
		for _, sp := range next.Sorted() {
			if got := outcomes(f, sp); got != outcomes(oldRules, sp) && got != outcomes(nextRules, sp) {
				t.Errorf("after restore %d, %v goes to %s: neither the old rules' %s nor the new %s", n, sp.Name, got, outcomes(oldRules, sp), outcomes(nextRules, sp))
			}
		}
		if !strings.Contains(f.Dump(), ":"+gone+"\n") {
			wentAt = append(wentAt, n)
		}
	}
	restarted := &Proxier{Runner: spy, Options: opts(), FullSyncBatch: 2}
	if err := restarted.Sync(next); err != nil {
		t.Fatal(err)
	}
	if spy.restores < 3 {
		t.Fatalf("a restart's full sync ran %d restores; want batches", spy.restores)
	}
	if len(wentAt) == 0 || wentAt[0] != spy.restores {
		t.Fatalf("the gone service's chain went after restores %v of %d; want only after the last", wentAt, spy.restores)
	}
	if got, want := f.Dump(), oneRestore(t, next); got != want {
		t.Fatalf("after the restart:\n%s\nwant:\n%s", got, want)
	}
}

// A failed restore, batch or last, on a first sync leaves the per-service
// chains unreached and says so; the next sync lists them and writes
// everything again in one restore, as kube-proxy's, which cannot fail the
// way a batch did.
func TestFailedFreshRestoreIsRecoveredByTheNextSync(t *testing.T) {
	s := freshState(9)
	for failAt := 1; failAt <= 4; failAt++ {
		spy := &restoreSpy{Fake: NewFake(), failAt: failAt}
		p := &Proxier{Runner: spy, Options: opts(), FullSyncBatch: 2}
		if err := p.Sync(s); err == nil || !strings.Contains(err.Error(), "injected failure") {
			t.Fatalf("restore %d failed: Sync said %v", failAt, err)
		}
		if natPointsAtServices(spy.Fake) {
			t.Fatalf("restore %d failed, and the top-level chains point at service chains", failAt)
		}
		before := spy.restores
		if err := p.Sync(s); err != nil {
			t.Fatalf("the sync after restore %d failed: %v", failAt, err)
		}
		if spy.restores-before != 1 {
			t.Fatalf("after restore %d failed the next sync ran %d restores; want one, as kube-proxy's", failAt, spy.restores-before)
		}
		if got, want := spy.Dump(), oneRestore(t, s); got != want {
			t.Fatalf("after restore %d failed and a resync:\n%s\nwant:\n%s", failAt, got, want)
		}
	}
}

type backendRunner struct {
	Runner
	legacy bool
}

func (b backendRunner) Legacy() bool { return b.legacy }

// Batches are the default on the nft backend only: on legacy each restore
// reads and writes the whole table, and a runner that does not say is
// taken for legacy.
func TestFreshBatchesOnlyOnTheNFTBackend(t *testing.T) {
	for _, c := range []struct {
		runner Runner
		batch  int
		want   int
	}{
		{backendRunner{NewFake(), false}, 0, DefaultFullSyncBatch},
		{backendRunner{NewFake(), true}, 0, 0},
		{NewFake(), 0, 0},
		{backendRunner{NewFake(), false}, -1, -1},
		{backendRunner{NewFake(), true}, 5, 5},
		{&Exec{Command: "iptables-nft"}, 0, DefaultFullSyncBatch},
		{&Exec{Command: "iptables-legacy"}, 0, 0},
	} {
		if got := (&Proxier{Runner: c.runner, FullSyncBatch: c.batch}).fullSyncBatch(); got != c.want {
			t.Errorf("%T FullSyncBatch %d: batch %d; want %d", c.runner, c.batch, got, c.want)
		}
	}
}

// Each batch is one nat transaction that names only chains it declares
// or KUBE-MARK-MASQ, which the first declares.
func TestFreshBatchesAreSelfContained(t *testing.T) {
	restores, bodies := ServiceChainBatches(freshState(12), opts(), 3)
	if len(restores) < 3 {
		t.Fatalf("%d restores", len(restores))
	}
	for i, r := range restores {
		f := NewFake()
		if i > 0 {
			f.Restore(restores[0])
		}
		if err := f.Restore(r); err != nil {
			t.Fatalf("restore %d alone (after the first): %v\n%s", i+1, err, r)
		}
		if strings.Contains(string(r), "-A "+ChainServices) || strings.Contains(string(r), "*filter") {
			t.Fatalf("restore %d writes a top-level chain:\n%s", i+1, r)
		}
	}
	_, full, _ := RenderPartial(freshState(12), opts(), nil)
	for name, sum := range bodies {
		if full[name] != sum {
			t.Errorf("%v: fingerprint %x, the full render's %x: the sync would write it again", name, sum, full[name])
		}
	}
}

// recordingFake keeps the last restore's input.
type recordingFake struct {
	*Fake
	last string
}

func (r *recordingFake) Restore(data []byte) error {
	r.last = string(data)
	return r.Fake.Restore(data)
}

// A partial sync whose top-level chains render as last applied leaves
// them out of its restore (an endpoint change touches only its service's
// own chains), and writes them when they change; the tables always equal
// a full sync's.
func TestUnchangedTopLevelChainsAreLeftOut(t *testing.T) {
	web := svcPort("web", "10.96.0.10", readyEP("10.244.1.1:8080", false))
	web.NodePort = 30080
	empty := svcPort("empty", "10.96.0.11") // rejected in filter
	moved := svcPort("web", "10.96.0.10", readyEP("10.244.1.2:8080", false))
	moved.NodePort = 30080
	added := svcPort("added", "10.96.0.12", readyEP("10.244.1.3:8080", false))
	r := &recordingFake{Fake: NewFake()}
	p := &Proxier{Runner: r, Options: opts()}
	for i, c := range []struct {
		s              *lb.Snapshot
		filter, natTop bool
	}{
		{snap(web, empty), true, true},           // full
		{snap(moved, empty), false, false},       // an endpoint moved
		{snap(moved, empty, added), false, true}, // a service came: KUBE-SERVICES
		{snap(moved, added), true, false},        // the rejected one went: filter only
		{snap(web, added), false, false},
	} {
		st, err := p.SyncStats(c.s)
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.Contains(r.last, "*filter\n"); got != c.filter {
			t.Errorf("sync %d (full=%v): filter table written %v, want %v:\n%s", i, st.Full, got, c.filter, r.last)
		}
		if got := strings.Contains(r.last[strings.Index(r.last, "*nat\n"):], ":"+ChainServices+" - [0:0]\n"); got != c.natTop {
			t.Errorf("sync %d (full=%v): nat KUBE-SERVICES written %v, want %v:\n%s", i, st.Full, got, c.natTop, r.last)
		}
		if got, want := r.Dump(), oneRestore(t, c.s); got != want {
			t.Fatalf("sync %d: tables differ from a full sync's:\n%s\nwant:\n%s", i, got, want)
		}
		wantFilter, wantNAT := RuleCounts(Render(c.s, opts()))
		if st.FilterRules != wantFilter || st.NATRulesTotal != wantNAT {
			t.Errorf("sync %d: %d filter and %d nat rules in all; the tables hold %d and %d", i, st.FilterRules, st.NATRulesTotal, wantFilter, wantNAT)
		}
	}
}
