package portals

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"runtime"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/knftables"

	"github.com/sluice-proxy/sluice/lb"
)

// The nftables method: a redirected portal is an element of its
// protocol's map, looked up by one rule per protocol in each chain; a
// portal with DNAT to an address or with source ranges is a rule of its
// own, before the lookups; the other family is left out. A second sync
// with fewer portals leaves exactly those; cleanup deletes the table and a
// second cleanup is no error.
func TestNFTablesPortals(t *testing.T) {
	ps := []Portal{
		{Service: "e2e/web:http", Protocol: lb.TCP, IP: netip.MustParseAddr("10.96.0.10"), Port: 80, To: netip.MustParseAddrPort("0.0.0.0:40001")},
		{Service: "e2e/web:dns", Protocol: lb.UDP, IP: netip.MustParseAddr("10.96.0.10"), Port: 53, To: netip.MustParseAddrPort("192.168.10.1:40002")},
		{Service: "e2e/lb:http", Protocol: lb.TCP, IP: netip.MustParseAddr("203.0.113.20"), Port: 80, To: netip.MustParseAddrPort("0.0.0.0:40003"),
			SourceRanges: []netip.Prefix{netip.MustParsePrefix("192.168.10.0/24"), netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("fd00::/8")}},
		{Service: "e2e/v6:http", Protocol: lb.TCP, IP: netip.MustParseAddr("fd00:96::10"), Port: 80, To: netip.MustParseAddrPort("[::]:40004")},
	}
	fake := knftables.NewFake(knftables.IPv4Family, NFTablesTable)
	c := &NFTables{NFT: fake}
	if err := c.Sync(context.Background(), ps); err != nil {
		t.Fatal(err)
	}
	dump := fake.Dump()
	for _, want := range []string{
		"add map ip sluice-portals tcp-portals { type ipv4_addr . inet_service : inet_service ; }",
		"add element ip sluice-portals tcp-portals { 10.96.0.10 . 80 : 40001 }",
	} {
		if !strings.Contains(dump, want+"\n") {
			t.Errorf("no %q in\n%s", want, dump)
		}
	}
	for _, chain := range []string{"prerouting", "output"} {
		for _, want := range []string{
			"add chain ip sluice-portals " + chain + " { type nat hook " + chain + " priority -100 ; }",
			"add rule ip sluice-portals " + chain + " ip daddr 10.96.0.10 udp dport 53 dnat to 192.168.10.1:40002 comment \"e2e/web:dns\"",
			"add rule ip sluice-portals " + chain + " ip saddr { 192.168.10.0/24, 10.0.0.0/8 } ip daddr 203.0.113.20 tcp dport 80 redirect to :40003 comment \"e2e/lb:http\"",
			"add rule ip sluice-portals " + chain + " meta l4proto tcp redirect to :ip daddr . tcp dport map @tcp-portals",
			"add rule ip sluice-portals " + chain + " meta l4proto udp redirect to :ip daddr . udp dport map @udp-portals",
		} {
			if !strings.Contains(dump, want+"\n") {
				t.Errorf("no %q in\n%s", want, dump)
			}
		}
		// The portals' own rules come before the lookups.
		if strings.Index(dump, "add rule ip sluice-portals "+chain+" ip saddr") > strings.Index(dump, "add rule ip sluice-portals "+chain+" meta l4proto tcp") {
			t.Errorf("a portal's own rule after the lookups in %s:\n%s", chain, dump)
		}
	}
	if strings.Contains(dump, "fd00") || strings.Contains(dump, "40003 }") {
		t.Errorf("IPv6, or a portal with source ranges, in the maps:\n%s", dump)
	}
	if ok, err := c.Present(context.Background()); !ok || err != nil {
		t.Fatalf("Present after a sync: %v, %v", ok, err)
	}
	if err := c.Sync(context.Background(), ps[:1]); err != nil {
		t.Fatal(err)
	}
	if dump := fake.Dump(); strings.Count(dump, "add rule") != 6 || strings.Count(dump, "add element") != 1 || !strings.Contains(dump, "10.96.0.10 . 80 : 40001") {
		t.Fatalf("after a sync with one portal:\n%s", dump)
	}
	for i := 0; i < 2; i++ {
		if err := CleanupNFTables(context.Background(), fake); err != nil {
			t.Fatalf("cleanup #%d: %v", i+1, err)
		}
	}
	if ok, err := c.Present(context.Background()); ok || err != nil {
		t.Fatalf("Present after cleanup: %v, %v", ok, err)
	}
}

// randomPortals is a random list of portals of both families: mostly
// redirects (map elements), some DNATs and source ranges (rules).
func randomPortals(rng *rand.Rand) []Portal {
	var ps []Portal
	for i := range rng.IntN(40) {
		p := Portal{Service: fmt.Sprintf("ns/s%d:p", i), Protocol: []lb.Protocol{lb.TCP, lb.UDP, lb.SCTP}[rng.IntN(3)],
			IP: netip.AddrFrom4([4]byte{10, 96, 0, byte(rng.IntN(30))}), Port: uint16(80 + rng.IntN(3)),
			To: netip.AddrPortFrom(netip.IPv4Unspecified(), uint16(40000+rng.IntN(50)))}
		if rng.IntN(6) == 0 {
			p.IP, p.To = netip.MustParseAddr("fd00::10"), netip.AddrPortFrom(netip.IPv6Unspecified(), p.To.Port())
		}
		switch rng.IntN(10) {
		case 0:
			p.To = netip.AddrPortFrom(netip.MustParseAddr("192.168.10.1"), p.To.Port())
		case 1:
			p.SourceRanges = []netip.Prefix{netip.MustParsePrefix("192.168.10.0/24")}
		}
		// One portal per address, port and protocol, as the listeners make them.
		if !slices.ContainsFunc(ps, func(q Portal) bool { return q.IP == p.IP && q.Port == p.Port && q.Protocol == p.Protocol }) {
			ps = append(ps, p)
		}
	}
	return ps
}

// A Sync after the first writes only the map elements that changed (and
// the portals' own rules when they did), nothing when nothing changed, and
// leaves the table exactly as a whole write of the same portals does,
// along random lists of portals with failed transactions and
// invalidations among them.
func TestNFTablesPortalSyncsWriteOnlyWhatChanged(t *testing.T) {
	rng := rand.New(rand.NewPCG(31, 32))
	ctx := context.Background()
	fake := &failingNFT{Fake: knftables.NewFake(knftables.IPv4Family, NFTablesTable)}
	c := &NFTables{NFT: fake}
	ps := randomPortals(rng)
	if err := c.Sync(ctx, ps); err != nil {
		t.Fatal(err)
	}
	partial := 0
	for step := 0; step < 300; step++ {
		switch rng.IntN(10) {
		case 0:
			ps = randomPortals(rng)
		case 1:
			c.Invalidate()
		case 2:
			fake.fail = true
		case 3:
			// Deleted behind sluice's back: a sync that writes changes
			// alone fails, and the next one writes the table whole.
			if err := CleanupNFTables(ctx, fake); err != nil {
				t.Fatal(err)
			}
			ps = append(slices.Clone(ps), Portal{Service: "ns/new:p", Protocol: lb.TCP, IP: netip.MustParseAddr("10.96.1.1"), Port: 80,
				To: netip.AddrPortFrom(netip.IPv4Unspecified(), 40100+uint16(step))})
			partialNext := c.applied != nil
			if err := c.Sync(ctx, ps); (err == nil) == partialNext {
				t.Fatalf("step %d: a sync into a deleted table: %v (it wrote changes alone: %v)", step, err, partialNext)
			}
		}
		// Move, drop and add a few.
		for k := rng.IntN(3); k > 0 && len(ps) > 0; k-- {
			i := rng.IntN(len(ps))
			switch rng.IntN(3) {
			case 0:
				ps[i].To = netip.AddrPortFrom(ps[i].To.Addr(), uint16(40000+rng.IntN(50)))
			case 1:
				ps = slices.Delete(slices.Clone(ps), i, i+1)
			case 2:
				ps = append(slices.Clone(ps), randomPortals(rng)...)
				slices.SortFunc(ps, func(a, b Portal) int { return strings.Compare(a.String(), b.String()) })
				ps = slices.CompactFunc(ps, func(a, b Portal) bool { return a.IP == b.IP && a.Port == b.Port && a.Protocol == b.Protocol })
			}
		}
		whole, writes := c.whole, c.writes
		failing := fake.fail
		err := c.Sync(ctx, ps)
		if ran := c.writes > writes; (err != nil) != (failing && ran) {
			t.Fatalf("step %d: failing %v, a transaction run %v, error %v", step, failing, ran, err)
		}
		fake.fail = false // a sync with nothing to write ran none to fail
		if err != nil {
			continue
		}
		if c.whole == whole {
			partial++
		}
		fresh := knftables.NewFake(knftables.IPv4Family, NFTablesTable)
		if err := (&NFTables{NFT: fresh}).Sync(ctx, ps); err != nil {
			t.Fatal(err)
		}
		if got, want := elementsSorted(fake.Dump()), elementsSorted(fresh.Dump()); got != want {
			t.Fatalf("step %d (whole=%v): the table differs from a whole write:\n%s\nwant:\n%s", step, c.whole > whole, got, want)
		}
		// Nothing changed: no transaction.
		writes = c.writes
		if err := c.Sync(ctx, ps); err != nil || c.writes != writes {
			t.Fatalf("step %d: a sync with nothing changed ran a transaction (%d -> %d) or failed: %v", step, writes, c.writes, err)
		}
	}
	if partial < 100 {
		t.Fatalf("only %d syncs wrote changes alone", partial)
	}
}

// One portal changed among many: one transaction of two element
// operations, not the table.
func TestNFTablesPortalChangeIsTwoElementOperations(t *testing.T) {
	ctx := context.Background()
	var ps []Portal
	for i := range 500 {
		ps = append(ps, Portal{Service: fmt.Sprintf("ns/s%d:p", i), Protocol: lb.TCP, IP: netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)}), Port: 80,
			To: netip.AddrPortFrom(netip.IPv4Unspecified(), uint16(40000+i))})
	}
	rec := &recordingNFT{Fake: knftables.NewFake(knftables.IPv4Family, NFTablesTable)}
	c := &NFTables{NFT: rec}
	if err := c.Sync(ctx, ps); err != nil {
		t.Fatal(err)
	}
	ps[250].To = netip.AddrPortFrom(netip.IPv4Unspecified(), 50000)
	if err := c.Sync(ctx, ps); err != nil {
		t.Fatal(err)
	}
	want := "delete element ip sluice-portals tcp-portals { 10.96.0.250 . 80 }\nadd element ip sluice-portals tcp-portals { 10.96.0.250 . 80 : 50000 }\n"
	if rec.last != want {
		t.Fatalf("the transaction was\n%s\nwant\n%s", rec.last, want)
	}
}

// failingNFT is a Fake whose next transaction fails when fail is set.
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

// recordingNFT keeps the last transaction's text.
type recordingNFT struct {
	*knftables.Fake
	last string
}

func (r *recordingNFT) Run(ctx context.Context, tx *knftables.Transaction) error {
	r.last = tx.String()
	return r.Fake.Run(ctx, tx)
}

// elementsSorted is a dump with its map elements sorted: a map has no
// order, the Fake keeps them in the order they were added. Rules keep
// theirs.
func elementsSorted(dump string) string {
	var elements, other []string
	for _, l := range strings.Split(dump, "\n") {
		if strings.HasPrefix(l, "add element ") {
			elements = append(elements, l)
		} else {
			other = append(other, l)
		}
	}
	slices.Sort(elements)
	return strings.Join(append(other, elements...), "\n")
}

// Change applies some portals going and coming as element operations
// alone, leaving the table a whole write of the resulting portals leaves;
// it refuses (ErrWholeNeeded, nothing written) portals with rules of
// their own and a table it has not applied, and a failed one makes the
// next change refuse too.
func TestNFTablesPortalChangeLeavesWhatAWholeWriteLeaves(t *testing.T) {
	rng := rand.New(rand.NewPCG(41, 42))
	ctx := context.Background()
	fake := &failingNFT{Fake: knftables.NewFake(knftables.IPv4Family, NFTablesTable)}
	c := &NFTables{NFT: fake}
	if err := c.Change(ctx, nil, nil); !errors.Is(err, ErrWholeNeeded) {
		t.Fatalf("a change before any sync: %v, want ErrWholeNeeded", err)
	}
	cur := map[string]Portal{} // by destination
	key := func(p Portal) string { return string(p.Protocol) + netip.AddrPortFrom(p.IP, p.Port).String() }
	list := func() []Portal {
		var out []Portal
		for _, p := range cur {
			out = append(out, p)
		}
		slices.SortFunc(out, func(a, b Portal) int { return strings.Compare(key(a), key(b)) })
		return out
	}
	if err := c.Sync(ctx, nil); err != nil {
		t.Fatal(err)
	}
	changed, refused := 0, 0
	for step := range 300 {
		var del, add []Portal
		some := randomPortals(rng)
		for _, p := range some[:min(len(some), rng.IntN(4))] {
			if old, ok := cur[key(p)]; ok && rng.IntN(2) == 0 {
				del = append(del, old)
				if rng.IntN(2) == 0 { // moved, not gone
					add = append(add, p)
				}
				continue
			}
			if _, ok := cur[key(p)]; ok {
				del = append(del, cur[key(p)])
			}
			add = append(add, p)
		}
		failing := rng.IntN(12) == 0
		fake.fail = failing
		writes := c.writes
		err := c.Change(ctx, del, add)
		if errors.Is(err, ErrWholeNeeded) && c.writes != writes {
			t.Fatalf("step %d: a refused change wrote", step)
		}
		for _, p := range del {
			delete(cur, key(p))
		}
		for _, p := range add {
			cur[key(p)] = p
		}
		switch {
		case errors.Is(err, ErrWholeNeeded):
			refused++
			fake.fail = false
			if err := c.Sync(ctx, list()); err != nil {
				t.Fatal(err)
			}
		case err != nil:
			if !failing {
				t.Fatalf("step %d: %v", step, err)
			}
			if err := c.Change(ctx, nil, nil); !errors.Is(err, ErrWholeNeeded) {
				t.Fatalf("step %d: a change after a failed one: %v, want ErrWholeNeeded", step, err)
			}
			fake.fail = false
			if err := c.Sync(ctx, list()); err != nil {
				t.Fatal(err)
			}
		default:
			changed++
		}
		fake.fail = false
		fresh := knftables.NewFake(knftables.IPv4Family, NFTablesTable)
		if err := (&NFTables{NFT: fresh}).Sync(ctx, list()); err != nil {
			t.Fatal(err)
		}
		if got, want := elementsSorted(fake.Dump()), elementsSorted(fresh.Dump()); got != want {
			t.Fatalf("step %d: the table differs from a whole write:\n%s\nwant:\n%s", step, got, want)
		}
	}
	if changed < 100 || refused == 0 {
		t.Fatalf("%d changes applied alone, %d refused", changed, refused)
	}
}

// BenchmarkNFTablesHeldBytesPerPortal is what the nftables capture keeps
// per redirected portal once a sync of 10,000 has applied (the applied
// elements it diffs the next sync against): issue 16's memory budget.
func BenchmarkNFTablesHeldBytesPerPortal(b *testing.B) {
	const n = 10000
	ps := make([]Portal, n)
	for i := range ps {
		ps[i] = Portal{Service: fmt.Sprintf("scale/s%d:p", i), Protocol: lb.TCP, IP: netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)}),
			Port: 80, To: netip.MustParseAddrPort("0.0.0.0:40000")}
	}
	var perPortal float64
	for b.Loop() {
		c := &NFTables{NFT: knftables.NewFake(knftables.IPv4Family, NFTablesTable)}
		before := heldHeap()
		if err := c.Sync(context.Background(), ps); err != nil {
			b.Fatal(err)
		}
		c.NFT = nil // the fake's copy of the table is not the capture's
		perPortal = float64(heldHeap()-before) / n
		if got := len(c.applied.elements); got != n {
			b.Fatalf("%d elements applied, want %d", got, n)
		}
		runtime.KeepAlive(c)
	}
	b.ReportMetric(perPortal, "B/portal")
}

func heldHeap() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}
