package kube

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// newTestSource is a Source ready for its stores' calls without Run.
func newTestSource() *Source {
	return &Source{Sink: newSink(), pending: map[serviceKey]*pendingChange{},
		problems: map[serviceKey]string{}, wake: make(chan struct{}, 1)}
}

// markedNames are the names of the Services marked since the last call.
func markedNames(s *Source) string {
	keys, _ := s.takeDirty()
	var got []string
	for key := range keys {
		got = append(got, key.name)
	}
	slices.Sort(got)
	return strings.Join(got, ",")
}

// A relist (a reflector's Replace after its watch could not go on) makes
// the list what is held: what it lacks is deleted, what changed is
// replaced, and an object at the resource version held is left as it is,
// its Service not marked. The first list is what the build waits for.
func TestRelistKeepsTheUnchangedAndDropsTheGone(t *testing.T) {
	s := newTestSource()
	trim := newProxyTrim("")
	services, endpointSlices := newReflectorStore(s, trim, false), newReflectorStore(s, trim, true)
	svc := func(name, rv string) any {
		o := service(name)
		o.ResourceVersion = rv
		return o
	}
	sl := func(svc, name, rv string) any {
		o := slice(svc, name, discoveryv1.AddressTypeIPv4, ready("10.244.0.1", "n1"))
		o.ResourceVersion = rv
		return o
	}
	if services.hasSynced() || endpointSlices.hasSynced() {
		t.Fatal("synced before a list")
	}
	if err := services.Replace([]any{svc("a", "1"), svc("b", "1"), svc("d", "1")}, "1"); err != nil {
		t.Fatal(err)
	}
	if err := endpointSlices.Replace([]any{sl("a", "a-1", "1"), sl("b", "b-1", "1"), sl("d", "d-1", "1")}, "1"); err != nil {
		t.Fatal(err)
	}
	if !services.hasSynced() || !endpointSlices.hasSynced() {
		t.Fatal("not synced after the first lists")
	}
	if got := markedNames(s); got != "a,b,d" {
		t.Fatalf("first lists marked %q", got)
	}
	held := func(key string) (*cachedService, []*cachedSlice) {
		s.slicesMu.Lock()
		defer s.slicesMu.Unlock()
		if st := s.bySvc.get(serviceKey{"default", key}); st != nil {
			return st.svc, slices.Clone(st.slices)
		}
		return nil, nil
	}
	aSvc, aSlices := held("a")

	if err := services.Replace([]any{svc("a", "1"), svc("b", "2"), svc("c", "1")}, "2"); err != nil {
		t.Fatal(err)
	}
	if got := markedNames(s); got != "b,c,d" {
		t.Fatalf("the Services' relist marked %q, want the changed, the new and the gone", got)
	}
	if got, _ := held("a"); got != aSvc {
		t.Fatal("an unchanged Service was replaced")
	}
	if got, _ := held("d"); got != nil {
		t.Fatal("a Service the relist lacks is still held")
	}
	if got, _ := held("b"); got == nil || got.version() != "2" {
		t.Fatalf("the changed Service: %+v", got)
	}

	// Each slice of the relist carries a last-change-trigger-time: only the
	// changed and the new ones' are timed.
	triggered := func(o any, at time.Time) any {
		o.(*discoveryv1.EndpointSlice).Annotations = map[string]string{corev1.EndpointsLastChangeTriggerTime: at.Format(time.RFC3339Nano)}
		return o
	}
	t0 := time.Date(2026, 11, 27, 9, 0, 0, 0, time.UTC)
	if err := endpointSlices.Replace([]any{triggered(sl("a", "a-1", "1"), t0), triggered(sl("c", "b-1", "2"), t0.Add(time.Second)),
		triggered(sl("e", "e-1", "1"), t0.Add(2*time.Second))}, "2"); err != nil {
		t.Fatal(err)
	}
	if s.mu.Lock(); len(s.triggers) != 2 || !s.triggers[0].At.Equal(t0.Add(time.Second)) || !s.triggers[1].At.Equal(t0.Add(2*time.Second)) {
		t.Errorf("relist timed %v, want the changed and the new slices' triggers", s.triggers)
	}
	s.mu.Unlock()
	if got := markedNames(s); got != "b,c,d,e" {
		t.Fatalf("the slices' relist marked %q, want the one left, the one joined, the gone and the new", got)
	}
	if _, got := held("a"); len(got) != 1 || got[0] != aSlices[0] {
		t.Fatal("an unchanged slice was replaced")
	}
	for name, want := range map[string]string{"b": "", "c": "b-1", "d": "", "e": "e-1"} {
		_, list := held(name)
		var got []string
		for _, c := range list {
			got = append(got, c.Name)
		}
		if strings.Join(got, ",") != want {
			t.Errorf("Service %s holds slices %v, want %q", name, got, want)
		}
	}
	if s.bySvc.get(serviceKey{"default", "d"}) != nil {
		t.Error("the entry of a Service gone with its slice is kept")
	}

	// An object without a resource version is never taken as unchanged.
	if err := services.Replace([]any{svc("a", ""), svc("b", "2"), svc("c", "1")}, "3"); err != nil {
		t.Fatal(err)
	}
	markedNames(s)
	if err := services.Replace([]any{svc("a", ""), svc("b", "2"), svc("c", "1")}, "4"); err != nil {
		t.Fatal(err)
	}
	if got := markedNames(s); got != "a" {
		t.Fatalf("relists of a Service without a resource version marked %q", got)
	}

	// A list of the wrong kind is refused, naming what it held.
	if err := services.Replace([]any{svc("a", "1"), &corev1.Node{}}, "3"); err == nil || !strings.Contains(err.Error(), "*v1.Node") {
		t.Fatalf("a Node in a list of Services: %v", err)
	}
}

// logged is a slog handler that hands each record's message to a channel.
type logged chan string

func (l logged) Enabled(context.Context, slog.Level) bool { return true }
func (l logged) Handle(_ context.Context, r slog.Record) error {
	select {
	case l <- r.Message:
	default:
	}
	return nil
}
func (l logged) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l logged) WithGroup(string) slog.Handler      { return l }

// A failed list is warned of, and tried again until it works: the first
// snapshot comes then.
func TestFailedListIsWarnedOfAndRetried(t *testing.T) {
	client := fake.NewClientset(service("a"))
	var failures atomic.Int32
	client.PrependReactor("list", "services", func(k8stesting.Action) (bool, runtime.Object, error) {
		if failures.Add(1) == 1 {
			return true, nil, errors.New("the API server is away")
		}
		return false, nil, nil
	})
	log := make(logged, 100)
	s := newSink()
	run(t, &Source{Client: client, Sink: s, Log: slog.New(log)})
	deadline := time.After(10 * time.Second)
	for warned := false; !warned; {
		select {
		case msg := <-log:
			warned = strings.Contains(msg, "API watch failed")
		case <-deadline:
			t.Fatal("no warning of the failed list")
		}
	}
	if snap := s.next(t); snap.Ports.Len() != 1 {
		t.Fatalf("first snapshot: %d ports", snap.Ports.Len())
	}
	if got := failures.Load(); got < 2 {
		t.Fatalf("%d lists, want a second after the failure", got)
	}
}

// What the source keeps of each Service and EndpointSlice fills its size
// class: a field added, or one moved in line that is behind a pointer
// (controlplane.Service's problems), would take the next class for every
// object held (issue 16's memory budget).
func TestCachedObjectSizes(t *testing.T) {
	for _, c := range []struct {
		what      string
		size, max uintptr
	}{
		{"cachedService", unsafe.Sizeof(cachedService{}), 96},
		{"cachedSlice", unsafe.Sizeof(cachedSlice{}), 112},
		{"serviceState", unsafe.Sizeof(serviceState{}), 64},
	} {
		if c.size > c.max {
			t.Errorf("%s is %d bytes, over its size class of %d", c.what, c.size, c.max)
		}
	}
}

// A resource version is kept as a number only when the number says what
// the string did; two objects are the same version only when both have
// one and it is the same string.
func TestCachedVersionsCompareAsTheirStrings(t *testing.T) {
	versions := []string{"", "1", "123", "0123", "0", "12a", "9999999999999999999", "18446744073709551615", "18446744073709551616", "abc", "-1"}
	for _, a := range versions {
		ma := metaOf(&metav1.ObjectMeta{ResourceVersion: a})
		if got := ma.version(); got != a {
			t.Errorf("%q kept as %q", a, got)
		}
		for _, b := range versions {
			mb := metaOf(&metav1.ObjectMeta{ResourceVersion: b})
			if got, want := ma.sameVersion(mb), a != "" && a == b; got != want {
				t.Errorf("%q and %q: same version %v, want %v", a, b, got, want)
			}
		}
	}
	if m := metaOf(&metav1.ObjectMeta{ResourceVersion: "123456"}); m.rvText != nil {
		t.Error("a decimal version is kept as a string")
	}
}
