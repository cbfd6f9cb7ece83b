package ipvs

import (
	"errors"
	"math/rand/v2"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/lb"
)

var node = netip.MustParseAddr("192.168.0.2")

func port(name, cip string, proto lb.Protocol, eps ...string) *lb.ServicePort {
	sp := &lb.ServicePort{Name: lb.ServicePortName{Namespace: "ns", Name: name, Port: "p", Protocol: proto},
		ClusterIPs: []netip.Addr{netip.MustParseAddr(cip)}, Port: 80}
	for _, e := range eps {
		sp.Endpoints = append(sp.Endpoints, lb.Endpoint{Addr: lb.EndpointAddrOf(netip.MustParseAddrPort(e)), Ready: true, Serving: true})
	}
	return sp
}

func snap(ports ...*lb.ServicePort) *lb.Snapshot {
	sPorts := map[lb.ServicePortName]*lb.ServicePort{}
	for _, p := range ports {
		sPorts[p.Name] = p
	}
	return lb.NewSnapshot(sPorts)
}

func opts() Options { return Options{NodeIPs: []netip.Addr{node, netip.MustParseAddr("fd00::2")}} }

func TestRender(t *testing.T) {
	web := port("web", "10.96.0.10", lb.TCP, "10.244.0.5:8080", "10.244.0.6:8080")
	web.NodePort = 30080
	web.SetExternalIPs([]netip.Addr{netip.MustParseAddr("203.0.113.10"), node})
	web.Affinity = lb.Affinity{ClientIP: true, Timeout: 3 * time.Hour}
	local := port("local", "10.96.0.11", lb.UDP, "10.244.0.5:53")
	local.ExternalLocal, local.NodePort = true, 30053 // no local endpoint: falls back to all
	d := Render(snap(web, local), Options{NodeIPs: opts().NodeIPs, IsLocal: func(a netip.Addr) bool { return a == node }})
	vs := d.Servers[Key{netip.MustParseAddr("10.96.0.10"), 80, lb.TCP}]
	if vs == nil || vs.Scheduler != "rr" || vs.Flags != FlagPersistent || vs.Timeout != 10800 || len(vs.Reals) != 2 {
		t.Fatalf("ClusterIP VS: %+v", vs)
	}
	for _, k := range []Key{{node, 30080, lb.TCP}, {netip.MustParseAddr("203.0.113.10"), 80, lb.TCP}, {node, 80, lb.TCP}, {node, 30053, lb.UDP}} {
		if d.Servers[k] == nil {
			t.Errorf("no virtual server %s", k)
		}
	}
	if vs := d.Servers[Key{node, 30053, lb.UDP}]; vs == nil || len(vs.Reals) != 1 {
		t.Fatalf("Local policy without local endpoints should fall back: %+v", vs)
	}
	if len(d.Servers) != 6 {
		t.Fatalf("%d virtual servers, want 6 (IPv6 node IP skipped)", len(d.Servers))
	}
	// The ClusterIPs and the non-local external IP are bound; the node's own address is not.
	if got := strings.Join(addrStrings(d.Bind), ","); got != "10.96.0.10,10.96.0.11,203.0.113.10" {
		t.Fatalf("bind %s", got)
	}
	if d := Render(snap(web), Options{Scheduler: "mh"}); d.Servers[Key{netip.MustParseAddr("10.96.0.10"), 80, lb.TCP}].Flags != FlagPersistent|FlagSourceHash {
		t.Fatal("mh without the source-hash flag")
	}
}

func addrStrings(as []netip.Addr) []string {
	var out []string
	for _, a := range as {
		out = append(out, a.String())
	}
	return out
}

func states() []*lb.Snapshot {
	var out []*lb.Snapshot
	for i := 0; i < 6; i++ {
		var ports []*lb.ServicePort
		for j := 0; j < 4; j++ {
			if (i+j)%4 == 3 {
				continue
			}
			var eps []string
			for k := 0; k < (i+j)%3+1; k++ {
				eps = append(eps, netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 244, byte(j), byte(k + 1 + i%2)}), 8080).String())
			}
			sp := port("s"+string(rune('a'+j)), netip.AddrFrom4([4]byte{10, 96, 0, byte(j + 1)}).String(), []lb.Protocol{lb.TCP, lb.UDP, lb.SCTP}[j%3], eps...)
			sp.NodePort = uint16(30000 + j)
			sp.Affinity = lb.Affinity{ClientIP: i%2 == 0, Timeout: time.Minute}
			ports = append(ports, sp)
		}
		out = append(out, snap(ports...))
	}
	return out
}

// States synced in random order leave the table a fresh sync would make,
// and an excluded virtual server of someone else's stays.
func TestSyncConverges(t *testing.T) {
	ss := states()
	rng := rand.New(rand.NewPCG(3, 4))
	foreign := Service{Key: Key{netip.MustParseAddr("172.30.0.1"), 443, lb.TCP}, Scheduler: "wrr"}
	for round := 0; round < 10; round++ {
		f := NewFake()
		f.AddService(foreign)
		p := &Proxier{Kernel: f, Options: opts(), ExcludeCIDRs: []netip.Prefix{netip.MustParsePrefix("172.30.0.0/16")}}
		var last *lb.Snapshot
		for i := 0; i < 8; i++ {
			last = ss[rng.IntN(len(ss))]
			if _, err := p.Sync(last); err != nil {
				t.Fatal(err)
			}
		}
		fresh := NewFake()
		fresh.AddService(foreign)
		if _, err := (&Proxier{Kernel: fresh, Options: opts(), ExcludeCIDRs: p.ExcludeCIDRs}).Sync(last); err != nil {
			t.Fatal(err)
		}
		if f.Dump() != fresh.Dump() {
			t.Fatalf("round %d:\n%s\nwant\n%s", round, f.Dump(), fresh.Dump())
		}
		if !strings.Contains(f.Dump(), "172.30.0.1:443/TCP wrr") {
			t.Fatal("excluded virtual server deleted")
		}
	}
}

// A removed TCP real server with connections is quiesced (weight 0) and
// deleted once they end; one that comes back is restored to weight 1; UDP
// ones go at once.
func TestGracefulTermination(t *testing.T) {
	f := NewFake()
	p := &Proxier{Kernel: f, Options: opts()}
	tcp := port("web", "10.96.0.10", lb.TCP, "10.244.0.5:8080", "10.244.0.6:8080")
	udp := port("dns", "10.96.0.11", lb.UDP, "10.244.0.5:53", "10.244.0.6:53")
	if _, err := p.Sync(snap(tcp, udp)); err != nil {
		t.Fatal(err)
	}
	k := Key{netip.MustParseAddr("10.96.0.10"), 80, lb.TCP}
	ku := Key{netip.MustParseAddr("10.96.0.11"), 80, lb.UDP}
	gone := netip.MustParseAddrPort("10.244.0.6:8080")
	f.SetConns(k, gone, 1, 0)
	f.SetConns(ku, netip.MustParseAddrPort("10.244.0.6:53"), 1, 0)
	tcp2 := port("web", "10.96.0.10", lb.TCP, "10.244.0.5:8080")
	udp2 := port("dns", "10.96.0.11", lb.UDP, "10.244.0.5:53")
	if _, err := p.Sync(snap(tcp2, udp2)); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(f.Dump(), "-> 10.244.0.6:8080 weight 0") || strings.Contains(f.Dump(), "10.244.0.6:53") {
		t.Fatalf("after removal:\n%s", f.Dump())
	}
	if n, _ := p.Drain(); n != 0 {
		t.Fatal("drained a real server with a connection")
	}
	// It comes back while draining: weight 1 again, no longer queued.
	if _, err := p.Sync(snap(tcp, udp2)); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(f.Dump(), "-> 10.244.0.6:8080 weight 1") || len(p.Draining()) != 0 {
		t.Fatalf("restored:\n%s %v", f.Dump(), p.Draining())
	}
	// Removed again; the connection ends; Drain deletes it.
	p.Sync(snap(tcp2, udp2))
	f.SetConns(k, gone, 0, 0)
	if n, err := p.Drain(); n != 1 || err != nil || strings.Contains(f.Dump(), "10.244.0.6:8080") {
		t.Fatalf("drain: %d %v\n%s", n, err, f.Dump())
	}
}

func TestDetect(t *testing.T) {
	f := NewFake()
	if err := Detect(f, "sh"); err != nil {
		t.Fatal(err)
	}
	if svcs, _ := f.Services(); len(svcs) != 0 {
		t.Fatalf("probe left behind: %v", svcs)
	}
	if err := Detect(Unavailable{}, "rr"); !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), "not listed") {
		t.Fatalf("IPVS missing: %v", err)
	}
	if err := Detect(f, "fastest"); !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), `"fastest"`) {
		t.Fatalf("bad scheduler: %v", err)
	}
}

func TestFakeRefuses(t *testing.T) {
	f := NewFake()
	k := Key{netip.MustParseAddr("10.96.0.1"), 80, lb.TCP}
	if err := f.AddReal(k, Real{Addr: netip.MustParseAddrPort("10.0.0.1:80"), Weight: 1}); err == nil {
		t.Fatal("real server of a missing virtual server")
	}
	f.AddService(Service{Key: k, Scheduler: "rr"})
	if err := f.AddService(Service{Key: k, Scheduler: "rr"}); err == nil {
		t.Fatal("duplicate virtual server")
	}
	if err := f.UpdateService(Service{Key: k, Scheduler: "nope"}); err == nil {
		t.Fatal("unknown scheduler")
	}
	if err := f.DeleteReal(k, netip.MustParseAddrPort("10.0.0.1:80")); err == nil {
		t.Fatal("deleted a missing real server")
	}
}

func TestCleanupKeepsExcluded(t *testing.T) {
	f := NewFake()
	keep := Key{netip.MustParseAddr("172.30.0.1"), 443, lb.TCP}
	f.AddService(Service{Key: keep, Scheduler: "rr"})
	f.AddService(Service{Key: Key{netip.MustParseAddr("10.96.0.1"), 80, lb.TCP}, Scheduler: "rr"})
	if err := Cleanup(f, []netip.Prefix{netip.MustParsePrefix("172.30.0.0/16")}); err != nil {
		t.Fatal(err)
	}
	if svcs, _ := f.Services(); len(svcs) != 1 || svcs[0].Key != keep {
		t.Fatalf("after cleanup: %+v", svcs)
	}
}
