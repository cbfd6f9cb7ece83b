//go:build linux

package harness

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/sluice-proxy/sluice/controlplane/kube/kubetest"
)

func TestBeyondWatchComparesFlipByFlip(t *testing.T) {
	t0 := time.Unix(1000, 0)
	ms := time.Millisecond
	written := []writtenVersion{{"10", t0}, {"11", t0.Add(time.Second)}, {"12", t0.Add(2 * time.Second)}}
	seen := map[string]time.Time{
		"10": t0.Add(7 * ms),               // watch 7 ms
		"11": t0.Add(time.Second + 20*ms),  // 20 ms
		"12": t0.Add(2*time.Second + 5*ms), // 5 ms
		"9":  t0.Add(-time.Second),         // an older version: ignored
	}
	// The slowest effect came with the slowest watch: 21 - 20 = 1 ms
	// beyond it; the fastest watch had the most beyond it (9 - 5).
	effects := []time.Duration{10 * ms, 21 * ms, 9 * ms}
	// The proxy's own stamps: 1, 0.5 and 3 ms after the watch's arrival.
	applied := []time.Time{t0.Add(8 * ms), t0.Add(time.Second + 20*ms + ms/2), t0.Add(2*time.Second + 8*ms)}
	m := Metrics{}
	if err := beyondWatch(m, written, effects, applied, seen); err != nil {
		t.Fatal(err)
	}
	for k, want := range map[string]float64{"api_watch_p50_ms": 7, "api_watch_max_ms": 20,
		"beyond_watch_p50_ms": 3, "beyond_watch_max_ms": 4, "applied_beyond_watch_p50_ms": 1, "applied_beyond_watch_max_ms": 3} {
		if m[k] != want {
			t.Errorf("%s = %v, want %v", k, m[k], want)
		}
	}
	m = Metrics{}
	if err := beyondWatch(m, written, effects, nil, seen); err != nil {
		t.Fatal(err)
	}
	if _, ok := m["applied_beyond_watch_max_ms"]; ok {
		t.Error("no stamps, yet a figure from them")
	}
	if err := beyondWatch(Metrics{}, written, effects, applied[:2], seen); err == nil {
		t.Error("fewer stamps than writes: no error")
	}
	delete(seen, "11")
	if err := beyondWatch(Metrics{}, written, effects, nil, seen); err == nil || !strings.Contains(err.Error(), "write 2") {
		t.Errorf("a write the watch never saw: err = %v, want one naming write 2", err)
	}
	if err := beyondWatch(Metrics{}, written, effects[:2], nil, seen); err == nil {
		t.Error("fewer effects than writes: no error")
	}
}

// The proxy's last-sync stamp is read from its metrics by name, and only
// once it is after the write (the probe can see a flip before the stamp
// that follows the apply); a stamp that never comes is an error, and a
// server that writes every family whatever is asked is not used per flip.
func TestLastSyncStampIsReadByNameAfterTheWrite(t *testing.T) {
	reg := prometheus.NewRegistry()
	last := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: lastSyncName}, []string{"ip_family"})
	other := prometheus.NewGauge(prometheus.GaugeOpts{Name: "sluice_other"})
	reg.MustRegister(last, other)
	t0 := time.Unix(1_700_000_000, 250_000_000)
	last.WithLabelValues("").Set(float64(t0.UnixNano()) / 1e9)
	all := promhttp.HandlerFor(reg, promhttp.HandlerOpts{})
	var reads atomic.Int32
	byName := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := reads.Add(1)
		if r.URL.Query().Get("name[]") != lastSyncName {
			all.ServeHTTP(w, r)
			return
		}
		// The stamp of the write's apply lands before the third read.
		stamp := t0
		if n >= 3 {
			stamp = t0.Add(time.Second)
		}
		fmt.Fprintf(w, "# TYPE %s gauge\n%s{ip_family=\"\"} %s\n", lastSyncName, lastSyncName, strconv.FormatFloat(float64(stamp.UnixNano())/1e9, 'g', -1, 64))
	}))
	defer byName.Close()
	if ok, err := servesByName(byName.URL); !ok || err != nil {
		t.Errorf("a server that filters by name: %v, %v", ok, err)
	}
	whole := httptest.NewServer(all)
	defer whole.Close()
	if ok, err := servesByName(whole.URL); ok || err != nil {
		t.Errorf("a server that writes every family: %v, %v", ok, err)
	}
	reads.Store(1)
	at, err := lastSyncAfter(byName.URL, t0.Add(time.Millisecond), time.Minute)
	if err != nil || reads.Load() != 3 || at.Sub(t0.Add(time.Second)).Abs() > time.Microsecond {
		t.Errorf("stamp %v (%v) after %d reads, want %v after 3", at, err, reads.Load(), t0.Add(time.Second))
	}
	if _, err := lastSyncAfter(whole.URL, t0.Add(time.Hour), 0); err == nil || !strings.Contains(err.Error(), lastSyncName) {
		t.Errorf("a stamp that never comes: %v", err)
	}
}

// TestBareWatchSeesEachWrite runs the churn's bare watch against a real
// kube-apiserver: every update of the probe's slice arrives, under the
// version the update returned, after the write began.
func TestBareWatchSeesEachWrite(t *testing.T) {
	cluster := kubetest.Start(t)
	rc, err := clientcmd.BuildConfigFromFlags("", cluster.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	client := kubernetes.NewForConfigOrDie(rc)
	ctx := context.Background()
	ep := func(i int) netip.AddrPort { return netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 0, 0, byte(i)}), 80) }
	if _, err := client.DiscoveryV1().EndpointSlices(apiChurnNamespace).Create(ctx, slice("probe", "uid-1", ep(1)), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	bare, err := watchArrivals(ctx, client, "probe")
	if err != nil {
		t.Fatal(err)
	}
	defer bare.stop()
	var written []writtenVersion
	for i := 2; i <= 4; i++ {
		sl := slice("probe", "uid-1", ep(i))
		sl.Annotations = map[string]string{corev1.EndpointsLastChangeTriggerTime: time.Now().Format(time.RFC3339Nano)}
		at := time.Now()
		got, err := client.DiscoveryV1().EndpointSlices(apiChurnNamespace).Update(ctx, sl, metav1.UpdateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		written = append(written, writtenVersion{got.ResourceVersion, at})
	}
	seen := bare.arrivals(len(written), time.Minute)
	if len(seen) != len(written) {
		t.Fatalf("the watch saw %d versions, want exactly the %d written after it opened: %v", len(seen), len(written), seen)
	}
	m := Metrics{}
	if err := beyondWatch(m, written, []time.Duration{time.Minute, time.Minute, time.Minute}, nil, seen); err != nil {
		t.Fatal(err)
	}
	if w := m["api_watch_max_ms"]; !(w > 0 && w < 60e3) {
		t.Errorf("watch latency %v ms: want after the write and before the effects", w)
	}
}

// The steady flips' figures are theirs alone: their own share read as
// what the histogram counted while they ran, and how far beyond the
// watch their effects came, their writes paired with theirs.
func TestSteadyFlipsCountOnlyTheirOwn(t *testing.T) {
	reg := prometheus.NewRegistry()
	h := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "sluice_update_apply_seconds", Buckets: []float64{0.0004, 0.0008, 0.001, 0.0016}})
	reg.MustRegister(h)
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer srv.Close()
	for range 50 {
		h.Observe(0.0015) // the start-up flips: slow
	}
	t0 := time.Unix(1000, 0)
	ms := time.Millisecond
	seen := map[string]time.Time{"1": t0, "2": t0.Add(3 * ms), "3": t0.Add(time.Second + 2*ms)}
	run := func() (Metrics, []writtenVersion, []time.Duration, []time.Time, error) {
		for range 10 {
			h.Observe(0.0003)
		}
		return Metrics{"update_p50_ms": 3, "update_max_ms": 4}, []writtenVersion{{"2", t0}, {"3", t0.Add(time.Second)}}, []time.Duration{4 * ms, 3 * ms},
			[]time.Time{t0.Add(3*ms + ms/2), t0.Add(time.Second + 3*ms)}, nil
	}
	var asked int
	m := Metrics{}
	if err := steadyFlips(m, srv.URL, run, func(n int) map[string]time.Time { asked = n; return seen }, 1); err != nil {
		t.Fatal(err)
	}
	if asked != 3 {
		t.Errorf("waited for %d versions, want 3 (1 before, 2 steady)", asked)
	}
	for k, want := range map[string]float64{"steady_own_share_p99_le_ms": 0.4, "steady_update_max_ms": 4, "steady_beyond_watch_max_ms": 1, "steady_applied_beyond_watch_max_ms": 1} {
		if got := m[k]; math.Abs(got-want) > 1e-9 {
			t.Errorf("%s = %v, want %v", k, got, want)
		}
	}
	if got := m["steady_own_share_mean_ms"]; math.Abs(got-0.3) > 1e-9 {
		t.Errorf("steady_own_share_mean_ms = %v, want 0.3", got)
	}
}
