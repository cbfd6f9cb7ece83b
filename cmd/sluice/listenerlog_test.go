package main

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"strings"
	"testing"

	"github.com/sluice-proxy/sluice/lb"
	"github.com/sluice-proxy/sluice/listeners"
)

// At start, a line per listener up to listenerLinesMax; past it one
// summary line at the default verbosity, and the per-listener lines only
// with --v=1 (at 10k Services those lines were what delayed the first
// update after start by tens of milliseconds).
func TestStartLogsListenersLineByLineOnlyUpToTheLimit(t *testing.T) {
	for _, tc := range []struct {
		ports         int
		debug         bool
		each, summary int
	}{
		{ports: 3, each: 3},
		{ports: listenerLinesMax, each: listenerLinesMax},
		{ports: listenerLinesMax + 1, summary: 1},
		{ports: listenerLinesMax + 1, debug: true, each: listenerLinesMax + 1, summary: 1},
	} {
		t.Run(fmt.Sprintf("%d ports, debug %v", tc.ports, tc.debug), func(t *testing.T) {
			srv := &listeners.Server{Engine: listeners.NewGoroutine(listeners.Options{}), BindAddress: netip.MustParseAddr("127.0.0.1"), Retry: lb.DefaultRetryPolicy()}
			defer srv.Close()
			ports := map[lb.ServicePortName]*lb.ServicePort{}
			for i := 0; i < tc.ports; i++ {
				name := lb.ServicePortName{Namespace: "ns", Name: fmt.Sprintf("s%d", i), Port: "p", Protocol: lb.TCP}
				ports[name] = &lb.ServicePort{Name: name, ClusterIPs: []netip.Addr{netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)})}, Port: 80,
					Endpoints: []lb.Endpoint{{Addr: lb.EndpointAddrOf(netip.MustParseAddrPort("127.0.0.1:1")), Ready: true, Serving: true}}}
			}
			if err := srv.Apply(lb.NewSnapshot(ports)); err != nil {
				t.Fatal(err)
			}
			level := slog.LevelInfo
			if tc.debug {
				level = slog.LevelDebug
			}
			var out bytes.Buffer
			n := logListeners(context.Background(), slog.New(slog.NewTextHandler(&out, &slog.HandlerOptions{Level: level})), srv)
			if n != tc.ports {
				t.Errorf("logListeners counted %d listeners, want %d", n, tc.ports)
			}
			each, summary := 0, 0
			for _, line := range strings.Split(out.String(), "\n") {
				switch {
				case strings.Contains(line, "msg=listening service="):
					each++
				case strings.Contains(line, fmt.Sprintf("msg=listening listeners=%d ", tc.ports)):
					summary++
				}
			}
			if each != tc.each || summary != tc.summary {
				t.Errorf("%d per-listener lines and %d summaries, want %d and %d:\n%s", each, summary, tc.each, tc.summary, out.String())
			}
		})
	}
}
