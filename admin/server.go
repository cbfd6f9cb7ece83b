package admin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
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
	// Profiling serves /debug/pprof, and /debug/flags/v when SetVerbosity
	// is set (kube-proxy's --profiling).
	Profiling bool
	// SetVerbosity sets the log's --v from a PUT of /debug/flags/v and
	// says what it did.
	SetVerbosity func(string) (string, error)
	// Dump returns the debug view of what is being served (JSON-encodable).
	Dump func() any
	// NodeName is this node's name, served with Health's view of its Node
	// at /debug/sluice/node beside Dump.
	NodeName string
	// Configz is the configuration in effect, served as JSON at /configz
	// as kube-proxy serves its own (nil: not served).
	Configz any
	// Flagz is every flag's value, served at /flagz (nil: not served;
	// kube-proxy's ComponentFlagz gate).
	Flagz map[string]string
	// Statusz is served at /statusz (nil: not served; kube-proxy's
	// ComponentStatusz gate).
	Statusz *Statusz
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
// /configz and, when enabled, /flagz, /statusz, /debug/pprof,
// /debug/sluice and /debug/sluice/node.
func (e *Endpoints) MetricsHandler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", e.Metrics)
	mux.HandleFunc("/proxyMode", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		fmt.Fprint(w, e.ProxyMode)
	})
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		// kube-proxy's metrics server checks "ping" alone, and records it
		// for /metrics/slis.
		e.Metrics.observeHealthcheck("ping", "healthz")
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		fmt.Fprint(w, "ok")
	})
	mux.HandleFunc("/metrics/slis", e.Metrics.serveSLIs)
	if e.Configz != nil {
		mux.HandleFunc("/configz", func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("X-Content-Type-Options", "nosniff")
			json.NewEncoder(w).Encode(e.Configz)
		})
	}
	if e.Flagz != nil {
		mux.HandleFunc("/flagz", flagzHandler(e.Flagz))
	}
	if e.Statusz != nil {
		mux.HandleFunc("/statusz", statuszHandler(e.Statusz))
	}
	if e.Dump != nil {
		mux.HandleFunc("/debug/sluice", func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			enc := json.NewEncoder(w)
			enc.SetIndent("", "  ")
			enc.Encode(e.Dump())
		})
		mux.HandleFunc("/debug/sluice/node", func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			json.NewEncoder(w).Encode(e.Health.Node(e.NodeName))
		})
	}
	if e.Profiling {
		mux.Handle("/debug/pprof", http.RedirectHandler("/debug/pprof/", http.StatusFound))
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
		if e.SetVerbosity != nil {
			mux.HandleFunc("/debug/flags", debugFlagsIndex)
			mux.HandleFunc("/debug/flags/", debugFlagsIndex)
			mux.HandleFunc("/debug/flags/v", e.putVerbosity)
		}
	}
	return mux
}

// debugFlagsIndex lists the flags /debug/flags/ sets, as kube-proxy's page.
func debugFlagsIndex(w http.ResponseWriter, _ *http.Request) {
	fmt.Fprint(w, "<html>\n<head>\n<title>/debug/flags/</title>\n</head>\n<body>\n/debug/flags/<br>\n<br>\nflags:<br>\n<table>\n"+
		"<tr>v<br>\n"+
		"</table>\n<br>\nfull flags configurable<br>\n</body>\n</html>\n")
}

// putVerbosity sets the log's verbosity from a PUT's body, and answers
// as kube-proxy does: the setter's words, or its error with 400; any
// other method 406.
func (e *Endpoints) putVerbosity(w http.ResponseWriter, r *http.Request) {
	answer := func(code int, text string) {
		w.Header().Set("Content-Type", "text/plain")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		w.WriteHeader(code)
		fmt.Fprintln(w, text)
	}
	if r.Method != http.MethodPut {
		answer(http.StatusNotAcceptable, "unsupported http method")
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, 64))
	if err != nil {
		answer(http.StatusBadRequest, "error reading request body: "+err.Error())
		return
	}
	said, err := e.SetVerbosity(string(body))
	if err != nil {
		answer(http.StatusBadRequest, err.Error())
		return
	}
	answer(http.StatusOK, said)
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
