//go:build linux && vmguest

package guest

import (
	"fmt"
	"net/netip"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/kernel/iptables"
	"github.com/sluice-proxy/sluice/kernel/ipvs"
	"github.com/sluice-proxy/sluice/lb"
)

// ipsetMembers lists a set's entries as the kernel has them.
func ipsetMembers(t *testing.T, name string) []string {
	out, err := exec.Command("ipset", "list", name).CombinedOutput()
	if err != nil {
		t.Fatalf("ipset list %s: %v: %s", name, err, out)
	}
	_, members, _ := strings.Cut(string(out), "Members:\n")
	es := strings.Fields(members)
	slices.Sort(es)
	return es
}

// IPVS mode's updates told what changed (issue 16) leave the real
// kernel's virtual servers and ipsets as a full sync of the same state
// would write them, through endpoint changes and Services added and
// removed at 1,000 Services; the log has what a full sync and an update
// took here.
func TestIPVSUpdatesTouchOnlyWhatChangedInVM(t *testing.T) {
	const n = 1000
	k, err := ipvs.NewNetlink()
	must(t, err)
	defer k.Close()
	sets := &ipvs.IPSetExec{}
	t.Cleanup(func() {
		ipvs.Cleanup(k, nil)
		ipvs.CleanupNetfilter(iptables.NewFake(), sets, false)
	})
	svc := func(j, eps int) *lb.ServicePort {
		sp := &lb.ServicePort{Name: lb.ServicePortName{Namespace: "ns", Name: fmt.Sprintf("s%d", j), Port: "p", Protocol: lb.TCP},
			ClusterIPs: []netip.Addr{netip.AddrFrom4([4]byte{10, 97, byte(j >> 8), byte(j)})}, Port: 80, NodePort: uint16(30000 + j)}
		for e := range eps {
			sp.Endpoints = append(sp.Endpoints, lb.Endpoint{Addr: lb.EndpointAddrFrom(netip.AddrFrom4([4]byte{10, 245, byte(j >> 8), byte(j)}), uint16(8000+e)),
				Ready: true, Serving: true, Local: e == 0})
		}
		return sp
	}
	ports := map[lb.ServicePortName]*lb.ServicePort{}
	for j := range n {
		sp := svc(j, 10)
		ports[sp.Name] = sp
	}
	o := ipvs.Options{NodeIPs: []netip.Addr{netip.MustParseAddr("192.168.10.1")}}
	p := &ipvs.Proxier{Kernel: k, Options: o}
	nf := &ipvs.Netfilter{Sets: sets, IPTables: iptables.NewFake(), MasqueradeBit: 14}
	cur := lb.NewSnapshot(ports)
	cur.ID = 1
	start := time.Now()
	bind, err := p.Sync(cur)
	must(t, err)
	must(t, nf.Sync(cur, o, bind))
	fullTook := time.Since(start)
	bound := map[netip.Addr]bool{}
	for _, a := range bind {
		bound[a] = true
	}
	var took []time.Duration
	for i := range 20 {
		set := map[lb.ServicePortName]*lb.ServicePort{}
		var del []lb.ServicePortName
		changed := svc(i*37%n, 9+i%3) // endpoints go and come
		set[changed.Name] = changed
		if i%5 == 4 { // a Service comes, another goes
			added := svc(n+i, 3)
			set[added.Name] = added
			del = append(del, svc(i, 0).Name)
		}
		next := cur.With(set, del)
		next.ID = cur.ID + 1
		cur = next
		start := time.Now()
		bc, err := p.SyncChanged(cur)
		must(t, err)
		full, err := nf.SyncChanged(cur, p.Options, bc, func() []netip.Addr { return nil })
		must(t, err)
		took = append(took, time.Since(start))
		if bc.Full || full {
			t.Fatalf("update %d compared everything (proxier %v, sets %v)", i, bc.Full, full)
		}
		for _, a := range bc.Del {
			delete(bound, a)
		}
		for _, a := range bc.Add {
			bound[a] = true
		}
	}
	// What a full sync of the final state writes, on fakes.
	fk, fsets := ipvs.NewFake(), ipvs.NewFakeIPSet()
	wantBind, err := (&ipvs.Proxier{Kernel: fk, Options: o}).Sync(cur)
	must(t, err)
	must(t, (&ipvs.Netfilter{Sets: fsets, IPTables: iptables.NewFake(), MasqueradeBit: 14}).Sync(cur, o, wantBind))
	if got, want := ipvs.Dump(k), fk.Dump(); got != want {
		t.Fatalf("the kernel's table after the updates differs from a full sync's (%d against %d bytes)", len(got), len(want))
	}
	var gotBind []netip.Addr
	for a := range bound {
		gotBind = append(gotBind, a)
	}
	slices.SortFunc(gotBind, netip.Addr.Compare)
	if !slices.Equal(gotBind, wantBind) {
		t.Fatalf("bound %d addresses, a full sync %d", len(gotBind), len(wantBind))
	}
	for _, s := range []string{ipvs.SetClusterIP, ipvs.SetNodePortTCP, ipvs.SetLoopBack, ipvs.SetIPVSIPs} {
		if got, want := ipsetMembers(t, s), fsets.Entries(s); !slices.Equal(got, want) {
			t.Fatalf("set %s: %d entries, a full sync %d", s, len(got), len(want))
		}
	}
	// What each update cost before: a sync comparing everything, here
	// with nothing left to change.
	start = time.Now()
	bind, err = p.Sync(cur)
	must(t, err)
	must(t, nf.Sync(cur, o, bind))
	compareTook := time.Since(start)
	slices.Sort(took)
	t.Logf("IPVS at %d Services x 10 endpoints: first full sync %s; a full comparison with nothing to change %s; an update told what changed: median %s, max %s (20 updates)",
		n, fullTook.Round(time.Millisecond), compareTook.Round(time.Millisecond), took[len(took)/2].Round(time.Microsecond), took[len(took)-1].Round(time.Microsecond))
}
