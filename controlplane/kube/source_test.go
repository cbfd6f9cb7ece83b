package kube

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/sluice-proxy/sluice/controlplane"
	"github.com/sluice-proxy/sluice/lb"
)

// sink records what the source decides, as events the test waits on.
type sink struct {
	snaps     chan *lb.Snapshot
	unchanged chan struct{}
	queued    chan struct{}
}

func newSink() *sink {
	return &sink{snaps: make(chan *lb.Snapshot, 100), unchanged: make(chan struct{}, 100), queued: make(chan struct{}, 100)}
}

func (s *sink) Publish(snap *lb.Snapshot) { s.snaps <- snap }
func (s *sink) Unchanged()                { s.unchanged <- struct{}{} }
func (s *sink) Reject(error) {
	panic("the API source skips bad objects; it never rejects a whole update")
}
func (s *sink) Queued() { s.queued <- struct{}{} }

func (s *sink) next(t *testing.T) *lb.Snapshot {
	t.Helper()
	select {
	case snap := <-s.snaps:
		return snap
	case <-time.After(10 * time.Second):
		t.Fatal("no snapshot published")
		return nil
	}
}

// until returns the first published snapshot that satisfies ok.
func (s *sink) until(t *testing.T, what string, ok func(*lb.Snapshot) bool) *lb.Snapshot {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		select {
		case snap := <-s.snaps:
			if ok(snap) {
				return snap
			}
		case <-deadline:
			t.Fatalf("no snapshot where %s", what)
			return nil
		}
	}
}

func ptr[T any](v T) *T { return &v }

func service(name string, mut ...func(*corev1.Service)) *corev1.Service {
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP, ClusterIP: "10.96.0.10", ClusterIPs: []string{"10.96.0.10"},
			Ports: []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}}},
	}
	for _, m := range mut {
		m(svc)
	}
	return svc
}

type ep struct {
	ip                          string
	node                        string
	ready, serving, terminating bool
}

func slice(svc, name string, af discoveryv1.AddressType, eps ...ep) *discoveryv1.EndpointSlice {
	sl := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "default", Name: name, Labels: map[string]string{discoveryv1.LabelServiceName: svc}},
		AddressType: af,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr("http"), Port: ptr(int32(8080)), Protocol: ptr(corev1.ProtocolTCP)}},
	}
	for _, e := range eps {
		sl.Endpoints = append(sl.Endpoints, discoveryv1.Endpoint{Addresses: []string{e.ip}, NodeName: ptr(e.node),
			Conditions: discoveryv1.EndpointConditions{Ready: ptr(e.ready), Serving: ptr(e.serving), Terminating: ptr(e.terminating)}})
	}
	return sl
}

func ready(ip, node string) ep { return ep{ip: ip, node: node, ready: true, serving: true} }

func run(t *testing.T, src *Source) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- src.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
}

func port(snap *lb.Snapshot, svc, name string) *lb.ServicePort {
	return snap.Ports.Get(lb.ServicePortName{Namespace: "default", Name: svc, Port: name, Protocol: lb.TCP})
}

func addrs(list []netip.AddrPort) []string {
	var out []string
	for _, a := range list {
		out = append(out, a.String())
	}
	return out
}

func TestFirstSnapshotHasTheInitialListsAndSkipsWhatKubeProxySkips(t *testing.T) {
	client := fake.NewClientset(
		service("web"),
		service("ext", func(s *corev1.Service) {
			s.Spec.Type = corev1.ServiceTypeExternalName
			s.Spec.ClusterIP, s.Spec.ClusterIPs = "", nil
		}),
		service("headless", func(s *corev1.Service) { s.Spec.ClusterIP, s.Spec.ClusterIPs = "None", []string{"None"} }),
		service("noip", func(s *corev1.Service) { s.Spec.ClusterIP, s.Spec.ClusterIPs = "", nil }),
		slice("web", "web-a", discoveryv1.AddressTypeIPv4, ready("10.244.0.2", "n1")),
		slice("web", "web-b", discoveryv1.AddressTypeIPv4, ready("10.244.0.1", "n2"), ep{ip: "10.244.0.3", node: "n1"}),
	)
	s := newSink()
	run(t, &Source{Client: client, Sink: s, NodeName: "n1"})
	snap := s.next(t)
	if snap.Ports.Len() != 1 {
		t.Fatalf("ports = %v, want only default/web:http", snap.Ports)
	}
	sp := port(snap, "web", "http")
	if sp == nil || len(sp.Endpoints) != 3 {
		t.Fatalf("web: %+v", sp)
	}
	// Both slices merged, sorted by address, not-ready kept but unusable.
	if got := addrs(sp.Usable()); !slices.Equal(got, []string{"10.244.0.1:8080", "10.244.0.2:8080"}) {
		t.Fatalf("usable = %v", got)
	}
	if !sp.Endpoints[1].Local || sp.Endpoints[0].Local {
		t.Fatalf("locality: %+v", sp.Endpoints)
	}
}

func TestChangesFollowOneServiceAtATime(t *testing.T) {
	client := fake.NewClientset(service("web"), slice("web", "web-a", discoveryv1.AddressTypeIPv4, ready("10.244.0.1", "n1")))
	s := newSink()
	run(t, &Source{Client: client, Sink: s})
	first := s.next(t)
	ctx := context.Background()

	// A second Service arrives before its slice, then the slice.
	if _, err := client.CoreV1().Services("default").Create(ctx, service("api", func(s *corev1.Service) { s.Spec.ClusterIP, s.Spec.ClusterIPs = "10.96.0.11", []string{"10.96.0.11"} }), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	snap := s.until(t, "api appears", func(sn *lb.Snapshot) bool { return port(sn, "api", "http") != nil })
	if port(snap, "web", "http") != port(first, "web", "http") {
		t.Fatal("an unrelated change rebuilt web's service port")
	}
	if _, err := client.DiscoveryV1().EndpointSlices("default").Create(ctx, slice("api", "api-a", discoveryv1.AddressTypeIPv4, ready("10.244.1.1", "n1")), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	s.until(t, "api has an endpoint", func(sn *lb.Snapshot) bool { sp := port(sn, "api", "http"); return sp != nil && len(sp.Usable()) == 1 })

	// All endpoints go terminating but still serving: kube-proxy's fallback.
	if _, err := client.DiscoveryV1().EndpointSlices("default").Update(ctx, slice("api", "api-a", discoveryv1.AddressTypeIPv4,
		ep{ip: "10.244.1.1", node: "n1", serving: true, terminating: true}, ep{ip: "10.244.1.2", node: "n1", terminating: true}), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	snap = s.until(t, "api has two endpoints", func(sn *lb.Snapshot) bool { sp := port(sn, "api", "http"); return sp != nil && len(sp.Endpoints) == 2 })
	if got := addrs(port(snap, "api", "http").Usable()); !slices.Equal(got, []string{"10.244.1.1:8080"}) {
		t.Fatalf("fallback usable = %v, want the serving terminating one", got)
	}

	if err := client.CoreV1().Services("default").Delete(ctx, "api", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	s.until(t, "api is gone", func(sn *lb.Snapshot) bool { return port(sn, "api", "http") == nil && port(sn, "web", "http") != nil })
}

func TestBadObjectsAreSkippedAndReportedOnce(t *testing.T) {
	client := fake.NewClientset(service("web"), slice("web", "web-a", discoveryv1.AddressTypeIPv4, ready("10.244.0.1", "n1")),
		// A slice whose Service does not exist, and a bad Service.
		slice("ghost", "ghost-a", discoveryv1.AddressTypeIPv4, ready("10.244.9.9", "n1")),
		service("bad", func(s *corev1.Service) {
			s.Spec.ClusterIP, s.Spec.ClusterIPs = "10.96.0.12", []string{"10.96.0.12"}
			s.Spec.SessionAffinity = "Sticky"
		}),
	)
	var mu sync.Mutex
	var skipped []string
	s := newSink()
	run(t, &Source{Client: client, Sink: s, Skipped: func(err error) {
		mu.Lock()
		skipped = append(skipped, err.Error())
		mu.Unlock()
	}})
	snap := s.next(t)
	if snap.Ports.Len() != 1 || port(snap, "web", "http") == nil {
		t.Fatalf("ports = %v, want web only", snap.Ports)
	}
	mu.Lock()
	got := strings.Join(skipped, "\n")
	n := len(skipped)
	mu.Unlock()
	for _, want := range []string{`EndpointSlice default/ghost-a`, `Service default/ghost is not found`, `Service default/bad`, `spec.sessionAffinity`, `"Sticky"`} {
		if !strings.Contains(got, want) {
			t.Errorf("skipped reports %q, want it to name %s", got, want)
		}
	}
	// A change elsewhere does not report them again.
	if _, err := client.DiscoveryV1().EndpointSlices("default").Update(context.Background(), slice("web", "web-a", discoveryv1.AddressTypeIPv4, ready("10.244.0.1", "n1"), ready("10.244.0.2", "n1")), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	s.until(t, "web has two endpoints", func(sn *lb.Snapshot) bool { return len(port(sn, "web", "http").Endpoints) == 2 })
	mu.Lock()
	defer mu.Unlock()
	if len(skipped) != n {
		t.Fatalf("bad objects reported again: %v", skipped[n:])
	}
}

func TestTrafficPoliciesAndDualStack(t *testing.T) {
	client := fake.NewClientset(
		service("web", func(s *corev1.Service) {
			s.Spec.Type = corev1.ServiceTypeNodePort
			s.Spec.Ports[0].NodePort = 30080
			s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
			s.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol}
			s.Spec.ClusterIPs = []string{"10.96.0.10", "fd00:96::10"}
		}),
		slice("web", "web-v4", discoveryv1.AddressTypeIPv4, ready("10.244.0.1", "n1"), ready("10.244.0.2", "n2")),
		slice("web", "web-v6", discoveryv1.AddressTypeIPv6, ready("fd00:244::1", "n2")),
	)
	s := newSink()
	run(t, &Source{Client: client, Sink: s, NodeName: "n1"})
	sp := port(s.next(t), "web", "http")
	if sp == nil || len(sp.ClusterIPs) != 2 || !sp.ClusterIPs[1].Is6() {
		t.Fatalf("dual-stack ClusterIPs: %+v", sp)
	}
	if got := addrs(sp.Usable()); len(got) != 3 {
		t.Fatalf("cluster traffic usable = %v, want all three (both families)", got)
	}
	if got := addrs(sp.UsableExternal()); !slices.Equal(got, []string{"10.244.0.1:8080"}) {
		t.Fatalf("external traffic (ETP Local) usable = %v, want only this node's", got)
	}
	if !sp.SplitPolicy() {
		t.Fatal("ETP Local with ITP Cluster must split the pickers")
	}
}

// The Node's eligibility and zone are told on each of its events (for
// /healthz and `sluice status`).
func TestNodeEligibility(t *testing.T) {
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}
	client := fake.NewClientset(node)
	got, zones := make(chan bool, 10), make(chan string, 10)
	s := newSink()
	run(t, &Source{Client: client, Sink: s, NodeName: "n1", NodeEligible: func(ok bool) { got <- ok }, NodeZone: func(z string) { zones <- z }})
	s.next(t)
	if ok, zone := <-got, <-zones; !ok || zone != "" {
		t.Fatalf("a plain node: eligible %v, zone %q; want eligible, no zone", ok, zone)
	}
	node.Spec.Taints = []corev1.Taint{{Key: TaintToBeDeleted, Effect: corev1.TaintEffectNoSchedule}}
	node.Labels = map[string]string{corev1.LabelTopologyZone: "zone-b"}
	if _, err := client.CoreV1().Nodes().Update(context.Background(), node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if ok, zone := <-got, <-zones; ok || zone != "zone-b" {
		t.Fatalf("a node tainted ToBeDeletedByClusterAutoscaler in zone-b: eligible %v, zone %q", ok, zone)
	}
}

// The bounded-frequency rule: a change right after a build waits out
// MinSyncPeriod, collecting what else arrives into one build.
func TestMinSyncPeriodCoalesces(t *testing.T) {
	client := fake.NewClientset(service("web"))
	timers := make(chan chan time.Time, 1)
	now := time.Unix(1000, 0)
	var mu sync.Mutex
	s := newSink()
	run(t, &Source{Client: client, Sink: s, MinSyncPeriod: time.Second,
		Now: func() time.Time { mu.Lock(); defer mu.Unlock(); return now },
		After: func(d time.Duration) <-chan time.Time {
			if d <= 0 || d > time.Second {
				t.Errorf("wait %v, want (0, 1s]", d)
			}
			c := make(chan time.Time, 1)
			timers <- c
			return c
		}})
	s.next(t)
	ctx := context.Background()
	if _, err := client.DiscoveryV1().EndpointSlices("default").Create(ctx, slice("web", "w1", discoveryv1.AddressTypeIPv4, ready("10.244.0.1", "n1")), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	timer := <-timers // the build is held back
	if _, err := client.DiscoveryV1().EndpointSlices("default").Create(ctx, slice("web", "w2", discoveryv1.AddressTypeIPv4, ready("10.244.0.2", "n1")), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	select {
	case snap := <-s.snaps:
		t.Fatalf("published before MinSyncPeriod passed: %v", snap.Ports)
	default:
	}
	// Wait until the second slice is queued (the Service, w1, w2), then
	// let the timer fire.
	for i := 0; i < 3; i++ {
		select {
		case <-s.queued:
		case <-time.After(10 * time.Second):
			t.Fatal("second slice never queued")
		}
	}
	mu.Lock()
	now = now.Add(time.Second)
	mu.Unlock()
	timer <- now
	snap := s.next(t)
	if n := len(port(snap, "web", "http").Endpoints); n != 2 {
		t.Fatalf("one build should carry both slices, got %d endpoints", n)
	}
	// Long after the last build, a change is built at once: no timer.
	mu.Lock()
	now = now.Add(time.Minute)
	mu.Unlock()
	if err := client.DiscoveryV1().EndpointSlices("default").Delete(ctx, "w2", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	snap = s.next(t)
	if n := len(port(snap, "web", "http").Endpoints); n != 1 {
		t.Fatalf("endpoints = %d after delete, want 1", n)
	}
	select {
	case <-timers:
		t.Fatal("a change long after the last build waited")
	default:
	}
}

// changeCounts records what the source tells its ChangeCounter.
type changeCounts struct {
	mu                                         sync.Mutex
	services, endpoints, svcPending, epPending int
	taken                                      int
	ev                                         chan struct{} // one per call
}

func (c *changeCounts) wait(t *testing.T, n int) {
	t.Helper()
	for i := 0; i < n; i++ {
		select {
		case <-c.ev:
		case <-time.After(10 * time.Second):
			t.Fatalf("%d of %d change counts never came", n-i, n)
		}
	}
}

func (c *changeCounts) ServiceChanged(p int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.services++
	c.svcPending = p
	c.ev <- struct{}{}
}

func (c *changeCounts) EndpointsChanged(p int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.endpoints++
	c.epPending = p
	c.ev <- struct{}{}
}

func (c *changeCounts) ChangesTaken() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.taken++
	c.svcPending, c.epPending = 0, 0
	c.ev <- struct{}{}
}

func (c *changeCounts) get() [5]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return [5]int{c.services, c.endpoints, c.svcPending, c.epPending, c.taken}
}

// kube-proxy's change metrics: every Service and EndpointSlice event is
// counted; pending is the Services changed since the last build, and a
// build takes them all.
func TestChangeCounts(t *testing.T) {
	client := fake.NewClientset(service("web"), slice("web", "w0", discoveryv1.AddressTypeIPv4, ready("10.244.0.9", "n1")))
	timers := make(chan chan time.Time, 1)
	counts := &changeCounts{ev: make(chan struct{}, 100)}
	s := newSink()
	run(t, &Source{Client: client, Sink: s, MinSyncPeriod: time.Hour, Changes: counts,
		After: func(time.Duration) <-chan time.Time { c := make(chan time.Time, 1); timers <- c; return c }})
	s.next(t)
	counts.wait(t, 3)
	if got := counts.get(); got != [5]int{1, 1, 0, 0, 1} {
		t.Fatalf("after the initial list: [services endpoints svcPending epPending taken] = %v, want [1 1 0 0 1]", got)
	}
	ctx := context.Background()
	for _, name := range []string{"w1", "w2"} {
		if _, err := client.DiscoveryV1().EndpointSlices("default").Create(ctx, slice("web", name, discoveryv1.AddressTypeIPv4, ready("10.244.0.1", "n1")), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := client.CoreV1().Services("default").Create(ctx, service("api", func(s *corev1.Service) { s.Spec.ClusterIP, s.Spec.ClusterIPs = "10.96.0.11", []string{"10.96.0.11"} }), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	timer := <-timers // the build waits for MinSyncPeriod
	counts.wait(t, 3)
	if got := counts.get(); got != [5]int{2, 3, 1, 1, 1} {
		t.Fatalf("before the build: %v, want [2 3 1 1 1] (two slices of one Service are one pending Service)", got)
	}
	timer <- time.Now()
	s.until(t, "api appears", func(sn *lb.Snapshot) bool { return port(sn, "api", "http") != nil })
	counts.wait(t, 1)
	if got := counts.get(); got != [5]int{2, 3, 0, 0, 2} {
		t.Fatalf("after the build: %v, want [2 3 0 0 2]", got)
	}
}

// timedSink is a sink that takes UpdateTimes.
type timedSink struct {
	*sink
	times chan controlplane.UpdateTimes
}

func (s timedSink) PublishTimed(snap *lb.Snapshot, t controlplane.UpdateTimes) {
	s.times <- t
	s.Publish(snap)
}

// A change is published with when it arrived and, for an EndpointSlice
// with kube's last-change-trigger-time, that time and its family (for
// kube-proxy's network programming SLI); the initial list and triggers
// from before the start are not timed.
func TestUpdateTimes(t *testing.T) {
	old := slice("web", "w0", discoveryv1.AddressTypeIPv4, ready("10.244.0.9", "n1"))
	old.Annotations = map[string]string{corev1.EndpointsLastChangeTriggerTime: time.Now().Add(-time.Hour).Format(time.RFC3339Nano)}
	client := fake.NewClientset(service("web"), old)
	s := timedSink{sink: newSink(), times: make(chan controlplane.UpdateTimes, 10)}
	run(t, &Source{Client: client, Sink: s})
	s.next(t)
	select {
	case ts := <-s.times:
		t.Fatalf("the initial list was timed: %+v", ts)
	default:
	}
	ctx := context.Background()
	trigger := time.Now().Round(time.Microsecond)
	sl := slice("web", "w1", discoveryv1.AddressTypeIPv6, ready("fd00::1", "n1"))
	sl.Annotations = map[string]string{corev1.EndpointsLastChangeTriggerTime: trigger.Format(time.RFC3339Nano)}
	if _, err := client.DiscoveryV1().EndpointSlices("default").Create(ctx, sl, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	s.next(t)
	ts := <-s.times
	if len(ts.Triggers) != 1 || ts.Triggers[0].Family != "IPv6" || !ts.Triggers[0].At.Equal(trigger) || len(ts.Arrived) != 1 || ts.Arrived[0].Before(trigger) {
		t.Fatalf("times %+v, want the IPv6 trigger %v and one arrival after it", ts, trigger)
	}
	// Without the annotation: only the arrival.
	if err := client.DiscoveryV1().EndpointSlices("default").Delete(ctx, "w1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	s.next(t)
	if ts := <-s.times; len(ts.Triggers) != 0 || len(ts.Arrived) != 1 {
		t.Fatalf("times of a delete: %+v", ts)
	}
	// A trigger time that is not one: only the arrival.
	bad := slice("web", "w2", discoveryv1.AddressTypeIPv4, ready("10.244.0.2", "n1"))
	bad.Annotations = map[string]string{corev1.EndpointsLastChangeTriggerTime: "yesterday"}
	if _, err := client.DiscoveryV1().EndpointSlices("default").Create(ctx, bad, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	s.next(t)
	if ts := <-s.times; len(ts.Triggers) != 0 || len(ts.Arrived) != 1 {
		t.Fatalf("times of a slice with a bad trigger time: %+v", ts)
	}
}

// Each snapshot after the first says it is the one before with the ports
// it names changed (issue 16), and says so truly: exactly those names
// differ between the two.
func TestSnapshotsCarryTheirDelta(t *testing.T) {
	client := fake.NewClientset(service("web"), slice("web", "web-a", discoveryv1.AddressTypeIPv4, ready("10.244.0.1", "n1")))
	s := newSink()
	run(t, &Source{Client: client, Sink: s})
	prev := s.next(t)
	ctx := context.Background()
	changes := []func() error{
		func() error {
			_, err := client.CoreV1().Services("default").Create(ctx, service("api", func(s *corev1.Service) { s.Spec.ClusterIP, s.Spec.ClusterIPs = "10.96.0.11", []string{"10.96.0.11"} }), metav1.CreateOptions{})
			return err
		},
		func() error {
			_, err := client.DiscoveryV1().EndpointSlices("default").Update(ctx, slice("web", "web-a", discoveryv1.AddressTypeIPv4, ready("10.244.0.2", "n1")), metav1.UpdateOptions{})
			return err
		},
		func() error { return client.CoreV1().Services("default").Delete(ctx, "web", metav1.DeleteOptions{}) },
	}
	for i, change := range changes {
		if err := change(); err != nil {
			t.Fatal(err)
		}
		next := s.next(t)
		names, ok := next.DeltaSince(prev.ID)
		if !ok {
			t.Fatalf("change %d: snapshot %d (base %d) is not a delta of %d", i, next.ID, next.Base, prev.ID)
		}
		var differ []string
		seen := map[lb.ServicePortName]bool{}
		for n, sp := range next.Ports.All() {
			seen[n] = true
			if prev.Ports.Get(n) != sp {
				differ = append(differ, n.String())
			}
		}
		for n := range prev.Ports.All() {
			if !seen[n] {
				differ = append(differ, n.String())
			}
		}
		var said []string
		for _, n := range names {
			said = append(said, n.String())
		}
		slices.Sort(differ)
		slices.Sort(said)
		if len(said) == 0 || !slices.Equal(said, differ) {
			t.Fatalf("change %d: says %v changed, %v did", i, said, differ)
		}
		prev = next
	}
}

// The informers keep only what sluice reads: a Service and EndpointSlices
// from which controlplane.BuildService builds the same service ports as
// from the whole objects, over random slices as controllers write them (several
// addresses, missing and false conditions, nodes, zones, pod references,
// both protocols, ports without a name or protocol).
func TestProxyTrimKeepsWhatSluiceReads(t *testing.T) {
	trim := newProxyTrim("")
	mf := []metav1.ManagedFieldsEntry{{Manager: "kubectl", Operation: metav1.ManagedFieldsOperationApply}}
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "web", Labels: map[string]string{"app": "web"}, ManagedFields: mf,
		Annotations: map[string]string{"kubectl.kubernetes.io/last-applied-configuration": "{...}"}},
		Spec: corev1.ServiceSpec{ClusterIP: "10.96.0.10"}}
	if c, err := trim.transform(svc); err != nil || !c.(*cachedService).clusterIP {
		t.Fatalf("service: %v %+v", err, c)
	}
	if c, err := trim.transform(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}); err == nil || c != nil || !strings.Contains(err.Error(), "*v1.Node") {
		t.Fatalf("another kind of object: %v, %v", c, err) // a reflector of the wrong type
	}

	web := service("web", func(s *corev1.Service) {
		s.Spec.Ports = []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP},
			{Name: "dns", Port: 53, Protocol: corev1.ProtocolUDP, AppProtocol: ptr("dns")}, {Name: "alt", Port: 81, Protocol: corev1.ProtocolTCP}}
		s.Labels, s.Spec.Selector = map[string]string{"app": "web"}, map[string]string{"app": "web"}
		s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
	})
	cw, err := trim.transform(web.DeepCopy())
	if err != nil {
		t.Fatal(err)
	}
	trimmedWeb := &cw.(*cachedService).Service
	wholeWeb := controlplane.NewService(web)
	rng := rand.New(rand.NewPCG(16, 2))
	flag := func() *bool { // nil, false or true
		if v := rng.IntN(3); v < 2 {
			return ptr(v == 1)
		}
		return nil
	}
	maybe := func(s string) *string {
		if rng.IntN(4) == 0 {
			return nil
		}
		return ptr(s)
	}
	served := 0 // built ports with endpoints: the walk must reach them
	for round := 0; round < 200; round++ {
		node := fmt.Sprintf("node-%d", rng.IntN(3))
		trim.node = node // the cached slices are parsed for it; the whole ones for any
		var cached, whole []*controlplane.Slice
		for n := rng.IntN(3) + 1; n > 0; n-- {
			sl := &discoveryv1.EndpointSlice{
				ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: fmt.Sprintf("web-%d", n), GenerateName: "web-", ManagedFields: mf,
					Labels:          map[string]string{discoveryv1.LabelServiceName: "web", discoveryv1.LabelManagedBy: "endpointslice-controller.k8s.io"},
					Annotations:     map[string]string{corev1.EndpointsLastChangeTriggerTime: "2026-11-26T09:00:00Z", "other": "x"},
					OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Service", Name: "web", Controller: ptr(true)}}},
				AddressType: discoveryv1.AddressTypeIPv4,
			}
			for p := rng.IntN(3); p >= 0; p-- {
				port := discoveryv1.EndpointPort{Name: maybe([]string{"http", "dns", "alt", ""}[rng.IntN(4)]), Port: ptr(int32(8000 + rng.IntN(3))),
					AppProtocol: ptr("kubernetes.io/h2c")}
				if rng.IntN(4) > 0 {
					port.Protocol = ptr([]corev1.Protocol{corev1.ProtocolTCP, corev1.ProtocolUDP}[rng.IntN(2)])
				}
				sl.Ports = append(sl.Ports, port)
			}
			for e := rng.IntN(6); e > 0; e-- {
				ep := discoveryv1.Endpoint{
					Conditions: discoveryv1.EndpointConditions{Ready: flag(), Serving: flag(), Terminating: flag()},
					NodeName:   maybe(fmt.Sprintf("node-%d", rng.IntN(3))), Zone: maybe("zone-a"), Hostname: maybe("pod"),
					TargetRef: &corev1.ObjectReference{Kind: "Pod", Namespace: "default", Name: fmt.Sprintf("web-%d", e)},
				}
				for a := rng.IntN(3) + 1; a > 0; a-- {
					ep.Addresses = append(ep.Addresses, fmt.Sprintf("10.244.%d.%d", rng.IntN(4), rng.IntN(250)+1))
				}
				sl.Endpoints = append(sl.Endpoints, ep)
			}
			whole = append(whole, controlplane.NewSlice(sl.DeepCopy()))
			if tr := triggerOf(sl); tr.Family != "IPv4" || tr.At.UTC().Format(time.RFC3339Nano) != sl.Annotations[corev1.EndpointsLastChangeTriggerTime] {
				t.Fatalf("round %d: trigger read as %+v", round, tr)
			}
			c, err := trim.transform(sl) // trims sl in place, then keeps what the build reads
			if err != nil {
				t.Fatal(err)
			}
			if cs, ok := c.(*cachedSlice); !ok || cs.Name != sl.Name || cs.Namespace != sl.Namespace {
				t.Fatalf("round %d: cached as %+v", round, c)
			} else {
				cached = append(cached, &cs.Slice)
			}
		}
		wantPorts, wantErrs := controlplane.BuildService(wholeWeb, whole, node, "")
		gotPorts, gotErrs := controlplane.BuildService(trimmedWeb, cached, node, "")
		if !reflect.DeepEqual(gotPorts, wantPorts) || fmt.Sprint(gotErrs) != fmt.Sprint(wantErrs) {
			t.Fatalf("round %d: trimmed slices build\n%v %v\nthe whole ones\n%v %v", round, gotPorts, gotErrs, wantPorts, wantErrs)
		}
		for _, p := range wantPorts {
			if len(p.Endpoints) > 0 {
				served++
			}
		}
	}
	if served < 100 {
		t.Fatalf("only %d built ports had endpoints: the walk checks too little", served)
	}
}

// The intern table stops growing at maxInterned; names past it are kept
// as they are.
func TestProxyTrimInternTableIsBounded(t *testing.T) {
	trim := newProxyTrim("")
	for i := 0; i < maxInterned+100; i++ {
		ns := fmt.Sprintf("team-%d", i)
		sl := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web-1"}}
		c, _ := trim.transform(sl)
		if got := c.(*cachedSlice).Namespace; got != ns {
			t.Fatalf("namespace %q became %q", ns, got)
		}
	}
	if len(trim.strs) != maxInterned {
		t.Fatalf("intern table holds %d, want %d", len(trim.strs), maxInterned)
	}
}

// The intern table holds copies, never a pointer into an object it was
// given (&sl.Namespace would keep the whole slice alive for good).
func TestProxyTrimInternsCopies(t *testing.T) {
	trim := newProxyTrim("")
	port := "http"
	sl := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "web-1"},
		Ports: []discoveryv1.EndpointPort{{Name: &port, Port: ptr(int32(80))}}}
	trim.transform(sl)
	if p := trim.strs["team-a"]; p == nil || p == &sl.Namespace {
		t.Fatalf("namespace interned as %p, the object's field is %p", p, &sl.Namespace)
	}
	if p := trim.strs["http"]; p == nil || p == &port {
		t.Fatalf("port name interned as %p, the object's is %p", p, &port)
	}
}

// A big initial list's garbage is handed back to the system once,
// releaseDelay after the first build; a small one's is left to the
// scavenger. The release holds nothing up: an update that comes while it
// runs is published.
func TestBigInitialListReleasesMemoryOnce(t *testing.T) {
	for _, n := range []int{bigList - 1, bigList} {
		var objs []runtime.Object
		for i := 0; i < n; i++ {
			objs = append(objs, service(fmt.Sprintf("s%d", i)))
		}
		client := fake.NewClientset(objs...)
		var released atomic.Int32
		started, unblock := make(chan struct{}, 1), make(chan struct{})
		s := newSink()
		s.queued = make(chan struct{}, 2*n+10) // an event per object, unread here
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		delay := make(chan time.Time, 1)
		after := func(d time.Duration) <-chan time.Time {
			if d != releaseDelay {
				t.Errorf("a wait of %v", d)
			}
			return delay
		}
		go func() {
			done <- (&Source{Client: client, Sink: s, After: after, ReleaseMemory: func() {
				released.Add(1)
				started <- struct{}{}
				<-unblock
			}}).Run(ctx)
		}()
		if snap := s.next(t); snap.Ports.Len() != n {
			t.Fatalf("first snapshot has %d ports, want %d", snap.Ports.Len(), n)
		}
		if n >= bigList {
			select {
			case <-started:
				t.Fatal("memory released before its delay")
			default:
			}
			delay <- time.Now()
			<-started // the release runs, and does not return until told
		}
		if _, err := client.CoreV1().Services("default").Create(context.Background(), service("later"), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if snap := s.next(t); snap.Ports.Len() != n+1 {
			t.Fatalf("second snapshot: %d ports", snap.Ports.Len())
		}
		close(unblock)
		cancel()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		want := int32(0)
		if n >= bigList {
			want = 1
		}
		if got := released.Load(); got != want {
			t.Fatalf("%d Services: memory released %d times, want %d", n, got, want)
		}
	}
}

// takenSignal says when the source takes its changes.
type takenSignal struct{ taken chan struct{} }

func (c takenSignal) ServiceChanged(int)   {}
func (c takenSignal) EndpointsChanged(int) {}
func (c takenSignal) ChangesTaken() {
	select {
	case c.taken <- struct{}{}:
	default:
	}
}

// The first build waits until the handlers have been told of every object
// of the initial list, not only until the caches hold them: notifications
// still on their way after it marked every Service again, and the next
// build rebuilt them all while the first real update waited (at 10k in the
// API churn bench, the first update's own share was 30-250 ms). Here the
// handlers are held at their first event (the sink does not take its
// Queued) for a second: the first build must not take the changes
// meanwhile.
func TestFirstBuildComesAfterEveryInitialNotification(t *testing.T) {
	objs := []runtime.Object{service("a"), service("b"), slice("a", "a-1", discoveryv1.AddressTypeIPv4, ready("10.244.0.1", "n1"))}
	client := fake.NewClientset(objs...)
	changes := takenSignal{taken: make(chan struct{}, 1)}
	s := newSink()
	s.queued = make(chan struct{}) // a handler blocks until the test reads
	run(t, &Source{Client: client, Sink: s, Changes: changes})
	<-s.queued // the first handler has marked its Service; the next blocks
	early := false
	select {
	case <-changes.taken:
		early = true
	case <-time.After(time.Second):
	}
	stop := make(chan struct{})
	defer close(stop)
	go func() { // the handlers go on, so that Run can end either way
		for {
			select {
			case <-s.queued:
			case <-stop:
				return
			}
		}
	}()
	if early {
		t.Fatal("the first build took the changes while the handlers were still being told of the initial list")
	}
	if snap := s.next(t); snap.Ports.Len() != 2 {
		t.Fatalf("first snapshot: %d ports", snap.Ports.Len())
	}
}

// The source's own map of each Service's slices follows the
// EndpointSlices' reflector: a slice added, another beside it, one moved
// to another Service by its label, one updated in place, one deleted, and
// a slice without the label, which no Service has, labelled later and then
// unlabelled again.
func TestSlicesFollowTheEvents(t *testing.T) {
	s := newTestSource()
	cached := func(name, svc, addr string) *cachedSlice {
		sl := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name}, AddressType: discoveryv1.AddressTypeIPv4,
			Endpoints: []discoveryv1.Endpoint{{Addresses: []string{addr}}}}
		if svc != "" {
			sl.Labels = map[string]string{discoveryv1.LabelServiceName: svc}
		}
		return newCachedSlice(sl, "")
	}
	names := func(svc string) string {
		_, list := s.stateOf(serviceKey{"default", svc})
		var out []string
		for _, sl := range list {
			out = append(out, sl.Name)
		}
		slices.Sort(out)
		return strings.Join(out, ",")
	}
	marked := func(want ...string) {
		t.Helper()
		if got := markedNames(s); got != strings.Join(want, ",") {
			t.Fatalf("marked %q, want %v", got, want)
		}
	}
	a1, a2 := cached("a-1", "a", "10.0.0.1"), cached("a-2", "a", "10.0.0.2")
	s.putSlice(a1, controlplane.Trigger{}, true)
	s.putSlice(a2, controlplane.Trigger{}, true)
	if got := names("a"); got != "a-1,a-2" {
		t.Fatalf("after two adds: %q", got)
	}
	marked("a")
	s.putSlice(cached("a-2", "b", "10.0.0.2"), controlplane.Trigger{}, false)
	if got, gotB := names("a"), names("b"); got != "a-1" || gotB != "a-2" {
		t.Fatalf("after a relabel: a %q, b %q", got, gotB)
	}
	marked("a", "b")
	a1v2 := cached("a-1", "a", "10.0.0.9")
	s.putSlice(a1v2, controlplane.Trigger{}, false)
	if _, list := s.stateOf(serviceKey{"default", "a"}); len(list) != 1 || list[0] != &a1v2.Slice {
		t.Fatalf("after an update in place: %v", list)
	}
	marked("a")
	s.deleteSlice("default", "a-2", "b")
	s.deleteSlice("default", "a-1", "a")
	if s.bySvc.len() != 0 {
		t.Fatalf("after the deletes: %v", s.bySvc.byNS)
	}
	marked("a", "b")
	s.putSlice(cached("loose", "", "10.0.0.3"), controlplane.Trigger{}, true)
	if s.bySvc.len() != 0 {
		t.Fatalf("a slice without the label was kept: %v", s.bySvc.byNS)
	}
	marked()
	s.putSlice(cached("loose", "c", "10.0.0.3"), controlplane.Trigger{}, false)
	s.putSlice(cached("loose", "", "10.0.0.3"), controlplane.Trigger{}, false)
	if s.bySvc.len() != 0 {
		t.Fatalf("a slice whose label went was kept: %v", s.bySvc.byNS)
	}
	marked("c")
	// The ports built share the entry, which goes when both are gone.
	key, ports := serviceKey{"default", "a"}, []*lb.ServicePort{{Name: lb.ServicePortName{Namespace: "default", Name: "a"}}}
	s.setBuilt(key, ports)
	s.putSlice(a1, controlplane.Trigger{}, true)
	s.deleteSlice("default", "a-1", "a")
	if got := s.builtOf(key); len(got) != 1 || got[0] != ports[0] {
		t.Fatalf("the built ports went with the last slice: %v", got)
	}
	s.putSlice(a1, controlplane.Trigger{}, true)
	s.setBuilt(key, nil)
	if names("a") != "a-1" || s.builtOf(key) != nil {
		t.Fatalf("after the ports went: slices %q, ports %v", names("a"), s.builtOf(key))
	}
	s.deleteSlice("default", "a-1", "a")
	if s.bySvc.len() != 0 {
		t.Fatalf("an entry with neither slices nor ports was kept: %v", s.bySvc.byNS)
	}
	s.setBuilt(key, nil)
	if s.bySvc.len() != 0 {
		t.Fatalf("no ports made an entry: %v", s.bySvc.byNS)
	}
	s.setBuilt(key, ports)
	s.setBuilt(key, nil)
	if s.bySvc.len() != 0 {
		t.Fatalf("an entry whose ports went, with no slices, was kept: %v", s.bySvc.byNS)
	}
}

// With IgnoreNodeHints (kube-proxy's PreferSameTrafficDistribution gate
// off), the node hints are dropped as slices arrive and the zone hints
// decide: every endpoint here is for this node's zone, so cluster traffic
// goes to all of them; with the hints read, only to this node's.
func TestIgnoreNodeHintsLeavesTheZoneHints(t *testing.T) {
	web := service("web", func(s *corev1.Service) {
		s.Spec.Ports = []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}}
	})
	slice := func() *discoveryv1.EndpointSlice {
		sl := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web-1", Labels: map[string]string{discoveryv1.LabelServiceName: "web"}},
			AddressType: discoveryv1.AddressTypeIPv4, Ports: []discoveryv1.EndpointPort{{Name: ptr("http"), Port: ptr(int32(8080)), Protocol: ptr(corev1.ProtocolTCP)}}}
		for i, node := range []string{"node-1", "node-2"} {
			sl.Endpoints = append(sl.Endpoints, discoveryv1.Endpoint{Addresses: []string{fmt.Sprintf("10.244.%d.5", i)}, NodeName: ptr(node),
				Hints: &discoveryv1.EndpointHints{ForNodes: []discoveryv1.ForNode{{Name: node}}, ForZones: []discoveryv1.ForZone{{Name: "zone-a"}}}})
		}
		return sl
	}
	for _, ignore := range []bool{false, true} {
		trim := newProxyTrim("node-1")
		trim.ignoreNodeHints = ignore
		cw, _ := trim.transform(web.DeepCopy())
		cs, err := trim.transform(slice())
		if err != nil {
			t.Fatal(err)
		}
		ports, errs := controlplane.BuildService(&cw.(*cachedService).Service, []*controlplane.Slice{&cs.(*cachedSlice).Slice}, "node-1", "zone-a")
		if len(errs) > 0 || len(ports) != 1 {
			t.Fatalf("ignore %v: %v %v", ignore, ports, errs)
		}
		out := ports[0].OutOfTopology()
		if ignore && len(out) != 0 || !ignore && (len(out) != 1 || out[0].Addr() != netip.MustParseAddr("10.244.1.5")) {
			t.Errorf("ignore node hints %v: out of topology %v", ignore, out)
		}
	}
}
