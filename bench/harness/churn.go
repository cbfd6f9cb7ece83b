//go:build linux

package harness

import (
	"context"
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// churn measures the control plane: with n services loaded, how long from
// an EndpointSlice edit on disk to the data plane sending new connections to
// the new endpoint, while a steady stream of new connections runs against
// another service (errors and p99 under churn). Only sluice has this path
// (the peers would need a reload); the others are n/a.
func churn(n int) func(ctx context.Context, in *Instance, sz Size) (Metrics, error) {
	return func(ctx context.Context, in *Instance, sz Size) (Metrics, error) {
		sl, ok := in.System.(sluice)
		if !ok || sl.engine != "eventloop" || n > sz.MaxChurn {
			return nil, errNotApplicable
		}
		httpBackends := in.Services["http"].Backends
		echo := in.Services["echo"].Backends
		dir, err := os.MkdirTemp("", "sluice-churn-")
		if err != nil {
			return nil, err
		}
		defer os.RemoveAll(dir)
		topo := in.Topo
		probePort, err := topo.FreePort("tcp")
		if err != nil {
			return nil, err
		}
		loadPort, err := topo.FreePort("tcp")
		if err != nil {
			return nil, err
		}
		file := filepath.Join(dir, "services.yaml")
		write := func(probe netip.AddrPort) error {
			var m strings.Builder
			svc := func(name string, nodePort uint16, eps ...netip.AddrPort) {
				fmt.Fprintf(&m, "apiVersion: v1\nkind: Service\nmetadata: {name: %s, namespace: churn}\nspec:\n  type: NodePort\n  ports: [{name: p, port: 80, nodePort: %d}]\n---\n", name, nodePort)
				fmt.Fprintf(&m, "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: %s, namespace: churn, labels: {kubernetes.io/service-name: %s}}\naddressType: IPv4\nports: [{name: p, port: %d}]\nendpoints:\n", name, name, eps[0].Port())
				for _, e := range eps {
					fmt.Fprintf(&m, "- addresses: [%q]\n", e.Addr())
				}
				m.WriteString("---\n")
			}
			svc("probe", probePort, probe)
			svc("load", loadPort, echo[0])
			// The other services: no NodePort and no clusterIP, so they
			// cost the control plane (parse, build, diff) but no socket.
			for i := 0; i < n; i++ {
				fmt.Fprintf(&m, "apiVersion: v1\nkind: Service\nmetadata: {name: s%d, namespace: churn}\nspec:\n  ports: [{name: p, port: 80}]\n---\n", i)
				fmt.Fprintf(&m, "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: s%d, namespace: churn, labels: {kubernetes.io/service-name: s%d}}\naddressType: IPv4\nports: [{name: p, port: 8080}]\nendpoints: [{addresses: [\"10.%d.%d.1\"]}, {addresses: [\"10.%d.%d.2\"]}]\n---\n", i, i, i/250%250, i%250, i/250%250, i%250)
			}
			tmp := file + ".tmp"
			if err := os.WriteFile(tmp, []byte(m.String()), 0o644); err != nil {
				return err
			}
			return os.Rename(tmp, file)
		}
		if err := write(httpBackends[0]); err != nil {
			return nil, err
		}
		proc, err := StartProc("sluice-churn", -1, topo.InNode(sl.bin, "--manifests", dir, "--bind-address", topo.LB.String(), "--userspace-capture=none",
			"--healthz-bind-address=", "--metrics-bind-address=", "--manifest-coalesce", "1ms")...)
		if err != nil {
			return nil, err
		}
		defer proc.Stop(5 * time.Second)
		probe := fmt.Sprintf("http://%s/", netip.AddrPortFrom(topo.LB, probePort))
		client := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
		backendOf := func() string {
			resp, err := client.Get(probe)
			if err != nil {
				return ""
			}
			resp.Body.Close()
			return resp.Header.Get("X-Backend")
		}
		deadline := time.Now().Add(2 * time.Minute)
		for backendOf() != "0" {
			if exited, _ := proc.Exited(); exited || time.Now().After(deadline) {
				return nil, fmt.Errorf("sluice with %d services did not come up:\n%s", n, proc.Output())
			}
			time.Sleep(10 * time.Millisecond)
		}
		// Steady load on another service while the endpoints churn.
		var loadErrs atomic.Int64
		var loadMu sync.Mutex
		var loadLat []time.Duration
		stop := make(chan struct{})
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, 64)
			for {
				select {
				case <-stop:
					return
				default:
				}
				t := time.Now()
				if err := oneShot(netip.AddrPortFrom(topo.LB, loadPort).String(), buf, buf); err != nil {
					loadErrs.Add(1)
					continue
				}
				loadMu.Lock()
				loadLat = append(loadLat, time.Since(t))
				loadMu.Unlock()
			}
		}()
		flips := 3
		if sz.RRMessages > 5000 {
			flips = 6
		}
		var effect []time.Duration
		for i := 1; i <= flips && ctx.Err() == nil; i++ {
			want := fmt.Sprint(i % 2)
			t := time.Now()
			if err := write(httpBackends[i%2]); err != nil {
				return nil, err
			}
			for backendOf() != want {
				if time.Since(t) > time.Minute {
					close(stop)
					wg.Wait()
					return nil, fmt.Errorf("update %d never took effect with %d services", i, n)
				}
			}
			effect = append(effect, time.Since(t))
		}
		close(stop)
		wg.Wait()
		sort.Slice(effect, func(i, j int) bool { return effect[i] < effect[j] })
		sort.Slice(loadLat, func(i, j int) bool { return loadLat[i] < loadLat[j] })
		return Metrics{
			"update_p50_ms": float64(effect[len(effect)/2].Microseconds()) / 1e3,
			"update_max_ms": float64(effect[len(effect)-1].Microseconds()) / 1e3,
			"load_errors":   float64(loadErrs.Load()),
			"load_p99_us":   percentile(loadLat, 99),
		}, nil
	}
}
