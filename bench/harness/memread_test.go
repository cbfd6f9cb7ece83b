//go:build linux

package harness

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime"
	"testing"
)

// TestProcStatusReadsTheFieldsAsked checks the /proc/PID/status reading
// against this process: its resident memory is more than its anonymous
// part, which holds at least the heap this test makes.
func TestProcStatusReadsTheFieldsAsked(t *testing.T) {
	held := make([]byte, 64<<20)
	for i := range held {
		held[i] = 1 // touched, so resident
	}
	rss, peak := procMemMB(os.Getpid())
	anon := procAnonMB(os.Getpid())
	if anon < 64 || rss < anon || peak < rss {
		t.Fatalf("rss %.1f MiB, peak %.1f, anonymous %.1f: want anonymous at least the 64 MiB held, rss and peak above it", rss, peak, anon)
	}
	if got := procStatusMB(os.Getpid(), "NoSuchField:", "VmRSS:"); got[0] != 0 || got[1] < anon {
		t.Fatalf("procStatusMB = %v", got)
	}
	runtime.KeepAlive(held)
}

func TestReadGaugesTakesSingleSeriesGauges(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprint(w, "# TYPE go_memstats_heap_inuse_bytes gauge\ngo_memstats_heap_inuse_bytes 3.3e+07\n"+
			"# TYPE two gauge\ntwo{a=\"1\"} 1\ntwo{a=\"2\"} 2\n")
	}))
	defer srv.Close()
	g, err := readGauges(srv.URL, "go_memstats_heap_inuse_bytes", "two", "absent")
	if err != nil {
		t.Fatal(err)
	}
	if len(g) != 1 || g["go_memstats_heap_inuse_bytes"] != 3.3e7 {
		t.Fatalf("gauges %v: want only the single series", g)
	}
}
