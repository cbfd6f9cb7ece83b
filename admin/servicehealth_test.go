package admin

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
)

// listenLoopback stands in for "every address": each requested port opens
// on 127.0.0.1 at a free port, remembered for the test to dial.
type listenLoopback struct {
	mu   sync.Mutex
	addr map[string]string
}

func (l *listenLoopback) listen(network, addr string) (net.Listener, error) {
	ln, err := net.Listen(network, "127.0.0.1:0")
	if err == nil {
		l.mu.Lock()
		l.addr[addr] = ln.Addr().String()
		l.mu.Unlock()
	}
	return ln, err
}

func (l *listenLoopback) get(t *testing.T, port string) (int, map[string]any) {
	t.Helper()
	l.mu.Lock()
	a := l.addr["0.0.0.0:"+port] // the primary family only, as kube-proxy (not both)
	l.mu.Unlock()
	resp, err := (&http.Client{Transport: &http.Transport{DisableKeepAlives: true}}).Get("http://" + a + "/any/path")
	if err != nil {
		return 0, nil
	}
	defer resp.Body.Close()
	if resp.Header.Get("X-Content-Type-Options") != "nosniff" || resp.Header.Get("Content-Type") != "application/json" {
		t.Errorf("headers %v", resp.Header)
	}
	var body map[string]any
	json.NewDecoder(resp.Body).Decode(&body)
	// The weight header says what the body does (kube-proxy's).
	if w := resp.Header.Get("X-Load-Balancing-Endpoint-Weight"); w != fmt.Sprint(body["localEndpoints"]) {
		t.Errorf("X-Load-Balancing-Endpoint-Weight %q, localEndpoints %v", w, body["localEndpoints"])
	}
	return resp.StatusCode, body
}

func TestServiceHealthPerServicePorts(t *testing.T) {
	l := &listenLoopback{addr: map[string]string{}}
	healthy := true
	var mu sync.Mutex
	h := &ServiceHealth{Listen: l.listen, ProxyHealthy: func() bool { mu.Lock(); defer mu.Unlock(); return healthy }}
	defer h.Close()
	if err := h.Sync([]HealthCheckService{{Namespace: "ns", Name: "web", Port: 32000, LocalEndpoints: 2}}); err != nil {
		t.Fatal(err)
	}
	code, body := l.get(t, "32000")
	if code != 200 || body["localEndpoints"] != 2.0 || body["serviceProxyHealthy"] != true ||
		body["service"].(map[string]any)["name"] != "web" || body["service"].(map[string]any)["namespace"] != "ns" {
		t.Fatalf("%d %v", code, body)
	}
	first := l.addr[":32000"]
	// No local endpoint: 503 on the same listener.
	if err := h.Sync([]HealthCheckService{{Namespace: "ns", Name: "web", Port: 32000}}); err != nil {
		t.Fatal(err)
	}
	if code, body := l.get(t, "32000"); code != 503 || body["localEndpoints"] != 0.0 || l.addr[":32000"] != first {
		t.Fatalf("no local endpoints: %d %v (listener %s, was %s)", code, body, l.addr[":32000"], first)
	}
	// The proxy unhealthy: 503 even with endpoints.
	h.Sync([]HealthCheckService{{Namespace: "ns", Name: "web", Port: 32000, LocalEndpoints: 1}})
	mu.Lock()
	healthy = false
	mu.Unlock()
	if code, body := l.get(t, "32000"); code != 503 || body["serviceProxyHealthy"] != false {
		t.Fatalf("proxy unhealthy: %d %v", code, body)
	}
	// Two Services claiming one port: an error naming both; the first stays.
	err := h.Sync([]HealthCheckService{{Namespace: "ns", Name: "web", Port: 32000, LocalEndpoints: 1}, {Namespace: "ns", Name: "other", Port: 32000}})
	if err == nil || !strings.Contains(err.Error(), "ns/web") || !strings.Contains(err.Error(), "ns/other") {
		t.Fatalf("conflict: %v", err)
	}
	// Removed: the port closes.
	if err := h.Sync(nil); err != nil {
		t.Fatal(err)
	}
	if code, _ := l.get(t, "32000"); code != 0 {
		t.Fatalf("removed port still answers %d", code)
	}
	if len(h.Ports()) != 0 {
		t.Fatalf("ports %v", h.Ports())
	}
}

// A Service's health check port opens on the listed node addresses of its
// own IP families only, as kube-proxy's per-family health check servers
// open it: an IPv4 Service's port is not opened on the node's IPv6
// addresses (a link-local one cannot even be bound without its zone).
func TestServiceHealthListensInTheServicesFamilies(t *testing.T) {
	addrs := []netip.Addr{netip.MustParseAddr("192.168.10.1"), netip.MustParseAddr("2001:db8::1"), netip.MustParseAddr("fe80::1")}
	for _, c := range []struct {
		v4, v6 bool
		want   string
	}{
		{true, false, "192.168.10.1:30001"},
		{false, true, "[2001:db8::1]:30001 [fe80::1]:30001"},
		{true, true, "192.168.10.1:30001 [2001:db8::1]:30001 [fe80::1]:30001"},
		{false, false, "192.168.10.1:30001 [2001:db8::1]:30001 [fe80::1]:30001"},
	} {
		l := &listenLoopback{addr: map[string]string{}}
		h := &ServiceHealth{Listen: l.listen, Addrs: func() []netip.Addr { return addrs }}
		if err := h.Sync([]HealthCheckService{{Namespace: "ns", Name: "lb", Port: 30001, IPv4: c.v4, IPv6: c.v6}}); err != nil {
			t.Fatal(err)
		}
		var got []string
		for a := range l.addr {
			got = append(got, a)
		}
		slices.Sort(got)
		h.Close()
		if strings.Join(got, " ") != c.want {
			t.Fatalf("IPv4 %v IPv6 %v: listened on %q, want %q", c.v4, c.v6, got, c.want)
		}
	}
}
