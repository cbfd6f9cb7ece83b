// Package admin owns the process's operational endpoints: /healthz and
// /livez with kube-proxy's semantics, Prometheus /metrics with kube-proxy's
// metric names where they apply plus sluice's per-service data-path
// counters, /proxyMode, /debug/pprof when profiling is on, and a debug dump
// of what is being served.
package admin

import (
	"encoding/json"
	"net/http"
	"sync"
	"time"
)

// Health tracks whether applied state is fresh, as kube-proxy's
// ProxyHealthServer does: unhealthy while a queued update has waited longer
// than the timeout. Unlike kube-proxy v1.34, which is healthy from the start,
// it is also unhealthy until the first update has been applied.
type Health struct {
	now     func() time.Time
	timeout time.Duration

	mu             sync.Mutex
	lastUpdated    time.Time
	oldestPending  time.Time
	nodeIneligible bool
	nodeZone       string
	unserved       int
	// behind are the families a sync left behind while the others caught
	// up (Behind), each with the oldest change it waits for, and
	// familyUpdated when each was last up to date.
	behind, familyUpdated map[string]time.Time
}

// SetUnserved records how many listeners the applied state asks for that
// are not open (userspace mode). While any is missing the data plane does
// not match the state, and /healthz answers 503.
func (h *Health) SetUnserved(n int) {
	h.mu.Lock()
	h.unserved = n
	h.mu.Unlock()
}

// SetNodeEligible records whether this node may take traffic: false once
// its Node object is being deleted or is tainted for deletion by the
// cluster autoscaler. /healthz then answers 503 (kube-proxy's nodeEligible).
func (h *Health) SetNodeEligible(ok bool) {
	h.mu.Lock()
	h.nodeIneligible = !ok
	h.mu.Unlock()
}

// SetNodeZone records the zone this node's topology hints are read for:
// its Node's topology.kubernetes.io/zone label ("" without one).
func (h *Health) SetNodeZone(zone string) {
	h.mu.Lock()
	h.nodeZone = zone
	h.mu.Unlock()
}

// NodeView is what the sources said of this node's Node object, for
// `sluice status`.
type NodeView struct {
	Name string `json:"name"`
	// Zone is the zone its topology hints are read for ("": none, so zone
	// hints are not followed).
	Zone string `json:"zone"`
	// Eligible is false while its Node is being deleted or tainted for
	// deletion; /healthz then answers 503.
	Eligible bool `json:"eligible"`
}

// Node is this node's view, named name.
func (h *Health) Node(name string) NodeView {
	h.mu.Lock()
	defer h.mu.Unlock()
	return NodeView{Name: name, Zone: h.nodeZone, Eligible: !h.nodeIneligible}
}

// NewHealth returns a tracker; kube-proxy uses twice the sync period as timeout.
func NewHealth(timeout time.Duration, now func() time.Time) *Health {
	if now == nil {
		now = time.Now
	}
	return &Health{now: now, timeout: timeout}
}

// QueuedUpdate records that a change is waiting to be applied.
func (h *Health) QueuedUpdate() {
	h.mu.Lock()
	if h.oldestPending.IsZero() {
		h.oldestPending = h.now()
	}
	h.mu.Unlock()
}

// Updated records that every queued change has been processed.
func (h *Health) Updated() {
	h.mu.Lock()
	h.lastUpdated = h.now()
	h.oldestPending = time.Time{}
	clear(h.behind)
	clear(h.familyUpdated)
	h.mu.Unlock()
}

// Behind records that a sync processed every queued change for all the
// IP families but failed, which still wait for them: as kube-proxy's
// proxier of each family marks its own health updated, a family whose
// rules could not be written turns unhealthy once the oldest change it
// waits for is older than the timeout, and the others stay healthy.
func (h *Health) Behind(failed ...string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	now := h.now()
	since := h.oldestPending
	if since.IsZero() {
		since = now
	}
	if h.behind == nil {
		h.behind, h.familyUpdated = map[string]time.Time{}, map[string]time.Time{}
	}
	for _, f := range failed {
		if _, ok := h.behind[f]; !ok {
			h.behind[f], h.familyUpdated[f] = since, h.lastUpdated
		}
	}
	h.lastUpdated = now
	h.oldestPending = time.Time{}
}

// familyHealthy reports whether family f is healthy at now, and when it
// was last up to date (last, unless a sync left it behind); h.mu held.
func (h *Health) familyHealthy(f string, now, last time.Time) (bool, time.Time) {
	if t, behind := h.behind[f]; behind {
		return h.wholeLocked(now) && now.Sub(t) < h.timeout, h.familyUpdated[f]
	}
	return h.wholeLocked(now), last
}

// wholeLocked reports whether the state is healthy at now but for the
// families a sync left behind: updated once, every listener open, and no
// change all families wait for older than the timeout (h.mu held).
func (h *Health) wholeLocked(now time.Time) bool {
	return !h.lastUpdated.IsZero() && h.unserved == 0 && (h.oldestPending.IsZero() || now.Sub(h.oldestPending) < h.timeout)
}

// Healthy reports health and the times kube-proxy puts in its body.
func (h *Health) Healthy() (ok bool, lastUpdated, now time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	now = h.now()
	if !h.wholeLocked(now) {
		return false, h.lastUpdated, now
	}
	for _, t := range h.behind {
		if now.Sub(t) >= h.timeout {
			return false, h.lastUpdated, now
		}
	}
	return true, now, now
}

// healthBody is kube-proxy v1.34's /healthz and /livez body: the times
// as JSON times (RFC 3339), whether the proxy is healthy, and the same per
// IP family it serves.
type healthBody struct {
	LastUpdated  time.Time               `json:"lastUpdated"`
	CurrentTime  time.Time               `json:"currentTime"`
	NodeEligible *bool                   `json:"nodeEligible,omitempty"`
	Healthy      bool                    `json:"healthy"`
	Status       map[string]familyHealth `json:"status"`
}

type familyHealth struct {
	LastUpdated time.Time `json:"lastUpdated"`
	Healthy     bool      `json:"healthy"`
}

// handler serves /healthz (with nodeEligible) or /livez (without), with
// a status for each of families: a family a sync left behind (Behind)
// has its own, the others share the whole state's.
func (h *Health) handler(withNode bool, families []string, count func(code int)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		ok, last, now := h.Healthy()
		body := healthBody{LastUpdated: last, CurrentTime: now, Healthy: ok, Status: map[string]familyHealth{}}
		h.mu.Lock()
		for _, f := range families {
			fok, flast := h.familyHealthy(f, now, last)
			body.Status[f] = familyHealth{LastUpdated: flast, Healthy: fok}
		}
		eligible := !h.nodeIneligible
		h.mu.Unlock()
		if withNode {
			body.NodeEligible = &eligible
			ok = ok && eligible
		}
		code := http.StatusOK
		if !ok {
			code = http.StatusServiceUnavailable
		}
		count(code)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		w.WriteHeader(code)
		json.NewEncoder(w).Encode(body)
	})
}
