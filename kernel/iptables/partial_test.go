package iptables

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/lb"
)

func partialStates() []*lb.Snapshot {
	var states []*lb.Snapshot
	for i := 0; i < 8; i++ {
		var ports []*lb.ServicePort
		for j := 0; j < 5; j++ {
			if (i+j)%5 == 4 {
				continue // this service is absent in this state
			}
			var eps []lb.Endpoint
			for k := 0; k < (i*j+k)%4+(j%2); k++ {
				eps = append(eps, readyEP(netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 244, byte(j), byte(k + 1 + i%2)}), 8080).String(), k%2 == 0))
			}
			sp := svcPort("s"+string(rune('a'+j)), netip.AddrFrom4([4]byte{10, 96, 0, byte(j + 1)}).String(), eps...)
			sp.NodePort = uint16(30000 + j)
			sp.ExternalLocal = (i+j)%3 == 0
			sp.Affinity.ClientIP = (i+j)%2 == 0
			sp.Affinity.Timeout = time.Hour
			ports = append(ports, sp)
		}
		states = append(states, snap(ports...))
	}
	return states
}

// One long-lived Proxier syncs states in random order, mostly partially;
// after every sync the tables equal a fresh full sync of that state.
func TestPartialSyncsConverge(t *testing.T) {
	states := partialStates()
	rng := rand.New(rand.NewPCG(1, 2))
	partial := 0
	for round := 0; round < 10; round++ {
		f := NewFake()
		p := &Proxier{Runner: f, Options: opts()}
		for step := 0; step < 12; step++ {
			s := states[rng.IntN(len(states))]
			st, err := p.SyncStats(s)
			if err != nil {
				t.Fatal(err)
			}
			if !st.Full {
				partial++
			}
			fresh := NewFake()
			syncTo(t, fresh, opts(), s)
			if got, want := f.Dump(), fresh.Dump(); got != want {
				t.Fatalf("round %d step %d (full=%v): tables differ from a full sync:\n%s\nwant:\n%s", round, step, st.Full, got, want)
			}
		}
	}
	if partial == 0 {
		t.Fatal("no sync was partial")
	}
}

// A partial sync rewrites only the changed service's chains; an options
// change, Invalidate, a failure and the full-sync period make it full.
func TestPartialSyncRewritesOnlyWhatChanged(t *testing.T) {
	f := NewFake()
	now := time.Unix(1000, 0)
	p := &Proxier{Runner: f, Options: opts(), Now: func() time.Time { return now }}
	a := svcPort("a", "10.96.0.1", readyEP("10.244.0.1:8080", false))
	b := svcPort("b", "10.96.0.2", readyEP("10.244.0.2:8080", false))
	st, err := p.SyncStats(snap(a, b))
	if err != nil || !st.Full {
		t.Fatalf("first sync: %+v %v", st, err)
	}
	full := st.Bytes
	b2 := svcPort("b", "10.96.0.2", readyEP("10.244.0.2:8080", false), readyEP("10.244.0.3:8080", false))
	data, _, _ := RenderPartial(snap(a, b2), opts(), p.applied)
	if strings.Contains(string(data), ":"+ServiceChain(a.Name)) || !strings.Contains(string(data), ":"+ServiceChain(b2.Name)) {
		t.Fatalf("partial render should rewrite b's chains only:\n%s", data)
	}
	st, err = p.SyncStats(snap(a, b2))
	if err != nil || st.Full || st.Bytes >= full+200 {
		t.Fatalf("endpoint change: %+v %v (full sync was %d bytes)", st, err, full)
	}
	st, _ = p.SyncStats(snap(a, b2))
	if st.Full {
		t.Fatal("no-op sync was full")
	}
	o := opts()
	o.MasqueradeAll = true
	p.Options = o
	if st, _ = p.SyncStats(snap(a, b2)); !st.Full {
		t.Fatal("options change did not force a full sync")
	}
	p.Invalidate()
	if st, _ = p.SyncStats(snap(a, b2)); !st.Full {
		t.Fatal("Invalidate did not force a full sync")
	}
	now = now.Add(59 * time.Minute)
	if st, _ = p.SyncStats(snap(a)); st.Full {
		t.Fatal("full sync before the period")
	}
	now = now.Add(2 * time.Minute)
	if st, _ = p.SyncStats(snap(a)); !st.Full {
		t.Fatal("no full sync after the period")
	}
	// A failed restore makes the next sync full.
	f.Flush("nat")
	if _, err := p.SyncStats(snap(a, b)); err == nil {
		t.Fatal("partial sync onto flushed tables succeeded; the fake should refuse the jump to a missing chain")
	}
	if st, err = p.SyncStats(snap(a, b)); err != nil || !st.Full {
		t.Fatalf("after a failure: %+v %v", st, err)
	}
}

// countingRunner counts the commands a sync runs.
type countingRunner struct {
	Runner
	ran []string
}

func (c *countingRunner) Restore(d []byte) error {
	c.ran = append(c.ran, "restore")
	return c.Runner.Restore(d)
}
func (c *countingRunner) Chains(t string) ([]string, error) {
	c.ran = append(c.ran, "chains "+t)
	return c.Runner.Chains(t)
}
func (c *countingRunner) Save(t string) ([]byte, error) {
	c.ran = append(c.ran, "save "+t)
	return c.Runner.Save(t)
}
func (c *countingRunner) EnsureChain(t, ch string) error {
	c.ran = append(c.ran, "-N "+ch)
	return c.Runner.EnsureChain(t, ch)
}
func (c *countingRunner) EnsureRule(t, ch string, a ...string) error {
	c.ran = append(c.ran, "-C "+ch)
	return c.Runner.EnsureRule(t, ch, a...)
}

// A partial sync is one iptables-restore and nothing else, as kube-proxy's
// (issue 18: it ran 17 -C/-N besides, each reading the whole nat table on
// the legacy backend); the full sync reads the tables and writes the
// missing jumps and canaries in its restore.
func TestAPartialSyncIsOneRestore(t *testing.T) {
	states := partialStates()
	r := &countingRunner{Runner: NewFake()}
	p := &Proxier{Runner: r, Options: opts()}
	if st, err := p.SyncStats(states[0]); err != nil || !st.Full {
		t.Fatalf("first sync: full=%v %v", st.Full, err)
	}
	if got := strings.Join(r.ran, ","); got != "save nat,save filter,save mangle,restore" {
		t.Fatalf("the full sync ran %v; want the three tables read, then one restore", r.ran)
	}
	r.ran = nil
	if st, err := p.SyncStats(states[1]); err != nil || st.Full {
		t.Fatalf("second sync: full=%v %v", st.Full, err)
	}
	if strings.Join(r.ran, ",") != "restore" {
		t.Fatalf("the partial sync ran %v; want one restore", r.ran)
	}
}

// Above 1,000 endpoints the per-endpoint rules lose their comments, as
// kube-proxy's large-cluster mode drops them (issue 18: a dump 28 %
// larger than kube-proxy's at 1k services); the other rules keep theirs.
func TestLargeClusterModeDropsEndpointComments(t *testing.T) {
	build := func(total int) string {
		var ports []*lb.ServicePort
		for j := 0; j*100 < total; j++ {
			var eps []lb.Endpoint
			for k := 0; k < min(100, total-j*100); k++ {
				eps = append(eps, readyEP(netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 244, byte(j), byte(k + 1)}), 8080).String(), true))
			}
			ports = append(ports, svcPort(fmt.Sprintf("s%02d", j), netip.AddrFrom4([4]byte{10, 96, 0, byte(j + 1)}).String(), eps...))
		}
		return string(Render(snap(ports...), opts()))
	}
	sepDNAT := regexp.MustCompile(`(?m)^-A KUBE-SEP-\S+ (.*)-j DNAT`)
	small, large := build(LargeClusterEndpoints), build(LargeClusterEndpoints+1)
	for _, m := range sepDNAT.FindAllStringSubmatch(small, -1) {
		if !strings.Contains(m[1], "-m comment") {
			t.Fatalf("at %d endpoints a DNAT rule without its comment: %s", LargeClusterEndpoints, m[0])
		}
	}
	if n := len(sepDNAT.FindAllStringSubmatch(large, -1)); n != LargeClusterEndpoints+1 {
		t.Fatalf("%d DNAT rules, want %d", n, LargeClusterEndpoints+1)
	}
	for _, l := range strings.Split(large, "\n") {
		if (strings.HasPrefix(l, "-A KUBE-SEP-") || strings.HasPrefix(l, "-A KUBE-SVC-") && strings.Contains(l, "KUBE-SEP-")) && strings.Contains(l, "-m comment") {
			t.Fatalf("past %d endpoints a per-endpoint rule kept its comment: %s", LargeClusterEndpoints, l)
		}
	}
	if !strings.Contains(large, `--comment "ns/s00:p cluster IP"`) {
		t.Fatal("the service rules lost their comments too")
	}
	if len(large) >= len(small) {
		t.Fatalf("large-cluster ruleset %d bytes, not smaller than %d", len(large), len(small))
	}
}

// With nf_conntrack_tcp_be_liberal set, the ctstate INVALID drop is left
// out, as kube-proxy leaves it out.
func TestInvalidDropOmittedWhenConntrackIsLiberal(t *testing.T) {
	rule := "-A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP\n"
	o := opts()
	if !strings.Contains(string(Render(snap(), o)), rule) {
		t.Fatal("no INVALID drop by default")
	}
	o.TCPBeLiberal = true
	if strings.Contains(string(Render(snap(), o)), rule) {
		t.Fatal("INVALID drop with nf_conntrack_tcp_be_liberal set")
	}
}

// With an nfacct counter the INVALID drop counts into it, as kube-proxy's
// (-m nfacct --nfacct-name ct_state_invalid_dropped_pkts); and KUBE-FIREWALL
// is there in both families, its localnet drop only in IPv4 with localhost
// NodePorts (both seen beside kube-proxy v1.34.2).
func TestInvalidDropCountsAndKubeFirewallAsKubeProxy(t *testing.T) {
	o := opts()
	o.InvalidDropCounter = "ct_state_invalid_dropped_pkts"
	if r := string(Render(snap(), o)); !strings.Contains(r, "-A KUBE-FORWARD -m conntrack --ctstate INVALID -m nfacct --nfacct-name ct_state_invalid_dropped_pkts -j DROP\n") {
		t.Fatalf("no counted INVALID drop:\n%s", r)
	}
	for _, v6 := range []bool{false, true} {
		o := opts()
		o.IPv6, o.LocalhostNodePorts = v6, false
		r := string(Render(snap(), o))
		if !strings.Contains(r, ":KUBE-FIREWALL - [0:0]\n") || strings.Contains(r, "-A KUBE-FIREWALL") {
			t.Errorf("v6=%v without localhost NodePorts: want an empty KUBE-FIREWALL\n%s", v6, r)
		}
		var jumps []string
		for _, j := range Jumps(o) {
			if target(j.Args) == ChainFirewall {
				jumps = append(jumps, j.Chain)
			}
		}
		if !slices.Equal(jumps, []string{"INPUT", "OUTPUT"}) {
			t.Errorf("v6=%v: jumps to KUBE-FIREWALL from %v", v6, jumps)
		}
	}
}

// As TestPartialSyncsConverge, with snapshots that share the ports that did
// not change (as the sources publish them: a ServicePort is immutable and
// kept while its Service is): each step picks one of three versions of
// each service, so most ports come from the render cache; the tables still
// equal a fresh full sync after every step.
func TestPartialSyncsConvergeWithSharedPorts(t *testing.T) {
	var pool [6][3]*lb.ServicePort
	for j := range pool {
		for v := range pool[j] {
			var eps []lb.Endpoint
			for k := 0; k < v+j%2; k++ {
				eps = append(eps, readyEP(netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 244, byte(j), byte(k + 1 + v)}), 8080).String(), k%2 == 0))
			}
			sp := svcPort("s"+string(rune('a'+j)), netip.AddrFrom4([4]byte{10, 96, 0, byte(j + 1)}).String(), eps...)
			sp.NodePort = uint16(30000 + j)
			sp.ExternalLocal = (v+j)%3 == 0
			sp.Affinity.ClientIP, sp.Affinity.Timeout = v == 2, time.Hour
			pool[j][v] = sp
		}
	}
	rng := rand.New(rand.NewPCG(3, 4))
	f := NewFake()
	p := &Proxier{Runner: f, Options: opts()}
	for step := 0; step < 60; step++ {
		var ports []*lb.ServicePort
		for j := range pool {
			if r := rng.IntN(8); r < 3 {
				ports = append(ports, pool[j][r])
			} else if r < 7 && step > 0 {
				ports = append(ports, pool[j][0])
			}
		}
		s := snap(ports...)
		if _, err := p.SyncStats(s); err != nil {
			t.Fatal(err)
		}
		fresh := NewFake()
		syncTo(t, fresh, opts(), s)
		if got, want := f.Dump(), fresh.Dump(); got != want {
			t.Fatalf("step %d: tables differ from a full sync:\n%s\nwant:\n%s", step, got, want)
		}
	}
	if p.cache.hits == 0 {
		t.Fatal("no port came from the render cache")
	}
}

// The rule counts behind kube-proxy's sync_proxy_rules_iptables_total and
// _last: a partial sync writes fewer nat rules than the kernel then holds,
// and what it holds is what a full sync of the same state writes.
func TestRuleCountsOfFullAndPartialSyncs(t *testing.T) {
	p := &Proxier{Runner: NewFake(), Options: opts()}
	a := svcPort("a", "10.96.0.1", readyEP("10.244.0.1:8080", false), readyEP("10.244.0.4:8080", false))
	b := svcPort("b", "10.96.0.2", readyEP("10.244.0.2:8080", false))
	st, err := p.SyncStats(snap(a, b))
	if err != nil || !st.Full || st.NATRules == 0 || st.FilterRules == 0 || st.NATRulesTotal != st.NATRules {
		t.Fatalf("full sync: %+v %v", st, err)
	}
	b2 := svcPort("b", "10.96.0.2", readyEP("10.244.0.2:8080", false), readyEP("10.244.0.3:8080", false))
	// The second from the render cache; the third with a port equal to a
	// but new (rendered again, found unchanged).
	a2 := svcPort("a", "10.96.0.1", readyEP("10.244.0.1:8080", false), readyEP("10.244.0.4:8080", false))
	for i, s := range []*lb.Snapshot{snap(a, b2), snap(a, b2), snap(a2, b2)} {
		st, err = p.SyncStats(s)
		wantFilter, wantNAT := RuleCounts(Render(s, opts()))
		if err != nil || st.Full || st.NATRulesTotal != wantNAT || st.FilterRules != wantFilter || st.NATRules >= st.NATRulesTotal {
			t.Fatalf("partial sync %d: %+v %v; a full sync writes %d filter and %d nat rules", i, st, err, wantFilter, wantNAT)
		}
	}
}

// kube-proxy counts packets to a NodePort on 127.0.0.0/8 with an nfacct
// rule before the NodePort's own (IPv4, localhost NodePorts on).
func TestLocalhostNodePortsCounted(t *testing.T) {
	sp := svcPort("a", "10.96.0.1", readyEP("10.244.0.1:8080", false))
	sp.NodePort = 30080
	o := opts()
	o.LocalhostNodePorts, o.LocalhostNodePortCounter = true, "localhost_nps_accepted_pkts"
	r := string(Render(snap(sp), o))
	ext := ExternalChain(sp.Name)
	want := `-A KUBE-NODEPORTS -m comment --comment ns/a:p -m tcp -p tcp -d 127.0.0.0/8 --dport 30080 -m nfacct --nfacct-name localhost_nps_accepted_pkts -j ` + ext + "\n" +
		`-A KUBE-NODEPORTS -m comment --comment ns/a:p -m tcp -p tcp --dport 30080 -j ` + ext + "\n"
	if !strings.Contains(r, want) {
		t.Fatalf("want\n%s\nin\n%s", want, r)
	}
	for _, o := range []Options{func() Options { o := o; o.LocalhostNodePorts = false; return o }(), func() Options { o := o; o.IPv6 = true; return o }()} {
		if r := string(Render(snap(sp), o)); strings.Contains(r, "nfacct") {
			t.Fatalf("localhost NodePorts %v, IPv6 %v: an nfacct rule\n%s", o.LocalhostNodePorts, o.IPv6, r)
		}
	}
}
