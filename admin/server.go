package admin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"time"
)

// Endpoints describes what the admin servers expose.
type Endpoints struct {
	Health    *Health
	Metrics   *Metrics
	ProxyMode string
	Profiling bool
	// Dump returns the debug view of what is being served (JSON-encodable).
	Dump func() any
	// Configz is the configuration in effect, served as JSON at /configz
	// as kube-proxy serves its own (nil: not served).
	Configz any
}

// HealthzHandler serves /healthz and /livez.
func (e *Endpoints) HealthzHandler() http.Handler {
	mux := http.NewServeMux()
	families := e.Metrics.servedFamilies()
	mux.Handle("/healthz", e.Health.handler(true, families, func(code int) { e.Metrics.healthz.WithLabelValues(codeLabel(code)).Inc() }))
	mux.Handle("/livez", e.Health.handler(false, families, func(code int) { e.Metrics.livez.WithLabelValues(codeLabel(code)).Inc() }))
	return mux
}

// MetricsHandler serves /metrics, /proxyMode, /healthz, /metrics/slis,
// /configz and, when enabled, /debug/pprof and /debug/sluice.
func (e *Endpoints) MetricsHandler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", e.Metrics)
	mux.HandleFunc("/proxyMode", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprint(w, e.ProxyMode)
	})
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		// kube-proxy's metrics server checks "ping" alone, and records it
		// for /metrics/slis.
		e.Metrics.observeHealthcheck("ping", "healthz")
		fmt.Fprint(w, "ok")
	})
	mux.HandleFunc("/metrics/slis", e.Metrics.serveSLIs)
	if e.Configz != nil {
		mux.HandleFunc("/configz", func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			json.NewEncoder(w).Encode(e.Configz)
		})
	}
	if e.Dump != nil {
		mux.HandleFunc("/debug/sluice", func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			enc := json.NewEncoder(w)
			enc.SetIndent("", "  ")
			enc.Encode(e.Dump())
		})
	}
	if e.Profiling {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	return mux
}

// Server is one running HTTP server.
type Server struct {
	srv  *http.Server
	ln   net.Listener
	done chan error
}

// Serve listens on addr and serves h until Close. An empty addr disables it
// (nil server, nil error).
func Serve(addr string, h http.Handler) (*Server, error) {
	return ServeWith(addr, h, net.Listen)
}

// ServeWith is Serve with the listener opened by listen (hitless restart
// hands the socket from process to process).
func ServeWith(addr string, h http.Handler, listen func(network, addr string) (net.Listener, error)) (*Server, error) {
	if addr == "" {
		return nil, nil
	}
	ln, err := listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	s := &Server{srv: &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}, ln: ln, done: make(chan error, 1)}
	go func() { s.done <- s.srv.Serve(ln) }()
	return s, nil
}

// Addr is the listening address.
func (s *Server) Addr() net.Addr { return s.ln.Addr() }

// Close stops the server and waits for its goroutine.
func (s *Server) Close() error {
	if s == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	err := s.srv.Shutdown(ctx)
	if serr := <-s.done; serr != nil && !errors.Is(serr, http.ErrServerClosed) {
		err = errors.Join(err, serr)
	}
	return err
}
