// Package kube owns the Kubernetes API source: client-go reflectors on
// Services and EndpointSlices, whose store is the source's own map, and an
// informer on this node's Node object, turned into lb.Snapshots one
// changed Service at a time, exactly as kube-proxy selects and merges them.
// It never publishes before the initial lists have synced, and it keeps
// the last published state while the API server is away.
package kube

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"log/slog"
	"net/netip"
	"reflect"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/sluice-proxy/sluice/controlplane"
	"github.com/sluice-proxy/sluice/lb"
)

// The labels kube-proxy's informers exclude (Services and EndpointSlices).
const (
	LabelServiceProxyName = "service.kubernetes.io/service-proxy-name"
	LabelHeadless         = "service.kubernetes.io/headless"
)

// ProxySelector is the label selector of kube-proxy's informers.
const ProxySelector = "!" + LabelServiceProxyName + ",!" + LabelHeadless

// TaintToBeDeleted is the cluster autoscaler's taint on a node it is
// about to delete (see controlplane.NodeEligible).
const TaintToBeDeleted = controlplane.TaintToBeDeleted

// Source watches the API server. The zero value is not usable: set Client
// and Sink, then call Run.
type Source struct {
	Client kubernetes.Interface
	Sink   controlplane.Sink
	// NodeName is this node (--hostname-override or the host name): its
	// endpoints are local, and its Node object decides eligibility.
	NodeName string
	// IgnoreNodeHints drops the EndpointSlices' node hints as they arrive
	// (trafficDistribution PreferSameNode), as kube-proxy does with its
	// PreferSameTrafficDistribution gate off; zone hints are still read.
	IgnoreNodeHints bool
	// Resync is the Node and ServiceCIDR informers' resync period
	// (--config-sync-period). Services and EndpointSlices are not resynced:
	// see reflectorStore.Resync.
	Resync time.Duration
	// MinSyncPeriod bounds how often snapshots are built, as kube-proxy's
	// bounded-frequency runner does: a change is built at once unless the
	// last build was less than MinSyncPeriod ago; then it waits out the
	// rest, collecting what else arrives. Zero builds every change at once.
	MinSyncPeriod time.Duration
	// NodeEligible is told whether the Node may take traffic; may be nil.
	NodeEligible func(bool)
	// NodeZone is told the Node's zone label ("": none) on every add and
	// update of it; may be nil.
	NodeZone func(string)
	// NodePodCIDRs is told the Node's spec.podCIDRs on every add and
	// update of it; may be nil.
	NodePodCIDRs func([]string)
	// ServiceCIDRs, when set, is given the cluster's service ranges (every
	// ServiceCIDR object's) on each change; nftables mode drops traffic to
	// unallocated addresses in them.
	ServiceCIDRs func([]netip.Prefix)
	// Skipped is told about each bad object left out of the snapshot, with
	// errors that name it; called when its problem first appears or changes.
	Skipped func(error)
	// Changes, when set, hears of every Service and EndpointSlice event,
	// for kube-proxy's change metrics.
	Changes ChangeCounter
	Log     *slog.Logger
	// ReleaseMemory hands freed memory back to the system; it is called
	// once, on a goroutine of its own, releaseDelay after the first build
	// of an initial list of at least bigList Services (not if Run ends
	// first); Run returns after it does.
	// Default debug.FreeOSMemory.
	ReleaseMemory func()
	// After and Now are the clock, injectable for tests; default time's.
	After func(time.Duration) <-chan time.Time
	Now   func() time.Time

	wake chan struct{}

	mu sync.Mutex
	// pending are the Services changed since the last build: when the
	// first change arrived, and whether by Service or EndpointSlice
	// events; svcPending and epPending count those kinds (Changes'
	// pending counts).
	pending               map[serviceKey]*pendingChange
	svcPending, epPending int
	// The trigger times of the pending EndpointSlice changes (for the
	// sink's UpdateTimes).
	triggers []controlplane.Trigger
	started  time.Time             // changes triggered before it are not timed
	problems map[serviceKey]string // reported, so each is reported once

	// bySvc is what the source keeps of each Service: the Service, its
	// slices (by the service-name label) and its ports as last built. One
	// map, where one for each was 55 bytes more per Service, and the
	// informers' stores and queues about 150 more (issue 16's memory
	// budget); an entry goes when all three are empty.
	slicesMu sync.Mutex
	bySvc    serviceTable

	// zone is the Node's topology.kubernetes.io/zone label, for the
	// slices' zone hints: set by the Node's events, read by the builds.
	zone atomic.Pointer[string]

	// Owned by the Run goroutine.
	last *lb.Snapshot
	ids  uint64 // the last snapshot ID given
}

// ChangeCounter is told of each Service and EndpointSlice event with how
// many Services now wait for a build because of such events, and when a
// build takes them all (kube-proxy's sync_proxy_rules_service_changes_*
// and _endpoint_changes_*).
type ChangeCounter interface {
	ServiceChanged(pending int)
	EndpointsChanged(pending int)
	ChangesTaken()
}

// pendingChange is what the source knows of a Service's changes since the
// last build.
type pendingChange struct {
	arrived            time.Time
	service, endpoints bool
}

// serviceState is what Source.bySvc keeps of a Service. Its fields are
// read and written under slicesMu.
type serviceState struct {
	// svc is the Service (nil: not seen, or deleted), kept by the
	// Services' reflector (putService).
	svc *cachedService
	// slices are the Service's slices, kept by the EndpointSlices'
	// reflector (putSlice).
	slices []*cachedSlice
	// built are its ports as the Run goroutine last built them.
	built []*lb.ServicePort
}

// bigList is the number of Services from which the initial list's garbage
// is handed back to the system, releaseDelay after the first build.
const bigList = 1000

const releaseDelay = 30 * time.Second

// serviceKey names a Service.
type serviceKey struct{ ns, name string }

// serviceTable is Source.bySvc: a map of names per namespace. A slot is a
// name and a pointer, 24 bytes, where one map keyed by namespace and name
// had 40: 37 bytes less per Service at 10k (issue 16's memory budget). Its
// zero value is empty.
type serviceTable struct {
	byNS map[string]map[string]*serviceState
	n    int
}

func (t *serviceTable) get(k serviceKey) *serviceState { return t.byNS[k.ns][k.name] }

func (t *serviceTable) put(k serviceKey, st *serviceState) {
	if t.byNS == nil {
		t.byNS = map[string]map[string]*serviceState{}
	}
	names := t.byNS[k.ns]
	if names == nil {
		names = map[string]*serviceState{}
		t.byNS[k.ns] = names
	}
	if _, ok := names[k.name]; !ok {
		t.n++
	}
	names[k.name] = st
}

func (t *serviceTable) del(k serviceKey) {
	names := t.byNS[k.ns]
	if _, ok := names[k.name]; !ok {
		return
	}
	t.n--
	if len(names) == 1 {
		delete(t.byNS, k.ns)
		return
	}
	delete(names, k.name)
}

func (t *serviceTable) len() int { return t.n }

// all is every entry, in no order; the loop's body may delete the entry
// it is given.
func (t *serviceTable) all() iter.Seq2[serviceKey, *serviceState] {
	return func(yield func(serviceKey, *serviceState) bool) {
		for ns, names := range t.byNS {
			for name, st := range names {
				if !yield(serviceKey{ns, name}, st) {
					return
				}
			}
		}
	}
}

func (s *Source) log() *slog.Logger {
	if s.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return s.Log
}

func (s *Source) now() time.Time {
	if s.Now != nil {
		return s.Now()
	}
	return time.Now()
}

func (s *Source) after(d time.Duration) <-chan time.Time {
	if s.After != nil {
		return s.After(d)
	}
	return time.After(d)
}

// Run starts the reflectors, waits for their initial lists, publishes the
// first snapshot and then one per burst of changes, until ctx ends. It
// returns an error only if ctx ends before the initial sync.
func (s *Source) Run(ctx context.Context) error {
	s.wake = make(chan struct{}, 1)
	s.mu.Lock()
	s.pending, s.svcPending, s.epPending = map[serviceKey]*pendingChange{}, 0, 0
	s.triggers, s.started = nil, s.now()
	s.problems = map[serviceKey]string{}
	s.mu.Unlock()
	s.slicesMu.Lock()
	s.bySvc = serviceTable{}
	s.slicesMu.Unlock()

	// Reflectors, not informers, on Services and EndpointSlices: each
	// event goes from the watch into the source's own map and marks its
	// Service on the reflector's goroutine (reflectorStore). The first
	// build waits for each store's first list, by when every object in it
	// has been marked: the build covers them all and none is built again
	// after it (at 10k Services a second build of every Service once made
	// the first real update wait 150-250 ms behind it).
	trim := newProxyTrim(s.NodeName)
	trim.ignoreNodeHints = s.IgnoreNodeHints
	svcStore, sliceStore := newReflectorStore(s, trim, false), newReflectorStore(s, trim, true)
	reflectCtx, stopReflectors := context.WithCancel(ctx)
	var reflectors sync.WaitGroup
	defer reflectors.Wait()
	defer stopReflectors()
	services := s.Client.CoreV1().Services(metav1.NamespaceAll)
	svcLW := proxyListWatch(services.List, services.Watch)
	endpointSlices := s.Client.DiscoveryV1().EndpointSlices(metav1.NamespaceAll)
	sliceLW := proxyListWatch(endpointSlices.List, endpointSlices.Watch)
	svcReflector := cache.NewReflectorWithOptions(svcLW, &corev1.Service{}, svcStore, cache.ReflectorOptions{Name: "sluice services"})
	sliceReflector := cache.NewReflectorWithOptions(sliceLW, &discoveryv1.EndpointSlice{}, sliceStore, cache.ReflectorOptions{Name: "sluice endpointslices"})
	reflectors.Go(func() { s.reflect(reflectCtx, "services", svcReflector) })
	reflectors.Go(func() { s.reflect(reflectCtx, "endpointslices", sliceReflector) })
	syncs := []cache.InformerSynced{svcStore.hasSynced, sliceStore.hasSynced}
	if s.ServiceCIDRs != nil {
		synced, err := s.watchServiceCIDRs(ctx)
		if err != nil {
			return err
		}
		if synced != nil {
			syncs = append(syncs, synced)
		}
	}
	if s.NodeName != "" {
		nodeFactory := informers.NewSharedInformerFactoryWithOptions(s.Client, s.Resync,
			informers.WithTweakListOptions(func(o *metav1.ListOptions) {
				o.FieldSelector = fields.OneTermEqualSelector("metadata.name", s.NodeName).String()
			}))
		nodeInf := nodeFactory.Core().V1().Nodes().Informer()
		reg, err := nodeInf.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    func(o any) { s.node(o) },
			UpdateFunc: func(_, o any) { s.node(o) },
		})
		if err != nil {
			return err
		}
		// The first build waits for the Node (its zone, for topology
		// hints), as kube-proxy's proxiers start with it.
		syncs = append(syncs, reg.HasSynced)
		nodeFactory.Start(ctx.Done())
		defer nodeFactory.Shutdown()
	}

	start := time.Now()
	if !cache.WaitForCacheSync(ctx.Done(), syncs...) {
		return fmt.Errorf("API source stopped before the initial list of Services and EndpointSlices: %w", context.Cause(ctx))
	}
	s.log().Info("initial list of Services and EndpointSlices synced", "took", time.Since(start).Round(time.Millisecond))
	// The first build covers every Service, whatever was marked meanwhile;
	// it is not timed (the start-up is, by the first sync's own figures).
	s.takeDirty()
	s.slicesMu.Lock()
	keys := make([]serviceKey, 0, s.bySvc.len())
	for key := range s.bySvc.all() {
		keys = append(keys, key) // slices of missing Services are reported
	}
	s.slicesMu.Unlock()
	for _, key := range keys {
		s.rebuild(key)
	}
	s.publish(true, controlplane.UpdateTimes{})
	if len(keys) >= bigList {
		// The initial list decoded every object at once: the pages and
		// the decoding's garbage peak at several times what the caches
		// keep. Hand that back now, once, rather than over the minutes
		// the scavenger takes: at 10k Services in userspace mode, 174 MB
		// resident a minute after start without it, 138-141 with it. On
		// a goroutine of its own, releaseDelay after the build: the
		// collection it forces took up to 0.8 s on a loaded 2-core box;
		// run in line it held up the updates that came meanwhile, and run
		// at once beside them it still slowed the first ones (the API
		// churn bench's first updates, right after start, when a
		// restarted proxy has most to catch up on).
		release := s.ReleaseMemory
		if release == nil {
			release = debug.FreeOSMemory
		}
		wait := s.after(releaseDelay)
		var released sync.WaitGroup
		released.Go(func() {
			select {
			case <-wait:
				release()
			case <-ctx.Done():
			}
		})
		defer released.Wait()
	}
	lastBuild := s.now()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-s.wake:
		}
		if !s.hasDirty() {
			continue // a wake-up for changes an earlier build already took
		}
		if wait := s.MinSyncPeriod - s.now().Sub(lastBuild); wait > 0 {
			select {
			case <-ctx.Done():
				return nil
			case <-s.after(wait):
			}
		}
		lastBuild = s.now()
		// Only the Services that changed are rebuilt, and the snapshot is
		// the last one with their ports replaced (lb.PortMap shares the
		// rest): O(changed), not O(Services), per event (issue 16).
		set := map[lb.ServicePortName]*lb.ServicePort{}
		var del []lb.ServicePortName
		keys, times := s.takeDirty()
		for key := range keys {
			if old, ports, changed := s.rebuild(key); changed {
				for _, sp := range old {
					del = append(del, sp.Name)
				}
				for _, sp := range ports {
					set[sp.Name] = sp
				}
			}
		}
		s.publishDelta(set, del, times)
	}
}

// proxyListWatch lists and watches with kube-proxy's label selector
// (ProxySelector).
func proxyListWatch[L kruntime.Object](list func(context.Context, metav1.ListOptions) (L, error),
	watchWith func(context.Context, metav1.ListOptions) (watch.Interface, error)) *cache.ListWatch {
	selected := func(o metav1.ListOptions) metav1.ListOptions { o.LabelSelector = ProxySelector; return o }
	return &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (kruntime.Object, error) {
			return list(ctx, selected(o))
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			return watchWith(ctx, selected(o))
		},
	}
}

// proxyTrim is the reflector stores' transform: it makes each decoded object into
// what the build reads (cachedService, cachedSlice), and the decoded one is
// dropped. What those keep of the object's strings are copies: the
// namespaces and port names from a table shared by every object, the
// object's own names and resource version cloned (controlplane's Parse
// and ParseFor, metaOf), so that nothing kept holds the span the list's
// strings were decoded into.
//
// Memory per Service was 31.6 KiB at 10k, over kube-proxy's 27.5
// (bench/latest-memory), which caches whole objects; a slice of 10
// endpoints as the EndpointSlice controller writes it held 6.2 KiB as a
// trimmed discoveryv1 object, then 3.3 KiB, a Service as a chart writes it
// 1.9 and 1.0 KiB (BenchmarkCachedObjectBytes); what is kept now, 488 and
// 304 bytes (552 and 432 when the parsed slice and Service were objects of
// their own beside their names, 504 and 384 before a port's rare parts went
// behind a pointer and a slice's trigger time out). The transform once also
// trimmed the decoded objects (new annotation and label maps, shared flags,
// node names and zones), from when the informers kept them: none of that
// is read now, and the maps, kept alive by the list until its end among
// what is kept, left 100 bytes a Service of the heap in use beyond the live
// heap once they went (BenchmarkInitialListHeapInUse, 1115 -> 1014 B;
// issue 16).
type proxyTrim struct {
	node            string // the node whose endpoints the cached slices mark Local
	ignoreNodeHints bool   // Source.IgnoreNodeHints
	mu              sync.Mutex
	strs            map[string]*string // interned; at most maxInterned
}

// maxInterned bounds the intern table: names past it keep their own copy.
// A cluster's namespaces and port names fit many times.
const maxInterned = 1 << 14

func newProxyTrim(nodeName string) *proxyTrim {
	return &proxyTrim{node: nodeName, strs: map[string]*string{}}
}

func (t *proxyTrim) transform(o any) (any, error) {
	switch obj := o.(type) {
	case *corev1.Service:
		t.service(obj)
		return newCachedService(obj), nil
	case *discoveryv1.EndpointSlice:
		t.slice(obj)
		return newCachedSlice(obj, t.node), nil
	}
	return nil, fmt.Errorf("API source: a %T where a Service or an EndpointSlice was expected", o)
}

// cachedMeta is what the source keeps of a cached object's metadata beside
// what it parses: its resource version, to tell a relisted object that did
// not change.
//
// A version that is a decimal number, as an API server on etcd gives them,
// is kept as one, with no string: a short string copied of each object
// was a 16-byte block of the tiny allocator among the decode's garbage,
// and kept that block and the room of its span (issue 16's memory budget).
// Any other version is kept as a copied string.
type cachedMeta struct {
	rv     uint64  // the version as a number (0: none, or in rvText)
	rvText *string // a version that is not a number
}

// metaOf is what the cache keeps of m: its resource version, as a number
// or copied: not the decoded object's own string, since one string kept
// of an object decoded from a list keeps the span it was decoded into,
// and with it the room of every string of the list decoded beside it
// (BenchmarkInitialListHeapInUse).
func metaOf(m *metav1.ObjectMeta) cachedMeta {
	v := m.ResourceVersion
	if n, ok := decimalVersion(v); ok {
		return cachedMeta{rv: n}
	}
	if v == "" {
		return cachedMeta{}
	}
	c := strings.Clone(v)
	return cachedMeta{rvText: &c}
}

// decimalVersion is v as a number when it is written as one would write
// that number (no sign, no leading zero) and is neither 0 nor past
// uint64: then the number says exactly what the string did.
func decimalVersion(v string) (uint64, bool) {
	if v == "" || v[0] == '0' || len(v) > 19 {
		return 0, false
	}
	var n uint64
	for i := 0; i < len(v); i++ {
		c := v[i]
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + uint64(c-'0')
	}
	return n, true
}

// version is the resource version as the object had it ("": none).
func (m cachedMeta) version() string {
	switch {
	case m.rv != 0:
		return strconv.FormatUint(m.rv, 10)
	case m.rvText != nil:
		return *m.rvText
	}
	return ""
}

// sameVersion says m and o have one resource version, and have one.
func (m cachedMeta) sameVersion(o cachedMeta) bool {
	if m.rv != 0 || o.rv != 0 {
		return m.rv == o.rv
	}
	return m.rvText != nil && o.rvText != nil && *m.rvText == *o.rvText
}

// cachedService is what the source keeps of a Service: its ports
// as the build reads them, built and checked once (controlplane.Service),
// whose names its keys are made of. A Service as a chart writes it held 1
// KiB as a trimmed corev1 object.
type cachedService struct {
	cachedMeta
	controlplane.Service
	// clusterIP: kube-proxy skips a Service without one (no ports, no
	// problem reported).
	clusterIP bool
}

func newCachedService(svc *corev1.Service) *cachedService {
	c := &cachedService{cachedMeta: metaOf(&svc.ObjectMeta), clusterIP: svc.Spec.ClusterIP != ""}
	c.Service.Parse(svc)
	return c
}

// cachedSlice is what the source keeps of an EndpointSlice: the
// slice as the build reads it, parsed and checked once
// (controlplane.Slice), whose names its keys are made of and whose
// endpoint lists the snapshot shares. A slice of 10 endpoints as the
// EndpointSlice controller writes it held 3.3 KiB as a trimmed discoveryv1
// object, and the snapshot a copy of its endpoints besides
// (BenchmarkCachedObjectBytes). Its last-change-trigger-time is read as it
// arrives (triggerOf) and not kept: 16 bytes of every slice (issue 16's
// memory budget).
type cachedSlice struct {
	cachedMeta
	controlplane.Slice
}

func newCachedSlice(sl *discoveryv1.EndpointSlice, nodeName string) *cachedSlice {
	c := &cachedSlice{cachedMeta: metaOf(&sl.ObjectMeta)}
	c.Slice.ParseFor(sl, nodeName)
	return c
}

// triggerOf is sl's endpoints.kubernetes.io/last-change-trigger-time with
// its address family (the zero Trigger: none, or not a time).
func triggerOf(sl *discoveryv1.EndpointSlice) controlplane.Trigger {
	v := sl.Annotations[corev1.EndpointsLastChangeTriggerTime]
	if v == "" {
		return controlplane.Trigger{}
	}
	at, err := time.Parse(time.RFC3339Nano, v)
	if err != nil || at.UnixNano() <= 0 {
		return controlplane.Trigger{}
	}
	family := "IPv4"
	if sl.AddressType == discoveryv1.AddressTypeIPv6 {
		family = "IPv6"
	}
	return controlplane.Trigger{Family: family, At: at}
}

// service interns svc's namespace and port names, which its cachedService
// keeps.
func (t *proxyTrim) service(svc *corev1.Service) {
	t.mu.Lock()
	defer t.mu.Unlock()
	svc.Namespace = *t.intern(&svc.Namespace)
	for i := range svc.Spec.Ports {
		p := &svc.Spec.Ports[i]
		p.Name = *t.intern(&p.Name)
	}
}

// slice interns sl's namespace and port names, which its cachedSlice keeps.
func (t *proxyTrim) slice(sl *discoveryv1.EndpointSlice) {
	t.mu.Lock()
	defer t.mu.Unlock()
	sl.Namespace = *t.intern(&sl.Namespace)
	for i := range sl.Ports {
		if p := &sl.Ports[i]; p.Name != nil {
			p.Name = t.intern(p.Name)
		}
	}
	if t.ignoreNodeHints {
		controlplane.DropNodeHints(sl)
	}
}

// intern returns the table's pointer to *s's value, adding a copy of it
// if the table has room (never s itself: a pointer into an object, such as
// &sl.Namespace, would keep the whole object alive, and not its bytes
// either: they would keep the span they were decoded into); t.mu is held.
func (t *proxyTrim) intern(s *string) *string {
	if shared, ok := t.strs[*s]; ok {
		return shared
	}
	if len(t.strs) < maxInterned {
		v := strings.Clone(*s) // not the decoded object's string (see metaOf)
		t.strs[v] = &v
		return &v
	}
	return s
}

// dropEmpty takes key's state out of bySvc when it holds nothing;
// slicesMu is held.
func (s *Source) dropEmpty(key serviceKey, st *serviceState) {
	if st.svc == nil && len(st.slices) == 0 && len(st.built) == 0 {
		s.bySvc.del(key)
	}
}

// builtOf is key's ports as last built.
func (s *Source) builtOf(key serviceKey) []*lb.ServicePort {
	s.slicesMu.Lock()
	defer s.slicesMu.Unlock()
	if st := s.bySvc.get(key); st != nil {
		return st.built
	}
	return nil
}

// setBuilt keeps ports as key's ports last built.
func (s *Source) setBuilt(key serviceKey, ports []*lb.ServicePort) {
	s.slicesMu.Lock()
	defer s.slicesMu.Unlock()
	if s.bySvc.get(key) == nil && len(ports) == 0 {
		return
	}
	st := s.stateFor(key)
	st.built = ports
	s.dropEmpty(key, st)
}

// stateOf is key's Service (nil: none held) and slices, as the last
// events left them.
func (s *Source) stateOf(key serviceKey) (*cachedService, []*controlplane.Slice) {
	s.slicesMu.Lock()
	defer s.slicesMu.Unlock()
	st := s.bySvc.get(key)
	if st == nil {
		return nil, nil
	}
	out := make([]*controlplane.Slice, len(st.slices))
	for i, cs := range st.slices {
		out[i] = &cs.Slice
	}
	return st.svc, out
}

func (s *Source) mark(key serviceKey, endpoints bool) {
	s.mu.Lock()
	c := s.pending[key]
	if c == nil {
		c = &pendingChange{arrived: s.now()}
		s.pending[key] = c
	}
	if endpoints && !c.endpoints {
		c.endpoints = true
		s.epPending++
	} else if !endpoints && !c.service {
		c.service = true
		s.svcPending++
	}
	s.mu.Unlock()
	s.Sink.Queued()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

func (s *Source) hasDirty() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.pending) > 0
}

func (s *Source) takeDirty() (map[serviceKey]*pendingChange, controlplane.UpdateTimes) {
	s.mu.Lock()
	d := s.pending
	s.pending, s.svcPending, s.epPending = map[serviceKey]*pendingChange{}, 0, 0
	times := controlplane.UpdateTimes{Triggers: s.triggers}
	for _, c := range d {
		times.Arrived = append(times.Arrived, c.arrived)
	}
	s.triggers = nil
	if s.Changes != nil {
		s.Changes.ChangesTaken() // under mu: a later event's count is not overwritten
	}
	s.mu.Unlock()
	return d, times
}

// noteTrigger keeps an EndpointSlice's last-change-trigger-time, when it
// has one from after the source started (kube-proxy ignores older ones
// too: they would measure the proxy's start-up, not the change).
func (s *Source) noteTrigger(tr controlplane.Trigger) {
	if tr.At.IsZero() {
		return
	}
	s.mu.Lock()
	if tr.At.After(s.started) {
		s.triggers = append(s.triggers, tr)
	}
	s.mu.Unlock()
}

// counted tells Changes of one Service (or EndpointSlice) event.
func (s *Source) counted(endpoints bool) {
	if s.Changes == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if endpoints {
		s.Changes.EndpointsChanged(s.epPending)
	} else {
		s.Changes.ServiceChanged(s.svcPending)
	}
}

// markService marks key's Service after a Service event, and counts the
// event.
func (s *Source) markService(key serviceKey) {
	s.mark(key, false)
	s.counted(false)
}

// markSlice marks the Service sl is labelled for after an EndpointSlice
// event, or reports a slice that names none. The event is counted by the
// caller: one event may mark two Services (a slice relabelled).
func (s *Source) markSlice(sl *cachedSlice) {
	if name := sl.Slice.Service; name != "" {
		s.mark(serviceKey{sl.Namespace, name}, true)
	} else {
		s.report(serviceKey{sl.Namespace, "\x00slice/" + sl.Name}, &controlplane.ManifestError{
			Object: "EndpointSlice " + sl.Namespace + "/" + sl.Name, Field: "metadata.labels[" + discoveryv1.LabelServiceName + "]",
			Err: errors.New("missing: it names the Service this slice belongs to; slice ignored")})
	}
}

// watchServiceCIDRs hands every change of the cluster's ServiceCIDR
// objects to s.ServiceCIDRs (all their ranges, by object name), when the
// API server serves them (networking.k8s.io/v1, Kubernetes 1.33 and later;
// an older server has none and nothing is watched).
func (s *Source) watchServiceCIDRs(ctx context.Context) (cache.InformerSynced, error) {
	res, err := s.Client.Discovery().ServerResourcesForGroupVersion("networking.k8s.io/v1")
	if err != nil || !slices.ContainsFunc(res.APIResources, func(r metav1.APIResource) bool { return r.Name == "servicecidrs" }) {
		s.log().Info("the API server has no ServiceCIDRs; traffic to unallocated cluster IPs is not dropped", "err", err)
		return nil, nil
	}
	factory := informers.NewSharedInformerFactory(s.Client, s.Resync)
	inf := factory.Networking().V1().ServiceCIDRs().Informer()
	if err := inf.SetWatchErrorHandlerWithContext(func(_ context.Context, _ *cache.Reflector, err error) {
		s.log().Warn("API watch failed; serving the last known state and retrying", "resource", "servicecidrs", "err", err)
	}); err != nil {
		return nil, err
	}
	changed := func() {
		objs := inf.GetStore().List()
		slices.SortFunc(objs, func(a, b any) int {
			return strings.Compare(a.(*networkingv1.ServiceCIDR).Name, b.(*networkingv1.ServiceCIDR).Name)
		})
		var cidrs []netip.Prefix
		for _, o := range objs {
			for _, c := range o.(*networkingv1.ServiceCIDR).Spec.CIDRs {
				if pf, err := netip.ParsePrefix(c); err == nil && !slices.Contains(cidrs, pf.Masked()) {
					cidrs = append(cidrs, pf.Masked())
				}
			}
		}
		s.ServiceCIDRs(cidrs)
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { changed() },
		UpdateFunc: func(_, _ any) { changed() },
		DeleteFunc: func(any) { changed() },
	}); err != nil {
		return nil, err
	}
	factory.Start(ctx.Done())
	go func() { <-ctx.Done(); factory.Shutdown() }()
	return inf.HasSynced, nil
}

// zoneOf is the Node's zone as last seen ("": none yet).
func (s *Source) zoneOf() string {
	if z := s.zone.Load(); z != nil {
		return *z
	}
	return ""
}

func (s *Source) node(o any) {
	n, ok := o.(*corev1.Node)
	if !ok {
		return
	}
	if zone := n.Labels[corev1.LabelTopologyZone]; zone != s.zoneOf() {
		// kube-proxy's proxiers resync on a change of the Node's topology
		// labels: every Service is built again with the zone.
		s.zone.Store(&zone)
		s.slicesMu.Lock()
		var keys []serviceKey
		for key := range s.bySvc.all() {
			keys = append(keys, key)
		}
		s.slicesMu.Unlock()
		for _, key := range keys {
			s.mark(key, true)
		}
	}
	if s.NodePodCIDRs != nil {
		s.NodePodCIDRs(controlplane.PodCIDRs(n))
	}
	if s.NodeEligible != nil {
		s.NodeEligible(controlplane.NodeEligible(n))
	}
	if s.NodeZone != nil {
		s.NodeZone(n.Labels[corev1.LabelTopologyZone])
	}
}

// rebuild recomputes one Service from what the source holds: its ports as
// last built before (old) and now, and whether they changed.
func (s *Source) rebuild(key serviceKey) (old, ports []*lb.ServicePort, changed bool) {
	var errs []error
	svc, eps := s.stateOf(key)
	if svc != nil {
		if svc.clusterIP { // kube-proxy skips Services without a ClusterIP
			ports, errs = controlplane.BuildService(&svc.Service, eps, s.NodeName, s.zoneOf())
		}
	} else if len(eps) > 0 {
		for _, sl := range eps {
			errs = append(errs, &controlplane.ManifestError{Object: "EndpointSlice " + sl.Namespace + "/" + sl.Name,
				Field: "metadata.labels[" + discoveryv1.LabelServiceName + "]",
				Err:   fmt.Errorf("the Service %s/%s is not found; slice ignored until it exists", key.ns, key.name)})
		}
	}
	s.report(key, errors.Join(errs...))
	old = s.builtOf(key)
	if reflect.DeepEqual(old, ports) {
		return old, old, false // the same ports: the published ones stay, pointers and all
	}
	s.setBuilt(key, ports)
	return old, ports, len(old) > 0 || len(ports) > 0
}

// report tells Skipped about a problem of one key once, and again only when
// it changes; a key whose problem is gone is forgotten.
func (s *Source) report(key serviceKey, err error) {
	s.mu.Lock()
	if err == nil {
		delete(s.problems, key)
		s.mu.Unlock()
		return
	}
	msg := err.Error()
	if s.problems[key] == msg {
		s.mu.Unlock()
		return
	}
	s.problems[key] = msg
	s.mu.Unlock()
	s.log().Error("Kubernetes object skipped", "err", msg)
	if s.Skipped != nil {
		s.Skipped(err)
	}
}

func (s *Source) publish(changed bool, times controlplane.UpdateTimes) {
	if !changed && s.last != nil {
		s.Sink.Unchanged()
		return
	}
	s.slicesMu.Lock()
	all := make(map[lb.ServicePortName]*lb.ServicePort, s.bySvc.len())
	for _, st := range s.bySvc.all() {
		for _, sp := range st.built {
			all[sp.Name] = sp
		}
	}
	s.slicesMu.Unlock()
	snap := lb.NewSnapshot(all)
	snap.ID = s.nextID()
	s.last = snap
	controlplane.PublishTo(s.Sink, snap, times)
}

// publishDelta publishes the last snapshot with the ports in set added or
// replaced and those in del removed, saying so (Base, Changed).
func (s *Source) publishDelta(set map[lb.ServicePortName]*lb.ServicePort, del []lb.ServicePortName, times controlplane.UpdateTimes) {
	if len(set) == 0 && len(del) == 0 {
		s.Sink.Unchanged()
		return
	}
	snap := s.last.With(set, del)
	snap.ID = s.nextID()
	s.last = snap
	controlplane.PublishTo(s.Sink, snap, times)
}

func (s *Source) nextID() uint64 {
	s.ids++
	return s.ids
}
