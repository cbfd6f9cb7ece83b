//go:build linux

package nftables

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"testing"
	"time"

	"sigs.k8s.io/knftables"

	"github.com/sluice-proxy/sluice/lb"
)

// failingNFT is a knftables Fake whose next transaction fails when fail
// is set, changing nothing, as the kernel's does.
type failingNFT struct {
	*knftables.Fake
	fail bool
}

func (f *failingNFT) Run(ctx context.Context, tx *knftables.Transaction) error {
	if f.fail {
		f.fail = false
		return errors.New("transaction refused")
	}
	return f.Fake.Run(ctx, tx)
}

// deltaPort is port j (of service sj, port pn) in a random shape: two
// ports of a service share its cluster IP, and now and then a port moves
// to another service's, so that a cluster IP's element must stay while
// any port has it.
func deltaPort(rng *rand.Rand, j int, pn string, varyTimeouts bool) *lb.ServicePort {
	cip := j + 1
	if rng.IntN(5) == 0 {
		cip = rng.IntN(8) + 1
	}
	sp := &lb.ServicePort{Name: spn("ns", fmt.Sprintf("s%d", j), pn), ClusterIPs: []netip.Addr{netip.AddrFrom4([4]byte{10, 96, 0, byte(cip)})},
		Port: uint16(80 + j*2 + int(pn[0]-'a'))} // unique: a cluster IP and port are one Service's
	if rng.IntN(8) == 0 {
		sp.ClusterIPs = []netip.Addr{netip.MustParseAddr("fd00::1")} // not this family's
	}
	for k := rng.IntN(4); k > 0; k-- {
		e := ep(netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 244, byte(j), byte(k)}), 8080).String())
		e.Local = rng.IntN(2) == 0
		sp.Endpoints = append(sp.Endpoints, e)
	}
	if rng.IntN(2) == 0 {
		sp.NodePort = uint16(30000 + j*2 + int(pn[0]-'a'))
		sp.ExternalLocal = rng.IntN(2) == 0
	}
	if rng.IntN(3) == 0 {
		sp.Affinity = lb.Affinity{ClientIP: true, Timeout: time.Hour}
		if varyTimeouts {
			sp.Affinity.Timeout = time.Duration(1+rng.IntN(2)) * time.Hour
		}
	}
	return sp
}

// A partial sync from a snapshot's delta leaves the table as a partial
// sync that compares every port does, along random walks of deltas (ports
// added, changed, removed, named with no change, cluster IPs shared and
// moved, affinity timeouts changed, skipped states, failed transactions),
// and as a fresh full sync
// does; and it writes as many ports as that one.
func TestDeltaSyncsLeaveWhatFullComparisonsLeave(t *testing.T) {
	rng := rand.New(rand.NewPCG(13, 14))
	ctx := context.Background()
	deltas, partials := 0, 0
	for round := 0; round < 8; round++ {
		// Half the rounds change affinity timeouts, failed transactions
		// among them: knftables' Fake (as some kernels) keeps a redeclared
		// set's old timeout, so the full sync after a failure must replace
		// the sets whose timeout changed from what the failed one left.
		varyTimeouts := round%2 == 0
		withDelta := &failingNFT{Fake: knftables.NewFake(knftables.IPv4Family, Table)}
		compared := &failingNFT{Fake: knftables.NewFake(knftables.IPv4Family, Table)}
		pd := &Proxier{NFT: withDelta, Options: opts(), FullSyncBatch: -1}
		pc := &Proxier{NFT: compared, Options: opts(), FullSyncBatch: -1}
		ports := map[lb.ServicePortName]*lb.ServicePort{}
		for j := range 6 {
			for _, pn := range []string{"a", "b"} {
				sp := deltaPort(rng, j, pn, varyTimeouts)
				ports[sp.Name] = sp
			}
		}
		cur := lb.NewSnapshot(ports)
		cur.ID = 1
		for step := 0; step < 40; step++ {
			set := map[lb.ServicePortName]*lb.ServicePort{}
			var del []lb.ServicePortName
			for k := rng.IntN(4); k >= 0; k-- {
				j, pn := rng.IntN(8), []string{"a", "b"}[rng.IntN(2)]
				name := spn("ns", fmt.Sprintf("s%d", j), pn)
				switch old := cur.Ports.Get(name); {
				case old != nil && rng.IntN(4) == 0:
					del = append(del, name)
				case old != nil && rng.IntN(4) == 0:
					c := *old
					set[name] = &c
				default:
					set[name] = deltaPort(rng, j, pn, varyTimeouts)
				}
			}
			next := cur.With(set, del)
			next.ID = cur.ID + 1
			cur = next
			if rng.IntN(8) == 0 {
				continue // never applied
			}
			fail := rng.IntN(10) == 0
			withDelta.fail, compared.fail = fail, fail
			before := pd.deltas
			std, errd := pd.SyncStats(ctx, cur)
			stc, errc := pc.SyncStats(ctx, &lb.Snapshot{Ports: cur.Ports})
			if (errd == nil) != (errc == nil) || std != stc {
				t.Fatalf("round %d step %d: with delta %+v %v, compared %+v %v", round, step, std, errd, stc, errc)
			}
			if errd != nil {
				continue
			}
			if !std.Full {
				partials++
				if pd.deltas > before {
					deltas++
				}
			}
			if got, want := normalized(withDelta.Dump()), normalized(compared.Dump()); got != want {
				t.Fatalf("round %d step %d (full=%v, delta=%v): tables differ:\n%s\nwant:\n%s", round, step, std.Full, pd.deltas > before, got, want)
			}
			fresh := knftables.NewFake(knftables.IPv4Family, Table)
			if err := (&Proxier{NFT: fresh, Options: opts(), FullSyncBatch: -1}).Sync(ctx, cur); err != nil {
				t.Fatal(err)
			}
			settle(t, pc, compared, &lb.Snapshot{Ports: cur.Ports})
			if got, want := settle(t, pd, withDelta, cur), normalized(fresh.Dump()); got != want {
				t.Fatalf("round %d step %d: the table differs from a full sync's:\n%s\nwant:\n%s", round, step, got, want)
			}
			if len(pd.from) != cur.Ports.Len() {
				t.Fatalf("round %d step %d: %d ports recorded, the state has %d", round, step, len(pd.from), cur.Ports.Len())
			}
		}
	}
	if deltas == 0 || deltas < partials/2 {
		t.Fatalf("%d of %d partial syncs were from the delta", deltas, partials)
	}
	t.Logf("%d of %d partial syncs from the delta", deltas, partials)
}

// A sync that fails while an affinity timeout changes leaves the set with
// the old one; the full sync after it replaces the set, as a sync from a
// known table does (knftables' Fake, as some kernels, keeps a redeclared
// set's old timeout).
func TestFullSyncAfterAFailureReplacesAChangedAffinitySet(t *testing.T) {
	ctx := context.Background()
	for _, batch := range []int{-1, 1} { // one transaction; in batches of a port
		nft := &failingNFT{Fake: knftables.NewFake(knftables.IPv4Family, Table)}
		p := &Proxier{NFT: nft, Options: opts(), FullSyncBatch: batch}
		state := func(timeout time.Duration) *lb.Snapshot {
			sticky := &lb.ServicePort{Name: spn("ns", "sticky", "a"), ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.1")}, Port: 80,
				Endpoints: []lb.Endpoint{ep("10.244.0.1:8080")}, Affinity: lb.Affinity{ClientIP: true, Timeout: timeout}}
			other := &lb.ServicePort{Name: spn("ns", "other", "a"), ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.2")}, Port: 80,
				Endpoints: []lb.Endpoint{ep("10.244.0.2:8080")}}
			return lb.NewSnapshot(map[lb.ServicePortName]*lb.ServicePort{sticky.Name: sticky, other.Name: other})
		}
		if err := p.Sync(ctx, state(time.Hour)); err != nil {
			t.Fatal(err)
		}
		nft.fail = true
		if err := p.Sync(ctx, state(2*time.Hour)); err == nil {
			t.Fatal("the failing transaction did not fail")
		}
		if err := p.Sync(ctx, state(2*time.Hour)); err != nil {
			t.Fatal(err)
		}
		fresh := knftables.NewFake(knftables.IPv4Family, Table)
		if err := (&Proxier{NFT: fresh, Options: opts(), FullSyncBatch: batch}).Sync(ctx, state(2*time.Hour)); err != nil {
			t.Fatal(err)
		}
		if got, want := normalized(nft.Dump()), normalized(fresh.Dump()); got != want {
			t.Fatalf("batch %d: after the failure, the table differs from a full sync's:\n%s\nwant:\n%s", batch, got, want)
		}
	}
}

// The proxier keeps an applied port's fingerprint alone (its affinity
// sets too, when it has some) and makes its chains and elements again
// from the port when it changes. Should that rendering not be what was
// applied, the sync lists and rewrites the whole table instead of
// writing a change from a wrong start.
func TestAppliedPortsAreKeptSlimAndRemadeWhenChanged(t *testing.T) {
	ctx := context.Background()
	snap := movedPorts(8, 0)
	snap.ID = 1
	fake := knftables.NewFake(knftables.IPv4Family, Table)
	p := &Proxier{NFT: fake, Options: opts()}
	if err := p.Sync(ctx, snap); err != nil {
		t.Fatal(err)
	}
	var slim []int // the ports with endpoints kept slim, by index in snap.Sorted()
	for i, sp := range snap.Sorted() {
		b := p.applied[sp.Name]
		if whole := len(b.sets) > 0; whole == b.slimmed || b.slimmed && (b.chains != nil || b.elems != nil) {
			t.Fatalf("%v after a full sync: %+v; want it whole only with affinity sets", sp.Name, b)
		}
		if b.slimmed && len(sp.Endpoints) > 0 {
			slim = append(slim, i)
		}
	}
	if len(slim) < 2 || len(slim) == len(p.applied) {
		t.Fatalf("%d of %d ports slim; the test wants two or more, and one with affinity sets", len(slim), len(p.applied))
	}
	// A partial sync from the delta: the changed port is remade whole to
	// write its change, then kept slim again.
	moved := movedPorts(8, 10).Sorted()[slim[0]]
	next := snap.With(map[lb.ServicePortName]*lb.ServicePort{moved.Name: moved}, nil)
	next.ID = 2
	if st, err := p.SyncStats(ctx, next); err != nil || st.Full || st.Changed != 1 {
		t.Fatalf("%+v %v, want a partial sync of one port", st, err)
	}
	if b := p.applied[moved.Name]; !b.slimmed {
		t.Fatalf("the changed port is kept whole: %+v", b)
	}
	if got, want := settle(t, p, fake, next), oneTransaction(t, next); got != want {
		t.Fatalf("after the partial sync:\n%s\nwant:\n%s", got, want)
	}
	// What was applied of a port no longer renders from it (as if its
	// rendering had changed): the next change of it makes a full sync.
	other := next.Sorted()[slim[1]]
	p.applied[other.Name] = &portBundle{fp: p.applied[other.Name].fp + 1, slimmed: true}
	movedOther := movedPorts(8, 20).Sorted()[slim[1]]
	last := next.With(map[lb.ServicePortName]*lb.ServicePort{movedOther.Name: movedOther}, nil)
	last.ID = 3
	if st, err := p.SyncStats(ctx, last); err != nil || !st.Full {
		t.Fatalf("%+v %v, want a full sync", st, err)
	}
	if got, want := settle(t, p, fake, last), oneTransaction(t, last); got != want {
		t.Fatalf("after the full sync:\n%s\nwant:\n%s", got, want)
	}
	if st, err := p.SyncStats(ctx, last); err != nil || st.Full || st.Changed != 0 {
		t.Fatalf("%+v %v, want partial syncs again", st, err)
	}
}
