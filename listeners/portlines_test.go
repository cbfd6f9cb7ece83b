package listeners

import (
	"bytes"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/sluice-proxy/sluice/lb"
)

// An Apply that opens or removes more service ports than portLinesMax
// logs a line for each of the first ones, and one summary line for the
// rest, whose own lines are there at debug level (--v=1).
func TestApplyLogsPortLinesUpToTheLimit(t *testing.T) {
	for _, debug := range []bool{false, true} {
		t.Run(fmt.Sprintf("debug=%v", debug), func(t *testing.T) {
			var logs bytes.Buffer // Apply logs on its own goroutine
			level := slog.LevelInfo
			if debug {
				level = slog.LevelDebug
			}
			srv := &Server{Engine: NewGoroutine(Options{}), Retry: lb.DefaultRetryPolicy(),
				Log: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: level}))}
			defer srv.Close()
			const n = portLinesMax + 36
			ports := make(map[lb.ServicePortName]*lb.ServicePort, n)
			for i := range n {
				name := lb.ServicePortName{Namespace: "ns", Name: fmt.Sprintf("s%03d", i), Port: "p", Protocol: lb.TCP}
				ports[name] = &lb.ServicePort{Name: name, Port: 80}
			}
			if err := srv.Apply(lb.NewSnapshot(ports)); err != nil {
				t.Fatal(err)
			}
			out := logs.String()
			info := strings.Count(out, `level=INFO msg="service port listening"`)
			dbg := strings.Count(out, `level=DEBUG msg="service port listening"`)
			wantDebug := 0
			if debug {
				wantDebug = n - portLinesMax
			}
			if info != portLinesMax || dbg != wantDebug {
				t.Errorf("%d lines at info and %d at debug, want %d and %d:\n%s", info, dbg, portLinesMax, wantDebug, out)
			}
			if !strings.Contains(out, `msg="more service ports changed; each logged with --v=1" lines=36 "service port listening"=36`) {
				t.Errorf("no summary line of the other 36:\n%s", out)
			}
			// A small change logs its own line and no summary.
			logs.Reset()
			delete(ports, lb.ServicePortName{Namespace: "ns", Name: "s000", Port: "p", Protocol: lb.TCP})
			if err := srv.Apply(lb.NewSnapshot(ports)); err != nil {
				t.Fatal(err)
			}
			out = logs.String()
			if strings.Count(out, `level=INFO msg="service port removed" service=ns/s000:p`) != 1 || strings.Contains(out, "more service ports") {
				t.Errorf("a one-port removal logged:\n%s", out)
			}
		})
	}
}
