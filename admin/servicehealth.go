package admin

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// HealthCheckService is one Service with a healthCheckNodePort
// (externalTrafficPolicy Local): a cloud load balancer probes the port to
// learn whether this node has a local endpoint for it.
type HealthCheckService struct {
	Namespace, Name string
	Port            uint16
	LocalEndpoints  int
	// IPv4 and IPv6 are the Service's IP families (its cluster IPs'). A
	// listed address of another family is not listened on for it, as
	// kube-proxy's health check server, one per family's proxier, opens a
	// Service's port only in the families that proxier serves. Neither
	// set: both.
	IPv4, IPv6 bool
}

// addrsFor are the addresses of addrs in s's families (nil: addrs is).
func (s HealthCheckService) addrsFor(addrs []netip.Addr) []netip.Addr {
	if addrs == nil || s.IPv4 == s.IPv6 {
		return addrs
	}
	out := []netip.Addr{}
	for _, a := range addrs {
		if a.Unmap().Is4() == s.IPv4 {
			out = append(out, a)
		}
	}
	return out
}

// ServiceHealth serves kube-proxy's per-service health checks: an HTTP
// listener per healthCheckNodePort, answering any path with 200 when the
// Service has local endpoints and the proxy is healthy, else 503, and a
// JSON body saying so. Sync opens, updates and closes listeners; a port
// whose Service changes keeps its listener.
type ServiceHealth struct {
	// Addrs are the addresses to listen on (--nodeport-addresses); nil or
	// empty means every address.
	Addrs func() []netip.Addr
	// ProxyHealthy reports the proxy's own health (healthz).
	ProxyHealthy func() bool
	// Listen opens a listener; default net.Listen.
	Listen func(network, addr string) (net.Listener, error)
	// Wildcard is the address listened on when Addrs selects none: the
	// primary family's, as kube-proxy's health check server (IPv4:
	// "0.0.0.0", the default; IPv6: "::"), not both.
	Wildcard string

	mu      sync.Mutex
	servers map[uint16]*hcServer
}

type hcState struct {
	namespace, name string
	local           int
}

type hcServer struct {
	state atomic.Pointer[hcState]
	addrs []netip.Addr
	srvs  []*http.Server
	wg    sync.WaitGroup // the Serve goroutines
}

func (h *ServiceHealth) listen(network, addr string) (net.Listener, error) {
	if h.Listen != nil {
		return h.Listen(network, addr)
	}
	return net.Listen(network, addr)
}

func (s *hcServer) ServeHTTP(w http.ResponseWriter, _ *http.Request, healthy bool) {
	st := s.state.Load()
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	// The weight some cloud load balancers (GCE's weighted load
	// balancing) give this node: its local endpoints.
	w.Header().Set("X-Load-Balancing-Endpoint-Weight", strconv.Itoa(st.local))
	if st.local > 0 && healthy {
		w.WriteHeader(http.StatusOK)
	} else {
		w.WriteHeader(http.StatusServiceUnavailable)
	}
	// kube-proxy's body, byte for byte: indented with tabs, no newline at
	// the end.
	fmt.Fprintf(w, "{\n\t\"service\": {\n\t\t\"namespace\": %q,\n\t\t\"name\": %q\n\t},\n\t\"localEndpoints\": %d,\n\t\"serviceProxyHealthy\": %v\n}",
		st.namespace, st.name, st.local, healthy)
}

// HealthCheckError is a Service's health check node port that could not
// be opened.
type HealthCheckError struct {
	Namespace, Name string
	Port            uint16
	Err             error
}

func (e *HealthCheckError) Error() string {
	return fmt.Sprintf("health check for %s/%s on port %d: %v", e.Namespace, e.Name, e.Port, e.Err)
}

func (e *HealthCheckError) Unwrap() error { return e.Err }

// Sync makes the listeners match svcs. A port that cannot be opened is
// reported (naming Service and port) and the rest go ahead.
func (h *ServiceHealth) Sync(svcs []HealthCheckService) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.servers == nil {
		h.servers = map[uint16]*hcServer{}
	}
	var addrs []netip.Addr
	if h.Addrs != nil {
		addrs = h.Addrs()
	}
	want := map[uint16]HealthCheckService{}
	var errs []error
	for _, s := range svcs {
		if o, dup := want[s.Port]; dup && (o.Namespace != s.Namespace || o.Name != s.Name) {
			errs = append(errs, fmt.Errorf("health check node port %d: claimed by %s/%s and %s/%s", s.Port, o.Namespace, o.Name, s.Namespace, s.Name))
			continue
		}
		want[s.Port] = s
	}
	for port, srv := range h.servers {
		if s, ok := want[port]; !ok || !slices.Equal(srv.addrs, s.addrsFor(addrs)) {
			srv.close()
			delete(h.servers, port)
		}
	}
	for port, s := range want {
		st := &hcState{namespace: s.Namespace, name: s.Name, local: s.LocalEndpoints}
		if srv, ok := h.servers[port]; ok {
			srv.state.Store(st)
			continue
		}
		mine := s.addrsFor(addrs)
		srv := &hcServer{addrs: mine}
		srv.state.Store(st)
		wildcard := h.Wildcard
		if wildcard == "" {
			wildcard = "0.0.0.0"
		}
		hosts := []string{wildcard}
		if len(addrs) > 0 {
			hosts = []string{}
			for _, a := range mine {
				hosts = append(hosts, a.String())
			}
		}
		var failed error
		for _, host := range hosts {
			ln, err := h.listen("tcp", net.JoinHostPort(host, fmt.Sprint(port)))
			if err != nil {
				failed = &HealthCheckError{Namespace: s.Namespace, Name: s.Name, Port: port, Err: err}
				break
			}
			hs := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				healthy := h.ProxyHealthy == nil || h.ProxyHealthy()
				srv.ServeHTTP(w, r, healthy)
			})}
			srv.srvs = append(srv.srvs, hs)
			srv.wg.Add(1)
			go func() {
				defer srv.wg.Done()
				hs.Serve(ln)
			}()
		}
		if failed != nil {
			srv.close()
			errs = append(errs, failed)
			continue
		}
		h.servers[port] = srv
	}
	return errors.Join(errs...)
}

func (s *hcServer) close() {
	for _, hs := range s.srvs {
		hs.Close()
	}
	s.wg.Wait()
}

// Ports lists the open health check ports, sorted.
func (h *ServiceHealth) Ports() []uint16 {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []uint16
	for p := range h.servers {
		out = append(out, p)
	}
	slices.Sort(out)
	return out
}

// Close closes every listener.
func (h *ServiceHealth) Close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for port, srv := range h.servers {
		srv.close()
		delete(h.servers, port)
	}
}
