package lb

import (
	"github.com/sluice-proxy/sluice/affinity"
	"math/rand/v2"
	"slices"

	"net/netip"
	"sync"
	"testing"
	"time"
)

func eps(ss ...string) []netip.AddrPort {
	out := make([]netip.AddrPort, len(ss))
	for i, s := range ss {
		out[i] = netip.MustParseAddrPort(s)
	}
	return out
}

var (
	a, b, c = eps("10.0.0.1:80")[0], eps("10.0.0.2:80")[0], eps("10.0.0.3:80")[0]
	cli1    = netip.MustParseAddr("192.168.0.1")
	cli2    = netip.MustParseAddr("192.168.0.2")
)

func first(t *testing.T, p *Picker, client netip.Addr) netip.AddrPort {
	t.Helper()
	o, err := p.Order(client)
	if err != nil {
		t.Fatalf("Order: %v", err)
	}
	return o[0]
}

func TestNoEndpoints(t *testing.T) {
	p := NewPicker(affinity.NewManualClock(time.Time{}), DefaultEjectionPolicy())
	if _, err := p.Order(cli1); err != ErrNoEndpoints {
		t.Fatalf("err = %v, want ErrNoEndpoints", err)
	}
}

func TestRoundRobinIsAStrictCycleAndOrderCoversAll(t *testing.T) {
	p := NewPicker(affinity.NewManualClock(time.Time{}), DefaultEjectionPolicy())
	p.SetEndpoints([]netip.AddrPort{a, b, c})
	var got []netip.AddrPort
	for i := 0; i < 6; i++ {
		o, _ := p.Order(cli1)
		if len(o) != 3 {
			t.Fatalf("order %v does not hold every endpoint", o)
		}
		got = append(got, o[0])
	}
	want := []netip.AddrPort{a, b, c, a, b, c}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("picks %v, want %v", got, want)
		}
	}
}

func TestConcurrentRoundRobinIsFair(t *testing.T) {
	p := NewPicker(affinity.NewManualClock(time.Time{}), DefaultEjectionPolicy())
	p.SetEndpoints([]netip.AddrPort{a, b, c})
	var mu sync.Mutex
	counts := map[netip.AddrPort]int{}
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 300; i++ {
				o, _ := p.Order(cli1)
				mu.Lock()
				counts[o[0]]++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	for _, ep := range []netip.AddrPort{a, b, c} {
		if counts[ep] != 400 {
			t.Fatalf("counts %v, want 400 each", counts)
		}
	}
}

func TestAffinityPinsAndSurvivesUnrelatedUpdate(t *testing.T) {
	clk := affinity.NewManualClock(time.Unix(0, 0))
	p := NewPicker(clk, DefaultEjectionPolicy())
	p.SetEndpoints([]netip.AddrPort{a, b, c})
	p.SetAffinity(Affinity{ClientIP: true, Timeout: time.Minute})
	e1 := first(t, p, cli1)
	p.Connected(cli1, e1)
	e2 := first(t, p, cli2)
	p.Connected(cli2, e2)
	if e1 == e2 {
		t.Fatalf("two new clients got the same endpoint %v", e1)
	}
	for i := 0; i < 5; i++ {
		if got := first(t, p, cli1); got != e1 {
			t.Fatalf("pinned client moved from %v to %v", e1, got)
		}
	}
	// Removing the endpoint of cli2 moves only cli2.
	var keep []netip.AddrPort
	for _, ep := range []netip.AddrPort{a, b, c} {
		if ep != e2 {
			keep = append(keep, ep)
		}
	}
	p.SetEndpoints(keep)
	if got := first(t, p, cli1); got != e1 {
		t.Fatalf("unrelated update moved cli1 from %v to %v", e1, got)
	}
	if got := first(t, p, cli2); got == e2 {
		t.Fatalf("cli2 still goes to removed endpoint %v", e2)
	}
	// Changing the timeout keeps pins; expiry drops them.
	p.SetAffinity(Affinity{ClientIP: true, Timeout: 10 * time.Second})
	if got := first(t, p, cli1); got != e1 {
		t.Fatalf("timeout change moved cli1")
	}
	clk.Step(11 * time.Second)
	p.ExpirePins()
	p.SetAffinity(Affinity{}) // off drops all
	p.SetAffinity(Affinity{ClientIP: true, Timeout: time.Minute})
	if t2 := p.affinity.Load(); t2.Len() != 0 {
		t.Fatalf("pins survived affinity None: %d", t2.Len())
	}
}

func TestFailedPinIsRepinnedToTheAnsweringEndpoint(t *testing.T) {
	p := NewPicker(affinity.NewManualClock(time.Time{}), DefaultEjectionPolicy())
	p.SetEndpoints([]netip.AddrPort{a, b, c})
	p.SetAffinity(Affinity{ClientIP: true, Timeout: time.Minute})
	p.Connected(cli1, a)
	o, _ := p.Order(cli1)
	if o[0] != a {
		t.Fatalf("pin not first: %v", o)
	}
	p.Failed(cli1, a)
	p.Connected(cli1, o[1])
	if got := first(t, p, cli1); got != o[1] {
		t.Fatalf("client not re-pinned to %v, got %v", o[1], got)
	}
}

func TestEjectionSkipsThenProbesWithBackoff(t *testing.T) {
	clk := affinity.NewManualClock(time.Unix(0, 0))
	p := NewPicker(clk, EjectionPolicy{Failures: 2, Backoff: time.Second, MaxBackoff: 4 * time.Second})
	p.SetEndpoints([]netip.AddrPort{a, b})
	if p.Failed(cli1, a) {
		t.Fatal("ejected after one failure")
	}
	if !p.Failed(cli1, a) {
		t.Fatal("not ejected after two failures")
	}
	for i := 0; i < 4; i++ {
		o, _ := p.Order(cli1)
		if o[0] != b || o[len(o)-1] != a {
			t.Fatalf("ejected endpoint not last: %v", o)
		}
	}
	clk.Step(time.Second)
	seen := false
	for i := 0; i < 2; i++ {
		if first(t, p, cli1) == a {
			seen = true
		}
	}
	if !seen {
		t.Fatal("endpoint not probed after back-off")
	}
	// A failed probe doubles the back-off.
	p.Failed(cli1, a)
	clk.Step(time.Second)
	if !p.Ejected(a) {
		t.Fatal("back-off did not double")
	}
	clk.Step(time.Second)
	if p.Ejected(a) {
		t.Fatal("still ejected after doubled back-off")
	}
	// Success forgives.
	p.Connected(cli1, a)
	if p.Failed(cli1, a) {
		t.Fatal("history not forgiven after success")
	}
}

func TestUsableFallsBackToServingTerminating(t *testing.T) {
	sp := &ServicePort{Endpoints: []Endpoint{
		{Addr: EndpointAddrOf(a), Ready: false, Serving: true, Terminating: true},
		{Addr: EndpointAddrOf(b), Ready: false, Serving: false, Terminating: true},
	}}
	if got := sp.Usable(); len(got) != 1 || got[0] != a {
		t.Fatalf("Usable = %v, want [%v]", got, a)
	}
	sp.Endpoints = append(sp.Endpoints, Endpoint{Addr: EndpointAddrOf(c), Ready: true, Serving: true})
	if got := sp.Usable(); len(got) != 1 || got[0] != c {
		t.Fatalf("Usable = %v, want ready only [%v]", got, c)
	}
}

func TestRetryPolicyBudget(t *testing.T) {
	p := DefaultRetryPolicy()
	want := []time.Duration{250 * time.Millisecond, 500 * time.Millisecond, time.Second, 2 * time.Second}
	for i, w := range want {
		if got, ok := p.TryTimeout(i, 0); !ok || got != w {
			t.Fatalf("try %d = %v %v, want %v", i, got, ok, w)
		}
	}
	if _, ok := p.TryTimeout(4, 0); ok {
		t.Fatal("a fifth try was allowed")
	}
	if got, ok := p.TryTimeout(3, 3500*time.Millisecond); !ok || got != 250*time.Millisecond {
		t.Fatalf("budget clip = %v %v", got, ok)
	}
	if _, ok := p.TryTimeout(1, 4*time.Second); ok {
		t.Fatal("try allowed after budget ran out")
	}
	if err := (RetryPolicy{}).Validate(); err == nil {
		t.Fatal("empty policy validated")
	}
}

func TestServicePortNameString(t *testing.T) {
	if s := (ServicePortName{Namespace: "ns1", Name: "svc1", Port: "p80"}).String(); s != "ns1/svc1:p80" {
		t.Fatal(s)
	}
	if s := (ServicePortName{Namespace: "ns1", Name: "svc1"}).String(); s != "ns1/svc1" {
		t.Fatal(s)
	}
}

func TestWalkTriesEachEndpointOnceWithinAttempts(t *testing.T) {
	start := time.Unix(0, 0)
	w := new(Walk)
	DefaultRetryPolicy().Rewalk(w, []netip.AddrPort{a, b, c}, start)
	var got []netip.AddrPort
	for {
		ep, to, ok := w.Next(start)
		if !ok {
			break
		}
		if to <= 0 {
			t.Fatal("non-positive timeout")
		}
		got = append(got, ep)
	}
	if len(got) != 3 || got[0] != a || got[2] != c {
		t.Fatalf("walk = %v", got)
	}
	p := RetryPolicy{Attempts: 2, TryTimeouts: []time.Duration{time.Second}, Budget: 5 * time.Second}
	p.Rewalk(w, []netip.AddrPort{a, b, c}, start)
	w.Next(start)
	w.Next(start)
	if _, _, ok := w.Next(start); ok {
		t.Fatal("walk exceeded Attempts")
	}
	p.Rewalk(w, []netip.AddrPort{a, b}, start)
	if _, _, ok := w.Next(start.Add(6 * time.Second)); ok {
		t.Fatal("walk exceeded budget")
	}
}

func TestUsableUnderLocalPolicies(t *testing.T) {
	sp := &ServicePort{InternalLocal: true, Endpoints: []Endpoint{
		{Addr: EndpointAddrOf(a), Ready: true, Serving: true},                    // remote, ready
		{Addr: EndpointAddrOf(b), Serving: true, Terminating: true, Local: true}, // local, terminating
		{Addr: EndpointAddrOf(c), Ready: true, Serving: true, Local: true},       // local, ready
	}}
	if got := sp.Usable(); len(got) != 1 || got[0] != c {
		t.Fatalf("ITP Local: Usable = %v, want the local ready one", got)
	}
	if got := sp.UsableExternal(); len(got) != 2 {
		t.Fatalf("ETP Cluster: UsableExternal = %v, want both ready ones", got)
	}
	if !sp.SplitPolicy() {
		t.Fatal("ITP Local with ETP Cluster must split")
	}
	// No local ready endpoint: fall back to local serving terminating ones,
	// never to a remote ready one.
	sp.Endpoints = sp.Endpoints[:2]
	if got := sp.Usable(); len(got) != 1 || got[0] != b {
		t.Fatalf("ITP Local fallback: Usable = %v, want the local terminating one", got)
	}
	sp.Endpoints = sp.Endpoints[:1]
	if got := sp.Usable(); len(got) != 0 {
		t.Fatalf("ITP Local with no local endpoint: Usable = %v, want none", got)
	}
}

// OnEject hears of each ejection, with the back-off.
func TestOnEjectHearsEjections(t *testing.T) {
	var got []string
	p := NewPicker(nil, EjectionPolicy{Failures: 2, Backoff: time.Second, MaxBackoff: time.Minute,
		OnEject: func(_ ServicePortName, ep netip.AddrPort, d time.Duration) {
			got = append(got, ep.String()+" "+d.String())
		}})
	ep := netip.MustParseAddrPort("10.0.0.1:80")
	p.SetEndpoints([]netip.AddrPort{ep})
	client := netip.MustParseAddr("192.0.2.1")
	p.Failed(client, ep)
	if len(got) != 0 {
		t.Fatalf("one failure of two: %v", got)
	}
	p.Failed(client, ep)
	if len(got) != 1 || got[0] != "10.0.0.1:80 1s" {
		t.Fatalf("ejections heard: %v", got)
	}
}

// OnReturn hears of an ejected endpoint that connects again, once; a
// connect that only clears failures short of an ejection is no return.
func TestOnReturnHearsReturns(t *testing.T) {
	var got []string
	p := NewPicker(nil, EjectionPolicy{Failures: 2, Backoff: time.Second, MaxBackoff: time.Minute,
		OnReturn: func(_ ServicePortName, ep netip.AddrPort) { got = append(got, ep.String()) }})
	ep := netip.MustParseAddrPort("10.0.0.1:80")
	p.SetEndpoints([]netip.AddrPort{ep})
	client := netip.MustParseAddr("192.0.2.1")
	p.Failed(client, ep)
	p.Connected(client, ep)
	if len(got) != 0 {
		t.Fatalf("a failure short of ejection, then a connect: %v", got)
	}
	p.Failed(client, ep)
	p.Failed(client, ep)
	p.Connected(client, ep)
	p.Connected(client, ep)
	if len(got) != 1 || got[0] != "10.0.0.1:80" || p.Ejected(ep) {
		t.Fatalf("returns heard: %v (ejected %v)", got, p.Ejected(ep))
	}
}

// A set finds each of its endpoints at its position and no other address,
// by scan below indexFrom endpoints and by map from there.
func TestEndpointSetFindsByScanAndByIndex(t *testing.T) {
	for n := 0; n <= 2*indexFrom; n++ {
		var addrs []netip.AddrPort
		var eps []Endpoint
		for i := 0; i < n; i++ {
			addrs = append(addrs, netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 0, byte(i >> 8), byte(i)}), 8080))
			eps = append(eps, Endpoint{Addr: EndpointAddrOf(addrs[i]), Ready: true})
		}
		s := newEndpointSet(eps)
		if (s.index != nil) != (n >= indexFrom) {
			t.Fatalf("%d endpoints: index kept %v", n, s.index != nil)
		}
		for i, a := range addrs {
			if j, ok := s.find(a); !ok || j != i {
				t.Fatalf("%d endpoints: %s found at %d, %v; want %d", n, a, j, ok, i)
			}
		}
		if s.has(netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 0, 0, 1}), 8081)) || s.has(netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 1, 0, 0}), 8080)) {
			t.Fatalf("%d endpoints: found an address not in the set", n)
		}
	}
}

// SetUsable gives the picker what Select gives, in the same order, and
// shares the port's own list when every endpoint is selected (issue 16's
// memory budget): random ports of ready, serving, terminating and local
// endpoints, both policies.
func TestSetUsableIsSelectAndSharesAWholeList(t *testing.T) {
	rng := rand.New(rand.NewPCG(12, 16))
	shared := 0
	for round := 0; round < 2000; round++ {
		sp := &ServicePort{Name: ServicePortName{Namespace: "ns", Name: "web", Protocol: TCP}}
		for i := rng.IntN(6); i > 0; i-- {
			sp.Endpoints = append(sp.Endpoints, Endpoint{Addr: EndpointAddrFrom(netip.AddrFrom4([4]byte{10, 0, 0, byte(i)}), 80),
				Ready: rng.IntN(4) > 0, Serving: rng.IntN(2) == 0, Terminating: rng.IntN(3) == 0, Local: rng.IntN(3) > 0})
		}
		for _, local := range []bool{false, true} {
			p := NewPicker(nil, DefaultEjectionPolicy())
			p.SetUsable(sp, local)
			if got, want := p.Endpoints(), sp.Select(local); !slices.Equal(got, want) {
				t.Fatalf("round %d, localOnly %v: picker has %v, Select gives %v (endpoints %+v)", round, local, got, want, sp.Endpoints)
			}
			if eps := p.set.Load().eps; len(eps) > 0 && &eps[0] == &sp.Endpoints[0] {
				shared++
				if len(eps) != len(sp.Endpoints) {
					t.Fatalf("round %d: shares part of the list", round)
				}
			} else if len(sp.Endpoints) > 0 && !slices.ContainsFunc(sp.Endpoints, func(ep Endpoint) bool { return !ep.Ready || local && !ep.Local }) {
				t.Fatalf("round %d: every endpoint ready (and local) but copied", round)
			}
		}
	}
	if shared < 100 {
		t.Fatalf("only %d pickers shared their port's list: the walk checks too little", shared)
	}
}

// BenchmarkPickerOrder is the picker's part of a connection: the order to
// try a port's 10 endpoints in, and the connect recorded; whole is every
// endpoint (Order), room-of-4 the first four into a connection's room, as
// the engines ask (AppendOrder, the default retry policy's attempts).
func BenchmarkPickerOrder(b *testing.B) {
	for _, mode := range []string{"whole", "room-of-4"} {
		b.Run(mode, func(b *testing.B) {
			p := NewPicker(nil, DefaultEjectionPolicy())
			addrs := make([]netip.AddrPort, 10)
			for i := range addrs {
				addrs[i] = netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 244, 0, byte(i)}), 8080)
			}
			p.SetEndpoints(addrs)
			client := netip.MustParseAddr("10.0.0.1")
			room := make([]netip.AddrPort, 0, 4)
			b.ReportAllocs()
			for b.Loop() {
				var order []netip.AddrPort
				var err error
				if mode == "whole" {
					order, err = p.Order(client)
				} else {
					order, err = p.AppendOrder(room[:0], client, 4)
				}
				if err != nil {
					b.Fatal(err)
				}
				p.Connected(client, order[0])
			}
		})
	}
}

// refOrder is Order as it was before AppendOrder: every endpoint, the
// pin first, then the healthy ones in round-robin order, then those in
// back-off. It is the reference AppendOrder's prefixes are checked
// against.
func refOrder(p *Picker, client netip.Addr) ([]netip.AddrPort, error) {
	s := p.set.Load()
	n := len(s.eps)
	if n == 0 {
		return nil, ErrNoEndpoints
	}
	out := make([]netip.AddrPort, 0, n)
	pinned := -1
	if t := p.affinity.Load(); t != nil {
		if ep, ok := t.Lookup(client); ok {
			if i, ok := s.find(ep); ok {
				pinned = i
				out = append(out, ep)
			}
		}
	}
	var start int
	if pinned >= 0 {
		start = int(p.next.Load() % uint64(n))
	} else {
		start = int((p.next.Add(1) - 1) % uint64(n))
	}
	now := p.settings.Clock.Now()
	var later []netip.AddrPort
	p.mu.Lock()
	for k := 0; k < n; k++ {
		i := (start + k) % n
		if i == pinned {
			continue
		}
		a := s.eps[i].Addr.AddrPort()
		if h := p.health[a]; h != nil && now.Before(h.ejectedUntil) {
			later = append(later, a)
			continue
		}
		out = append(out, a)
	}
	p.mu.Unlock()
	return append(out, later...), nil
}

// AppendOrder is the first max of the full ordering, appended, through
// ejections, probes, pins and round-robin turns: two pickers driven alike,
// one asked for prefixes, the other for the whole order (refOrder).
func TestAppendOrderIsAPrefixOfTheWholeOrder(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for round := range 50 {
		clk := affinity.NewManualClock(time.Unix(0, 0))
		n := 1 + rng.IntN(12)
		addrs := make([]netip.AddrPort, n)
		for i := range addrs {
			addrs[i] = netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 0, 0, byte(i)}), 80)
		}
		policy := EjectionPolicy{Failures: 1 + rng.IntN(2), Backoff: time.Second, MaxBackoff: 4 * time.Second}
		got, want := NewPicker(clk, policy), NewPicker(clk, policy)
		for _, p := range []*Picker{got, want} {
			p.SetEndpoints(addrs)
			if round%2 == 1 {
				p.SetAffinity(Affinity{ClientIP: true, Timeout: 3 * time.Second})
			}
		}
		clients := []netip.Addr{cli1, cli2}
		for step := range 200 {
			client := clients[rng.IntN(2)]
			switch rng.IntN(5) {
			case 0:
				ep := addrs[rng.IntN(n)]
				got.Failed(client, ep)
				want.Failed(client, ep)
			case 1:
				ep := addrs[rng.IntN(n)]
				got.Connected(client, ep)
				want.Connected(client, ep)
			case 2:
				clk.Step(time.Duration(rng.IntN(1500)) * time.Millisecond)
			}
			max := rng.IntN(n + 2)
			prefix := []netip.AddrPort{netip.MustParseAddrPort("192.0.2.1:1")}
			g, gerr := got.AppendOrder(slices.Clone(prefix), client, max)
			w, werr := refOrder(want, client)
			w = append(prefix, w[:min(max, len(w))]...)
			if gerr != werr || !slices.Equal(g, w) {
				t.Fatalf("round %d step %d, max %d: %v (%v), want %v (%v)", round, step, max, g, gerr, w, werr)
			}
		}
	}
}

// A connection's ordering costs no allocation when the room is there.
func TestAppendOrderAllocatesNothingWithRoom(t *testing.T) {
	p := NewPicker(nil, DefaultEjectionPolicy())
	p.SetEndpoints(eps("10.0.0.1:80", "10.0.0.2:80", "10.0.0.3:80", "10.0.0.4:80", "10.0.0.5:80", "10.0.0.6:80"))
	room := make([]netip.AddrPort, 0, 4)
	if n := testing.AllocsPerRun(100, func() {
		if o, err := p.AppendOrder(room[:0], cli1, 4); err != nil || len(o) != 4 {
			t.Fatalf("%v %v", o, err)
		}
	}); n != 0 {
		t.Fatalf("%v allocations per ordering", n)
	}
}

// A picker before its first endpoints has none, answers every question as
// an empty one does, and is one allocation: no empty set of its own to
// be replaced at once (32 bytes of garbage a port among the sets kept).
func TestNewPickerHasNoEndpointsAndMakesNoSet(t *testing.T) {
	settings := &PickerSettings{Clock: affinity.SystemClock{}, Ejection: DefaultEjectionPolicy()}
	name := ServicePortName{Namespace: "ns", Name: "s", Port: "p", Protocol: TCP}
	var kept *Picker
	if n := testing.AllocsPerRun(100, func() { kept = NewPortPicker(settings, name) }); n != 1 || kept == nil {
		t.Errorf("NewPortPicker made %v allocations, want 1 (the picker)", n)
	}
	p := NewPortPicker(settings, name)
	client := netip.MustParseAddr("10.0.0.1")
	ep := netip.MustParseAddrPort("10.244.0.1:80")
	if _, err := p.Order(client); err != ErrNoEndpoints {
		t.Errorf("Order: %v, want ErrNoEndpoints", err)
	}
	if p.Len() != 0 || len(p.Endpoints()) != 0 || p.Has(ep) {
		t.Errorf("a new picker has endpoints: %d %v %v", p.Len(), p.Endpoints(), p.Has(ep))
	}
	p.Failed(client, ep)    // an endpoint it does not have: ignored
	p.Connected(client, ep) // likewise
	p.SetEndpoints([]netip.AddrPort{ep})
	if got, err := p.Order(client); err != nil || len(got) != 1 || got[0] != ep {
		t.Errorf("after SetEndpoints: %v, %v", got, err)
	}
}
