package admin

import (
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"
)

// getAccepting is a GET of path with the given Accept header ("": none).
func getAccepting(h http.Handler, path, accept string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(http.MethodGet, path, nil)
	if accept != "" {
		req.Header.Set("Accept", accept)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

// /flagz and /statusz answer only when given, and, as kube-proxy's, only
// a request that takes text/plain (with no parameter but charset=utf-8):
// anything else, no Accept header included, gets 406.
func TestZPagesAnswerOnlyRequestsForPlainText(t *testing.T) {
	none := (&Endpoints{Health: NewHealth(time.Minute, time.Now), Metrics: NewMetrics()}).MetricsHandler()
	for _, path := range []string{"/flagz", "/statusz"} {
		if rec := getAccepting(none, path, "text/plain"); rec.Code != http.StatusNotFound {
			t.Fatalf("%s not enabled: %d", path, rec.Code)
		}
	}
	h := (&Endpoints{Health: NewHealth(time.Minute, time.Now), Metrics: NewMetrics(),
		Flagz: map[string]string{"v": "2"}, Statusz: &Statusz{Started: time.Now(), GoVersion: "go1.26", BinaryVersion: "v1"}}).MetricsHandler()
	for accept, want := range map[string]int{
		"": 406, "application/json": 406, "text/html": 406, "text/plain;charset=latin1": 406, "text/plain; format=x": 406,
		"text/plain": 200, "*/*": 200, "*": 200, "text/*;q=0.5": 200, "text/plain; charset=UTF-8": 200, "text/html, text/plain;q=0.1": 200,
	} {
		for _, path := range []string{"/flagz", "/statusz"} {
			rec := getAccepting(h, path, accept)
			if rec.Code != want {
				t.Errorf("%s with Accept %q: %d, want %d", path, accept, rec.Code, want)
			}
			if want == 406 && rec.Body.String() != "media type not acceptable, must be: text/plain\n" {
				t.Errorf("%s with Accept %q: %q", path, accept, rec.Body.String())
			}
			if want == 200 && rec.Header().Get("Content-Type") != "text/plain; charset=utf-8" {
				t.Errorf("%s: Content-Type %q", path, rec.Header().Get("Content-Type"))
			}
		}
	}
}

// /flagz lists every flag, sorted, under kube-proxy's title and warning,
// with one delimiter (of kube-proxy's four) for the process's life.
func TestFlagzListsEveryFlagSorted(t *testing.T) {
	h := (&Endpoints{Health: NewHealth(time.Minute, time.Now), Metrics: NewMetrics(),
		Flagz: map[string]string{"v": "2", "bind-address": "0.0.0.0", "proxy-mode": "userspace", "feature-gates": "ComponentFlagz=true"}}).MetricsHandler()
	first := getAccepting(h, "/flagz", "text/plain").Body.String()
	head := "\nkube-proxy flags\nWarning: This endpoint is not meant to be machine parseable, has no formatting compatibility guarantees and is for debugging purposes only.\n\n"
	body, ok := strings.CutPrefix(first, head)
	if !ok {
		t.Fatalf("/flagz does not open as kube-proxy's:\n%q", first)
	}
	m := regexp.MustCompile(`\Abind-address(:|: |=| )0\.0\.0\.0\n`).FindStringSubmatch(body)
	if m == nil {
		t.Fatalf("/flagz's first line:\n%s", body)
	}
	d := m[1]
	if want := "bind-address" + d + "0.0.0.0\nfeature-gates" + d + "ComponentFlagz=true\nproxy-mode" + d + "userspace\nv" + d + "2\n"; body != want {
		t.Fatalf("/flagz:\n%q\nwant\n%q", body, want)
	}
	for i := 0; i < 8; i++ {
		if again := getAccepting(h, "/flagz", "*/*").Body.String(); again != first {
			t.Fatalf("/flagz changed between requests:\n%q\n%q", first, again)
		}
	}
}

// /statusz gives the start, the uptime and the versions in kube-proxy's
// lines; the emulation version's line only when there is one.
func TestStatuszGivesStartUptimeAndVersions(t *testing.T) {
	started := time.Date(2026, 12, 7, 10, 0, 0, 0, time.UTC)
	s := &Statusz{Started: started, GoVersion: "go1.26.8", BinaryVersion: "v0.1.0", EmulationVersion: "1.34",
		Now: func() time.Time {
			return started.Add(26*time.Hour + 2*time.Minute + 3*time.Second + 500*time.Millisecond)
		}}
	h := (&Endpoints{Health: NewHealth(time.Minute, time.Now), Metrics: NewMetrics(), Statusz: s}).MetricsHandler()
	page := func() string { return getAccepting(h, "/statusz", "text/plain").Body.String() }
	re := regexp.MustCompile(`\A\nkube-proxy statusz\nWarning: This endpoint is not meant to be machine parseable, has no formatting compatibility guarantees and is for debugging purposes only\.\n\n` +
		`Started(:|: |=| ) Mon Dec  7 10:00:00 UTC 2026\nUp(:|: |=| ) 26 hr 02 min 03 sec\nGo version(:|: |=| ) go1\.26\.8\nBinary version(:|: |=| ) v0\.1\.0\nEmulation version(:|: |=| ) 1\.34\n\n\z`)
	got := page()
	m := re.FindStringSubmatch(got)
	if m == nil {
		t.Fatalf("/statusz:\n%q", got)
	}
	for _, d := range m[2:] {
		if d != m[1] {
			t.Fatalf("/statusz mixes delimiters: %q", got)
		}
	}
	s.EmulationVersion = ""
	if got := page(); strings.Contains(got, "Emulation") || !strings.HasSuffix(got, " v0.1.0\n\n\n") {
		t.Fatalf("/statusz with no emulation version:\n%q", got)
	}
}
