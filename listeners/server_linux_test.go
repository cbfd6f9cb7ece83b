//go:build linux

package listeners

import (
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/lb"
)

func freePort(t *testing.T) uint16 {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).AddrPort().Port()
}

func snapshotOf(ports ...*lb.ServicePort) *lb.Snapshot {
	sPorts := map[lb.ServicePortName]*lb.ServicePort{}
	for _, p := range ports {
		sPorts[p.Name] = p
	}
	return lb.NewSnapshot(sPorts)
}

func webPort(nodePort uint16, eps ...netip.AddrPort) *lb.ServicePort {
	sp := &lb.ServicePort{
		Name:       lb.ServicePortName{Namespace: "demo", Name: "web", Port: "http", Protocol: lb.TCP},
		ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.10")},
		Port:       80,
		NodePort:   nodePort,
	}
	for _, ep := range eps {
		sp.Endpoints = append(sp.Endpoints, lb.Endpoint{Addr: lb.EndpointAddrOf(ep), Ready: true, Serving: true})
	}
	return sp
}

func dialName(t *testing.T, addr netip.AddrPort) (string, error) {
	c, err := net.DialTimeout("tcp", addr.String(), 5*time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	b, err := io.ReadAll(c)
	return string(b), err
}

func TestServerAppliesUpdatesWithoutDroppingConnections(t *testing.T) {
	forEachEngine(t, func(t *testing.T, e Engine) {
		srv := &Server{Engine: e, BindAddress: netip.MustParseAddr("127.0.0.1"), Retry: lb.DefaultRetryPolicy(), Ejection: lb.DefaultEjectionPolicy(), UDPTimeout: time.Second}
		defer srv.Close()
		echo := serveTCP(t, echoHandler)
		nameB := serveTCP(t, nameHandler("b"))
		np := freePort(t)
		if err := srv.Apply(snapshotOf(webPort(np, echo))); err != nil {
			t.Fatal(err)
		}
		fes := srv.Frontends()
		if len(fes) != 2 || fes[0].Role != RoleNodePort && fes[1].Role != RoleNodePort {
			t.Fatalf("frontends %+v, want a nodePort and a proxyPort", fes)
		}
		nodeAddr := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), np)
		long, err := net.DialTCP("tcp", nil, net.TCPAddrFromAddrPort(nodeAddr))
		if err != nil {
			t.Fatal(err)
		}
		defer long.Close()
		long.SetDeadline(time.Now().Add(20 * time.Second))
		echoOnce(t, long, []byte("one"))

		// Endpoints change: same listeners, new connections go to the new endpoint.
		if err := srv.Apply(snapshotOf(webPort(np, nameB))); err != nil {
			t.Fatal(err)
		}
		if after := srv.Frontends(); after[0] != fes[0] || after[1] != fes[1] {
			t.Fatalf("an endpoint change reopened listeners: %v -> %v", fes, after)
		}
		if got, err := dialName(t, nodeAddr); err != nil || got != "b" {
			t.Fatalf("after endpoint change got %q, %v", got, err)
		}
		echoOnce(t, long, []byte("two"))

		// NodePort change: the old port closes, the new one serves.
		np2 := freePort(t)
		if err := srv.Apply(snapshotOf(webPort(np2, nameB))); err != nil {
			t.Fatal(err)
		}
		if _, err := dialName(t, nodeAddr); err == nil {
			t.Fatal("old nodePort still accepts")
		}
		if got, err := dialName(t, netip.AddrPortFrom(nodeAddr.Addr(), np2)); err != nil || got != "b" {
			t.Fatalf("new nodePort: %q, %v", got, err)
		}
		echoOnce(t, long, []byte("three"))

		// Service removed: nothing listens, the established connection lives on.
		if err := srv.Apply(snapshotOf()); err != nil {
			t.Fatal(err)
		}
		if len(srv.Frontends()) != 0 {
			t.Fatalf("frontends left: %v", srv.Frontends())
		}
		if _, err := dialName(t, netip.AddrPortFrom(nodeAddr.Addr(), np2)); err == nil {
			t.Fatal("removed service still accepts")
		}
		echoOnce(t, long, []byte("four"))
	})
}

func TestServerReportsListenConflictsAndKeepsTheRest(t *testing.T) {
	forEachEngine(t, func(t *testing.T, e Engine) {
		busy, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer busy.Close()
		bp := busy.Addr().(*net.TCPAddr).AddrPort().Port()
		srv := &Server{Engine: e, BindAddress: netip.MustParseAddr("127.0.0.1"), Retry: lb.DefaultRetryPolicy()}
		defer srv.Close()
		other := webPort(freePort(t), serveTCP(t, nameHandler("ok")))
		other.Name.Name = "other"
		err = srv.Apply(snapshotOf(webPort(bp, serveTCP(t, echoHandler)), other))
		if err == nil {
			t.Fatal("a nodePort already in use was not reported")
		}
		if want := "demo/web:http"; !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), busy.Addr().String()) {
			t.Fatalf("error %q does not name the service and address", err)
		}
		if got, err := dialName(t, netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), other.NodePort)); err != nil || got != "ok" {
			t.Fatalf("the other service is not served: %q %v", got, err)
		}
	})
}

func TestServerNodePortAddresses(t *testing.T) {
	forEachEngine(t, func(t *testing.T, e Engine) {
		addrs := []netip.Addr{netip.MustParseAddr("127.0.0.2"), netip.MustParseAddr("127.0.0.3")}
		srv := &Server{Engine: e, BindAddress: netip.MustParseAddr("127.0.0.1"), Retry: lb.DefaultRetryPolicy(),
			NodePortAddrs: func() []netip.Addr { return addrs }}
		defer srv.Close()
		np := freePort(t)
		if err := srv.Apply(snapshotOf(webPort(np, serveTCP(t, nameHandler("ok"))))); err != nil {
			t.Fatal(err)
		}
		for _, a := range addrs {
			if got, err := dialName(t, netip.AddrPortFrom(a, np)); err != nil || got != "ok" {
				t.Fatalf("nodePort on %s: %q %v", a, got, err)
			}
		}
		if _, err := dialName(t, netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), np)); err == nil {
			t.Fatal("nodePort listens outside --nodeport-addresses")
		}
		// The address set changes: NodePort listeners follow on the next apply.
		addrs = addrs[:1]
		if err := srv.Apply(snapshotOf(webPort(np, serveTCP(t, nameHandler("ok"))))); err != nil {
			t.Fatal(err)
		}
		if _, err := dialName(t, netip.AddrPortFrom(netip.MustParseAddr("127.0.0.3"), np)); err == nil {
			t.Fatal("nodePort still on an address no longer selected")
		}
	})
}

func TestServerListensOnLocalExternalAndLoadBalancerIPs(t *testing.T) {
	forEachEngine(t, func(t *testing.T, e Engine) {
		local := map[netip.Addr]bool{netip.MustParseAddr("127.0.0.5"): true, netip.MustParseAddr("127.0.0.6"): true}
		srv := &Server{Engine: e, BindAddress: netip.MustParseAddr("127.0.0.1"), Retry: lb.DefaultRetryPolicy(),
			IsLocal: func(a netip.Addr) bool { return local[a] }}
		defer srv.Close()
		sp := webPort(0, serveTCP(t, nameHandler("ext")))
		sp.Port = freePort(t)
		sp.SetExternalIPs([]netip.Addr{netip.MustParseAddr("127.0.0.5"), netip.MustParseAddr("203.0.113.9")}) // the second is not local
		sp.SetLoadBalancerIPs([]netip.Addr{netip.MustParseAddr("127.0.0.6")})
		if err := srv.Apply(snapshotOf(sp)); err != nil {
			t.Fatal(err)
		}
		roles := map[Role]int{}
		for _, fe := range srv.Frontends() {
			roles[fe.Role]++
		}
		if roles[RoleExternalIP] != 1 || roles[RoleLoadBalancer] != 1 || roles[RoleProxyPort] != 1 || roles[RoleNodePort] != 0 {
			t.Fatalf("frontends %v", srv.Frontends())
		}
		// Each listed with its address and, for the proxy port, the VIP it
		// serves (the listed record keeps one IP of the two).
		for _, fe := range srv.Frontends() {
			want := Frontend{Service: sp.Name, Role: fe.Role}
			switch fe.Role {
			case RoleExternalIP:
				want.Addr = netip.AddrPortFrom(netip.MustParseAddr("127.0.0.5"), sp.Port)
			case RoleLoadBalancer:
				want.Addr = netip.AddrPortFrom(netip.MustParseAddr("127.0.0.6"), sp.Port)
			case RoleProxyPort:
				want.Addr = netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), fe.Addr.Port())
				want.VIP = sp.ClusterIPs[0]
			}
			if fe != want || fe.Addr.Port() == 0 {
				t.Errorf("frontend %+v, want %+v", fe, want)
			}
		}
		for _, ip := range []string{"127.0.0.5", "127.0.0.6"} {
			if got, err := dialName(t, netip.AddrPortFrom(netip.MustParseAddr(ip), sp.Port)); err != nil || got != "ext" {
				t.Fatalf("%s:%d: %q %v", ip, sp.Port, got, err)
			}
		}
	})
}

// An SCTP port is skipped with one warning, not one per update.
func TestServerWarnsOnceForSCTP(t *testing.T) {
	var logs strings.Builder
	srv := &Server{Engine: NewGoroutine(Options{}), Retry: lb.DefaultRetryPolicy(), Log: slog.New(slog.NewTextHandler(&logs, nil))}
	defer srv.Close()
	sp := webPort(0, netip.MustParseAddrPort("127.0.0.1:9"))
	sp.Name.Protocol = lb.SCTP
	for i := 0; i < 3; i++ {
		if err := srv.Apply(snapshotOf(sp)); err != nil {
			t.Fatal(err)
		}
	}
	if n := strings.Count(logs.String(), "SCTP service port not served"); n != 1 {
		t.Fatalf("warned %d times, want once:\n%s", n, logs.String())
	}
	if len(srv.Frontends()) != 0 {
		t.Fatalf("SCTP port got listeners: %v", srv.Frontends())
	}
}

// externalTrafficPolicy Local: the NodePort goes only to the local
// endpoint, the ClusterIP's proxy port to all; turning the policy off
// merges the pickers again.
func TestServerSplitsPickersForTrafficPolicies(t *testing.T) {
	forEachEngine(t, func(t *testing.T, e Engine) {
		srv := &Server{Engine: e, BindAddress: netip.MustParseAddr("127.0.0.1"), Retry: lb.DefaultRetryPolicy()}
		defer srv.Close()
		local, remote := serveTCP(t, nameHandler("local")), serveTCP(t, nameHandler("remote"))
		sp := webPort(freePort(t), local, remote)
		sp.Endpoints[0].Local = true
		if local.String() > remote.String() {
			sp.Endpoints[0], sp.Endpoints[1] = sp.Endpoints[1], sp.Endpoints[0]
		}
		sp.ExternalLocal = true
		if err := srv.Apply(snapshotOf(sp)); err != nil {
			t.Fatal(err)
		}
		var nodePort, proxyPort netip.AddrPort
		for _, fe := range srv.Frontends() {
			switch fe.Role {
			case RoleNodePort:
				nodePort = fe.Addr
			case RoleProxyPort:
				proxyPort = fe.Addr
			}
		}
		count := func(addr netip.AddrPort) map[string]int {
			seen := map[string]int{}
			for i := 0; i < 6; i++ {
				name, err := dialName(t, addr)
				if err != nil {
					t.Fatalf("%s: %v", addr, err)
				}
				seen[name]++
			}
			return seen
		}
		if seen := count(nodePort); seen["local"] != 6 {
			t.Fatalf("NodePort under externalTrafficPolicy Local reached %v, want only the local endpoint", seen)
		}
		if seen := count(proxyPort); seen["local"] != 3 || seen["remote"] != 3 {
			t.Fatalf("ClusterIP proxy port reached %v, want both endpoints in turn", seen)
		}
		if d := srv.Dump(); len(d) != 1 || len(d[0].ExternalEndpoints) != 1 {
			t.Fatalf("dump %+v, want one external endpoint listed", d)
		}
		// Policy back to Cluster: one picker, NodePort reaches both.
		sp2 := *sp
		sp2.ExternalLocal = false
		if err := srv.Apply(snapshotOf(&sp2)); err != nil {
			t.Fatal(err)
		}
		for _, fe := range srv.Frontends() {
			if fe.Role == RoleNodePort {
				nodePort = fe.Addr
			}
		}
		if seen := count(nodePort); seen["local"] != 3 || seen["remote"] != 3 {
			t.Fatalf("NodePort under Cluster policy reached %v, want both", seen)
		}
	})
}

// The bind capture: every service IP is listened on at its own port (here
// loopback addresses stand in for VIPs already made local), and no proxy
// port is opened.
func TestServerListensOnVIPs(t *testing.T) {
	forEachEngine(t, func(t *testing.T, e Engine) {
		srv := &Server{Engine: e, BindAddress: netip.MustParseAddr("127.0.0.1"), Retry: lb.DefaultRetryPolicy(), ListenOnVIPs: true}
		defer srv.Close()
		sp := webPort(0, serveTCP(t, nameHandler("vip")))
		sp.Port = freePort(t)
		sp.ClusterIPs = []netip.Addr{netip.MustParseAddr("127.0.0.7")}
		sp.SetExternalIPs([]netip.Addr{netip.MustParseAddr("127.0.0.8")})
		sp.SetLoadBalancerIPs([]netip.Addr{netip.MustParseAddr("127.0.0.9")})
		if err := srv.Apply(snapshotOf(sp)); err != nil {
			t.Fatal(err)
		}
		roles := map[Role]int{}
		for _, fe := range srv.Frontends() {
			roles[fe.Role]++
		}
		if roles[RoleClusterIP] != 1 || roles[RoleExternalIP] != 1 || roles[RoleLoadBalancer] != 1 || roles[RoleProxyPort] != 0 {
			t.Fatalf("frontends %v", srv.Frontends())
		}
		for _, ip := range []string{"127.0.0.7", "127.0.0.8", "127.0.0.9"} {
			if got, err := dialName(t, netip.AddrPortFrom(netip.MustParseAddr(ip), sp.Port)); err != nil || got != "vip" {
				t.Fatalf("%s:%d: %q %v", ip, sp.Port, got, err)
			}
		}
	})
}

// The iptables capture under externalTrafficPolicy Local: non-local external
// IPs are redirected to an external proxy port that reaches only local
// endpoints; without a split policy they share the ClusterIP's proxy port.
func TestServerOpensExternalProxyPortForSplitPolicy(t *testing.T) {
	forEachEngine(t, func(t *testing.T, e Engine) {
		srv := &Server{Engine: e, BindAddress: netip.MustParseAddr("127.0.0.1"), Retry: lb.DefaultRetryPolicy(), CaptureExternal: true}
		defer srv.Close()
		local, remote := serveTCP(t, nameHandler("local")), serveTCP(t, nameHandler("remote"))
		sp := webPort(0, local, remote)
		sp.SetExternalIPs([]netip.Addr{netip.MustParseAddr("203.0.113.9")})
		for i := range sp.Endpoints {
			sp.Endpoints[i].Local = sp.Endpoints[i].Addr.AddrPort() == local
		}
		if err := srv.Apply(snapshotOf(sp)); err != nil {
			t.Fatal(err)
		}
		if fes := srv.Frontends(); len(fes) != 1 || fes[0].Role != RoleProxyPort {
			t.Fatalf("Cluster policy: frontends %v, want one shared proxy port", fes)
		}
		sp2 := *sp
		sp2.ExternalLocal = true
		if err := srv.Apply(snapshotOf(&sp2)); err != nil {
			t.Fatal(err)
		}
		var ext netip.AddrPort
		for _, fe := range srv.Frontends() {
			if fe.Role == RoleExternalProxyPort {
				ext = fe.Addr
			}
		}
		if !ext.IsValid() {
			t.Fatalf("Local policy: frontends %v, want an external proxy port", srv.Frontends())
		}
		for i := 0; i < 4; i++ {
			if got, err := dialName(t, ext); err != nil || got != "local" {
				t.Fatalf("external proxy port: %q %v, want only the local endpoint", got, err)
			}
		}
	})
}

// loadBalancerSourceRanges on a local LB IP: a client outside the ranges
// is refused; once the ranges admit it, it is served. Other frontends of
// the port are not filtered.
func TestServerLoadBalancerSourceRanges(t *testing.T) {
	forEachEngine(t, func(t *testing.T, e Engine) {
		lbIP := netip.MustParseAddr("127.0.0.6")
		srv := &Server{Engine: e, BindAddress: netip.MustParseAddr("127.0.0.1"), Retry: lb.DefaultRetryPolicy(),
			IsLocal: func(a netip.Addr) bool { return a == lbIP }}
		defer srv.Close()
		sp := webPort(0, serveTCP(t, nameHandler("lb")))
		sp.Port = freePort(t)
		sp.SetLoadBalancerIPs([]netip.Addr{lbIP})
		sp.SetSourceRanges([]netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")})
		if err := srv.Apply(snapshotOf(sp)); err != nil {
			t.Fatal(err)
		}
		addr := netip.AddrPortFrom(lbIP, sp.Port)
		if got, err := dialName(t, addr); err == nil && got == "lb" {
			t.Fatal("client outside the source ranges was served")
		}
		sp2 := *sp
		sp2.SetSourceRanges([]netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")})
		if err := srv.Apply(snapshotOf(&sp2)); err != nil {
			t.Fatal(err)
		}
		if got, err := dialName(t, addr); err != nil || got != "lb" {
			t.Fatalf("admitted client: %q %v", got, err)
		}
	})
}

// stepClock is a clock the test moves by hand.
type stepClock struct{ now time.Time }

func (c *stepClock) Now() time.Time { return c.now }

// A NodePort busy at start-up (another process, or the old sluice during
// an upgrade) is retried with back-off until it opens, and counted as
// unserved meanwhile (issue 19, item 2).
func TestServerRetriesAListenerThatFailedToOpen(t *testing.T) {
	forEachEngine(t, func(t *testing.T, e Engine) {
		busy, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		bp := busy.Addr().(*net.TCPAddr).AddrPort().Port()
		clock := &stepClock{now: time.Unix(1000, 0)}
		srv := &Server{Engine: e, BindAddress: netip.MustParseAddr("127.0.0.1"), Retry: lb.DefaultRetryPolicy(), Ejection: lb.DefaultEjectionPolicy(), Clock: clock}
		defer srv.Close()
		if err := srv.Apply(snapshotOf(webPort(bp, serveTCP(t, nameHandler("web"))))); err == nil {
			t.Fatal("a nodePort already in use was not reported")
		}
		if n := srv.Unserved(); n != 1 {
			t.Fatalf("Unserved = %d, want 1", n)
		}
		// Before its back-off: not tried, still unserved.
		if left, err := srv.RetryFailed(); left != 1 || err != nil {
			t.Fatalf("early retry: %d left, %v", left, err)
		}
		// Due, but the port is still busy: an error, and a longer back-off.
		clock.now = clock.now.Add(time.Second)
		if left, err := srv.RetryFailed(); left != 1 || err == nil || !strings.Contains(err.Error(), busy.Addr().String()) {
			t.Fatalf("retry while busy: %d left, %v", left, err)
		}
		clock.now = clock.now.Add(time.Second)
		if left, _ := srv.RetryFailed(); left != 1 {
			t.Fatal("retried before the doubled back-off")
		}
		busy.Close()
		clock.now = clock.now.Add(time.Second)
		if left, err := srv.RetryFailed(); left != 0 || err != nil {
			t.Fatalf("retry once free: %d left, %v", left, err)
		}
		if got, err := dialName(t, netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), bp)); err != nil || got != "web" {
			t.Fatalf("the nodePort is not served after the retry: %q %v", got, err)
		}
		if n := srv.Unserved(); n != 0 {
			t.Fatalf("Unserved = %d after the retry", n)
		}
		// It is a listener like the others: a removal closes it.
		if err := srv.Apply(snapshotOf()); err != nil {
			t.Fatal(err)
		}
		if _, err := dialName(t, netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), bp)); err == nil {
			t.Fatal("the retried listener outlived its service")
		}
	})
}

// A port removed while a listener of its waits for a retry takes the
// retry with it: nothing is unserved, and nothing is tried again.
func TestServerDropsTheRetriesOfARemovedPort(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	bp := busy.Addr().(*net.TCPAddr).AddrPort().Port()
	clock := &stepClock{now: time.Unix(1000, 0)}
	srv := &Server{Engine: NewGoroutine(Options{}), BindAddress: netip.MustParseAddr("127.0.0.1"), Retry: lb.DefaultRetryPolicy(), Clock: clock}
	defer srv.Close()
	web := webPort(bp, netip.MustParseAddrPort("127.0.0.1:1"))
	if err := srv.Apply(snapshotOf(web)); err == nil || srv.Unserved() != 1 {
		t.Fatalf("a busy nodePort: %v, %d unserved", err, srv.Unserved())
	}
	moved := *web
	moved.NodePort = uint16(freePort(t)) // the port opened again elsewhere
	if err := srv.Apply(snapshotOf(&moved)); err != nil || srv.Unserved() != 0 {
		t.Fatalf("after a frontend change: %v, %d unserved", err, srv.Unserved())
	}
	clock.now = clock.now.Add(time.Minute)
	if left, err := srv.RetryFailed(); left != 0 || err != nil || len(srv.failed) != 0 {
		t.Fatalf("retry after the change: %d left, %v, %d ports with failures", left, err, len(srv.failed))
	}
	if err := srv.Apply(snapshotOf(web)); err == nil || srv.Unserved() != 1 {
		t.Fatalf("the busy nodePort again: %v, %d unserved", err, srv.Unserved())
	}
	if err := srv.Apply(snapshotOf()); err != nil || srv.Unserved() != 0 || len(srv.failed) != 0 {
		t.Fatalf("after the removal: %v, %d unserved, %d ports with failures", err, srv.Unserved(), len(srv.failed))
	}
}

// An ejection is logged, off the data path, with the service and the
// endpoint (issue 17: ejections were not logged); Close waits for the log.
func TestServerLogsEjections(t *testing.T) {
	var logs bytes.Buffer
	var mu sync.Mutex
	s := &Server{Log: slog.New(slog.NewTextHandler(lockedWriter{&mu, &logs}, nil)), Ejection: lb.DefaultEjectionPolicy()}
	name := lb.ServicePortName{Namespace: "ns", Name: "web", Port: "http", Protocol: lb.TCP}
	s.pickerSettings().Ejection.OnEject(name, netip.MustParseAddrPort("10.244.0.9:8080"), 5*time.Second)
	s.Close()
	mu.Lock()
	defer mu.Unlock()
	if out := logs.String(); !strings.Contains(out, "endpoint ejected") || !strings.Contains(out, "service=ns/web:http") || !strings.Contains(out, "endpoint=10.244.0.9:8080") || !strings.Contains(out, "for=5s") {
		t.Fatalf("log: %q", out)
	}
	s.pickerSettings().Ejection.OnEject(name, netip.MustParseAddrPort("10.244.0.9:8080"), 5*time.Second) // after Close: dropped, no panic

	// A return (a probe that connected) is logged too.
	logs.Reset()
	s2 := &Server{Log: slog.New(slog.NewTextHandler(&logs, nil)), Ejection: lb.DefaultEjectionPolicy()}
	s2.pickerSettings().Ejection.OnReturn(name, netip.MustParseAddrPort("10.244.0.9:8080"))
	s2.Close()
	if out := logs.String(); !strings.Contains(out, "endpoint returned") || !strings.Contains(out, "endpoint=10.244.0.9:8080") {
		t.Fatalf("log: %q", out)
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(b)
}

// A server given each snapshot as a delta of the last (ID, Base, Changed)
// ends up serving what a server given every snapshot whole serves, step
// after step of a random walk, a skipped snapshot included (its delta no
// longer applies: the server compares everything) (issue 16).
func TestServerDeltasConvergeWithFullApplies(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 9))
	newServer := func() *Server {
		srv := &Server{Engine: NewGoroutine(Options{}), BindAddress: netip.MustParseAddr("127.0.0.1"), Retry: lb.DefaultRetryPolicy()}
		t.Cleanup(srv.Close)
		return srv
	}
	delta, full := newServer(), newServer()
	name := func(i int) lb.ServicePortName {
		return lb.ServicePortName{Namespace: "walk", Name: fmt.Sprintf("s%d", i), Port: "p", Protocol: lb.TCP}
	}
	port := func(i int) *lb.ServicePort {
		sp := &lb.ServicePort{Name: name(i), ClusterIPs: []netip.Addr{netip.AddrFrom4([4]byte{10, 96, 0, byte(i + 1)})}, Port: 80}
		for k := rng.IntN(3); k > 0; k-- {
			sp.Endpoints = append(sp.Endpoints, lb.Endpoint{Addr: lb.EndpointAddrFrom(netip.AddrFrom4([4]byte{127, 0, 1, byte(rng.IntN(5) + 1)}), 8080), Ready: true, Serving: true})
		}
		return sp
	}
	last := &lb.Snapshot{}
	view := func(s *Server) string {
		var b strings.Builder
		for _, v := range s.Dump() {
			fmt.Fprintf(&b, "%s %s %d frontends %v\n", v.Service, v.Protocol, len(v.Frontends), v.Endpoints)
		}
		return b.String()
	}
	for step := 1; step <= 60; step++ {
		set := map[lb.ServicePortName]*lb.ServicePort{}
		var del []lb.ServicePortName
		for k := rng.IntN(4) + 1; k > 0; k-- {
			i := rng.IntN(12)
			if rng.IntN(4) == 0 {
				del = append(del, name(i))
			} else {
				set[name(i)] = port(i)
			}
		}
		var changed []lb.ServicePortName
		for n := range set {
			changed = append(changed, n)
		}
		changed = append(changed, del...)
		next := &lb.Snapshot{Ports: last.Ports.With(set, del), ID: uint64(step), Base: last.ID, Changed: changed}
		last = next
		if step%17 == 0 {
			continue // the delta server misses this one; the next one's base is not what it applied
		}
		whole := map[lb.ServicePortName]*lb.ServicePort{}
		for n, sp := range next.Ports.All() {
			whole[n] = sp
		}
		if err := delta.Apply(next); err != nil {
			t.Fatal(err)
		}
		if err := full.Apply(lb.NewSnapshot(whole)); err != nil {
			t.Fatal(err)
		}
		if d, f := view(delta), view(full); d != f {
			t.Fatalf("step %d: with deltas\n%s\nwhole\n%s", step, d, f)
		}
	}
}

// TestServerCountsSkippedSCTPPorts: without an SCTP listener, the count
// handed to SCTPSkipped is the number of SCTP ports in the snapshot after
// every apply, whether it came as a delta or whole, and whatever the
// SCTP ports did (added, changed, dropped, their frontend moved).
func TestServerCountsSkippedSCTPPorts(t *testing.T) {
	var got []int
	srv := &Server{Engine: NewGoroutine(Options{}), BindAddress: netip.MustParseAddr("127.0.0.1"), Retry: lb.DefaultRetryPolicy(),
		SCTPSkipped: func(n int) { got = append(got, n) }}
	defer srv.Close()
	rng := rand.New(rand.NewPCG(16, 2))
	name := func(i int) lb.ServicePortName {
		proto := lb.SCTP
		if i%3 == 0 {
			proto = lb.TCP
		}
		return lb.ServicePortName{Namespace: "ns", Name: fmt.Sprintf("s%d", i), Port: "p", Protocol: proto}
	}
	snap := lb.NewSnapshot(nil)
	snap.ID = 1
	for step := range 200 {
		set := map[lb.ServicePortName]*lb.ServicePort{}
		var del []lb.ServicePortName
		i := rng.IntN(12)
		if rng.IntN(3) == 0 {
			del = append(del, name(i))
		} else {
			// A new ClusterIP now and then: the frontend changes.
			sp := &lb.ServicePort{Name: name(i), Port: 80, ClusterIPs: []netip.Addr{netip.AddrFrom4([4]byte{10, 96, byte(i), byte(rng.IntN(2))})}}
			set[sp.Name] = sp
		}
		next := &lb.Snapshot{Ports: snap.Ports.With(set, del), ID: snap.ID + 1, Base: snap.ID, Changed: []lb.ServicePortName{name(i)}}
		if rng.IntN(8) == 0 {
			next.Base, next.Changed = 0, nil
		}
		srv.Apply(next) // errors: none expected for ClusterIP-only ports on proxy ports
		want := 0
		for n := range next.Ports.All() {
			if n.Protocol == lb.SCTP {
				want++
			}
		}
		if len(got) != step+1 || got[step] != want {
			t.Fatalf("step %d: SCTPSkipped calls %v, want the last to be %d", step, got, want)
		}
		snap = next
	}
}

// Random proxy ports as run picks them (NewEphemeralPortAllocator): a
// port of the range someone else holds is passed over for the next one,
// the proxy port serves, and a removed Service gives its port back.
func TestServerProxyPortsFromTheEphemeralRange(t *testing.T) {
	// Two adjacent free loopback ports, the second held by "someone else"
	// and even, so that the allocator (even ports first) always tries it
	// first and the server has to pass it over. Below the ephemeral range
	// (Linux's default is 32768-60999): a port ":0" gave and this test let
	// go was taken by a test package running beside it before the server
	// bound it (make test: the proxy port landed elsewhere).
	var lo int
	var held net.Listener
	for try := 0; held == nil; try++ {
		if try == 200 {
			t.Fatal("no two adjacent free ports, the first odd")
		}
		p := 20001 + 2*rand.IntN(6000)
		ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
		if err != nil {
			continue
		}
		if h, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p+1)); err == nil {
			lo, held = p, h
		}
		ln.Close()
	}
	defer held.Close()
	forEachEngine(t, func(t *testing.T, e Engine) {
		alloc := NewEphemeralPortAllocator(lo, lo+1, nil)
		srv := &Server{Engine: e, BindAddress: netip.MustParseAddr("127.0.0.1"), Retry: lb.DefaultRetryPolicy(), ProxyPorts: alloc}
		defer srv.Close()
		sp := webPort(0, serveTCP(t, nameHandler("web")))
		if err := srv.Apply(snapshotOf(sp)); err != nil {
			t.Fatal(err)
		}
		fes := srv.Frontends()
		if len(fes) != 1 || fes[0].Role != RoleProxyPort || int(fes[0].Addr.Port()) != lo {
			t.Fatalf("frontends %v, want the proxy port on %d (%d is held)", fes, lo, lo+1)
		}
		if got, err := dialName(t, fes[0].Addr); err != nil || got != "web" {
			t.Fatalf("through the proxy port: %q, %v", got, err)
		}
		if err := srv.Apply(snapshotOf()); err != nil {
			t.Fatal(err)
		}
		// Both ports are free again in the allocator's eyes (the held one
		// was handed back when the tries ended).
		p1, _ := alloc.Next()
		p2, _ := alloc.Next()
		if min(p1, p2) != lo || max(p1, p2) != lo+1 {
			t.Fatalf("after the Service went: Next gave %d and %d, want %d and %d", p1, p2, lo, lo+1)
		}
	})
}

// With a capture port, 1,000 TCP service ports are served by one
// listener: each port's captured destinations (its ClusterIP, and a
// non-local external IP, on the external target when the policies split)
// resolve to its own target, removed ports stop resolving, UDP keeps its
// proxy port, and a connection straight to the capture port (not
// redirected: no original destination) is reset.
func TestServerServesTCPPortsThroughOneCapturePort(t *testing.T) {
	forEachEngine(t, func(t *testing.T, e Engine) {
		srv := &Server{Engine: e, BindAddress: netip.MustParseAddr("127.0.0.1"), Retry: lb.DefaultRetryPolicy(),
			CapturePort: freePort(t), CaptureExternal: true, UDPTimeout: time.Second}
		defer srv.Close()
		if err := srv.OpenCapture(); err != nil {
			t.Fatal(err)
		}
		if err := srv.OpenCapture(); err == nil {
			t.Fatal("a second OpenCapture succeeded")
		}
		capture := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), srv.CapturePort)
		ep := serveTCP(t, nameHandler("b"))
		fdsBefore := openFDs(t)
		ports := map[lb.ServicePortName]*lb.ServicePort{}
		for i := range 1000 {
			sp := webPort(0, ep)
			sp.Name.Name = fmt.Sprintf("web%d", i)
			sp.ClusterIPs = []netip.Addr{netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)})}
			if i == 7 {
				sp.SetExternalIPs([]netip.Addr{netip.MustParseAddr("203.0.113.9")})
				sp.ExternalLocal = true // its own external target
				sp.Endpoints[0].Local = true
			}
			ports[sp.Name] = sp
		}
		dns := webPort(0, ep)
		dns.Name = lb.ServicePortName{Namespace: "demo", Name: "dns", Port: "dns", Protocol: lb.UDP}
		dns.ClusterIPs = []netip.Addr{netip.MustParseAddr("10.96.9.9")}
		dns.Port = 53
		ports[dns.Name] = dns
		cur := lb.NewSnapshot(ports)
		cur.ID = 1
		if err := srv.Apply(cur); err != nil {
			t.Fatal(err)
		}
		if opened := openFDs(t) - fdsBefore; opened > 10 {
			t.Fatalf("%d descriptors opened for 1,000 TCP ports and one UDP port, want the UDP proxy port's few", opened)
		}
		byRole := map[Role]int{}
		for _, fe := range srv.Frontends() {
			byRole[fe.Role]++
			if fe.Service.Protocol == lb.TCP && fe.Addr != capture {
				t.Fatalf("TCP frontend %+v not on the capture port %s", fe, capture)
			}
			if fe.Service.Protocol == lb.UDP && (fe.Role != RoleProxyPort || fe.Addr == capture) {
				t.Fatalf("UDP frontend %+v, want a proxy port of its own", fe)
			}
		}
		if byRole[RoleProxyPort] != 1001 || byRole[RoleExternalProxyPort] != 1 {
			t.Fatalf("frontends by role %v, want 1001 proxy ports and 1 external", byRole)
		}
		// Checked under the server's lock, reported after it (a Fatalf
		// holding it would deadlock the deferred Close).
		if err := func() error {
			srv.mu.Lock()
			defer srv.mu.Unlock()
			for name, sp := range ports {
				if name.Protocol != lb.TCP {
					continue
				}
				p, _ := srv.ports.Get(name)
				if got := srv.resolveCaptured(netip.AddrPortFrom(sp.ClusterIPs[0], 80)); got != p.target {
					return fmt.Errorf("%s's ClusterIP resolves to %p, want its target %p", name, got, p.target)
				}
				if len(sp.ExternalIPs()) > 0 {
					if got := srv.resolveCaptured(netip.AddrPortFrom(sp.ExternalIPs()[0], 80)); got != p.ext || p.ext == p.target {
						return fmt.Errorf("%s's external IP resolves to %p, want its external target %p", name, got, p.ext)
					}
				}
			}
			return nil
		}(); err != nil {
			t.Fatal(err)
		}
		if srv.resolveCaptured(netip.MustParseAddrPort("10.96.0.1:81")) != nil || srv.resolveCaptured(netip.MustParseAddrPort("10.96.9.9:53")) != nil {
			t.Fatal("a destination no TCP port has resolves")
		}
		// Half the ports go (a delta); theirs stop resolving.
		var del []lb.ServicePortName
		for name := range ports {
			if name.Protocol == lb.TCP && len(del) < 500 {
				del = append(del, name)
			}
		}
		next := cur.With(nil, del)
		next.ID = 2
		if err := srv.Apply(next); err != nil {
			t.Fatal(err)
		}
		for _, name := range del {
			if got := srv.resolveCaptured(netip.AddrPortFrom(ports[name].ClusterIPs[0], 80)); got != nil {
				t.Fatalf("removed %s still resolves", name)
			}
		}
		if got := srv.resolveCaptured(netip.AddrPortFrom(keptTCPClusterIP(t, next), 80)); got == nil {
			t.Fatal("a kept port stopped resolving")
		}
		if got, err := dialName(t, capture); err == nil && got != "" {
			t.Fatalf("straight to the capture port: %q, want a reset", got)
		}
	})
}

// keptTCPClusterIP returns a ClusterIP of a TCP port still in snap.
func keptTCPClusterIP(t *testing.T, snap *lb.Snapshot) netip.Addr {
	for _, sp := range snap.Ports.All() {
		if sp.Name.Protocol == lb.TCP {
			return sp.ClusterIPs[0]
		}
	}
	t.Fatal("no TCP port left")
	return netip.Addr{}
}

// openFDs counts the process's open descriptors.
func openFDs(t *testing.T) int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// heldSockets is a Sockets that hands a successor what a predecessor
// held, by the address it was held under.
type heldSockets struct {
	mu   sync.Mutex
	held map[string][]int
}

func (h *heldSockets) key(network string, addr netip.AddrPort) string {
	return network + " " + addr.String()
}

func (h *heldSockets) Take(network string, addr netip.AddrPort) []int {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []int
	for _, fd := range h.held[h.key(network, addr)] {
		if d, err := syscall.Dup(fd); err == nil {
			out = append(out, d)
		}
	}
	return out
}

func (h *heldSockets) Hold(network string, addr netip.AddrPort, fd int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.held == nil {
		h.held = map[string][]int{}
	}
	h.held[h.key(network, addr)] = append(h.held[h.key(network, addr)], fd)
}

func (h *heldSockets) Release(int) {}

// A successor takes a TCP listener on a wildcard address from its
// predecessor, under the address both ask for, on either engine: the
// goroutine engine held it under [::] (Go's listener for 0.0.0.0), so a
// restart found nothing, failed to listen (EADDRINUSE) and left the port
// unserved until the old process retired.
func TestEnginesHandOverWildcardListeners(t *testing.T) {
	for _, name := range engineNames {
		t.Run(name, func(t *testing.T) {
			socks := &heldSockets{}
			old, err := New(name, Options{Loops: 2, Sockets: socks})
			if err != nil {
				t.Fatal(err)
			}
			defer old.Shutdown(t.Context())
			addr := netip.AddrPortFrom(netip.IPv4Unspecified(), freePort(t))
			if _, err := old.Listen(lb.TCP, addr, &Target{Picker: lb.NewPicker(nil, lb.EjectionPolicy{})}); err != nil {
				t.Fatal(err)
			}
			succ, err := New(name, Options{Loops: 2, Sockets: socks})
			if err != nil {
				t.Fatal(err)
			}
			defer succ.Shutdown(t.Context())
			if _, err := succ.Listen(lb.TCP, addr, &Target{Picker: lb.NewPicker(nil, lb.EjectionPolicy{})}); err != nil {
				t.Fatalf("the successor could not take %s over: %v (held: %v)", addr, err, socks.held)
			}
		})
	}
}

// namedCounters count nothing and know the port they were made for.
type namedCounters struct {
	noCounters
	name lb.ServicePortName
}

// EachCounters lists every served port's counters, made once for that
// port: kept across a frontend change, gone with a removed port.
func TestServerListsEachPortsCountersWhileItIsServed(t *testing.T) {
	made := 0
	srv := &Server{Engine: NewGoroutine(Options{}), BindAddress: netip.MustParseAddr("127.0.0.1"), Retry: lb.DefaultRetryPolicy(),
		Counters: func(n lb.ServicePortName) Counters { made++; return &namedCounters{name: n} }}
	defer srv.Close()
	listed := func() map[lb.ServicePortName]Counters {
		out := map[lb.ServicePortName]Counters{}
		srv.EachCounters(func(n lb.ServicePortName, c Counters) {
			if _, dup := out[n]; dup {
				t.Fatalf("%s listed twice", n)
			}
			if c.(*namedCounters).name != n {
				t.Fatalf("%s listed with the counters of %s", n, c.(*namedCounters).name)
			}
			out[n] = c
		})
		return out
	}
	web := webPort(freePort(t), netip.MustParseAddrPort("127.0.0.1:1"))
	other := webPort(freePort(t), netip.MustParseAddrPort("127.0.0.1:1"))
	other.Name.Name = "other"
	if err := srv.Apply(snapshotOf(web, other)); err != nil {
		t.Fatal(err)
	}
	first := listed()
	if len(first) != 2 || made != 2 {
		t.Fatalf("listed %v after %d made, want both ports' counters", first, made)
	}
	moved := *web
	moved.NodePort = uint16(freePort(t)) // a frontend change: the port is opened again
	if err := srv.Apply(snapshotOf(&moved)); err != nil {
		t.Fatal(err)
	}
	second := listed()
	if len(second) != 1 || second[web.Name] != first[web.Name] || made != 2 {
		t.Fatalf("listed %v after %d made, want only %s's first counters", second, made, web.Name)
	}
}
