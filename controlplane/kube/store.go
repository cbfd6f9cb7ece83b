package kube

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/clock"

	"github.com/sluice-proxy/sluice/controlplane"
)

// reflectorStore is where a client-go Reflector puts the Services or the
// EndpointSlices it lists and watches: each object made into what the
// source keeps (proxyTrim), held in the source's own map (bySvc) and its
// Service marked for a build, on the reflector's goroutine.
//
// There is no informer between them. A shared informer keeps a store of
// its own beside the source's map, keyed by a "namespace/name" string,
// and a queue whose first list's array it keeps until as many events
// again have come; and it hands each event through that queue and a
// channel per handler, two goroutines more, to the handler that marks the
// Service (issue 16: memory per Service, and the time from the watch to
// the build).
type reflectorStore struct {
	s      *Source
	trim   *proxyTrim
	slices bool // EndpointSlices; else Services
	synced chan struct{}
	once   sync.Once
}

func newReflectorStore(s *Source, trim *proxyTrim, slices bool) *reflectorStore {
	return &reflectorStore{s: s, trim: trim, slices: slices, synced: make(chan struct{})}
}

// hasSynced says whether the first list has been taken.
func (r *reflectorStore) hasSynced() bool {
	select {
	case <-r.synced:
		return true
	default:
		return false
	}
}

// Add takes a watch's new object: one the source does not have.
func (r *reflectorStore) Add(o any) error { return r.put(o, true) }

// Update takes a watch's changed object.
func (r *reflectorStore) Update(o any) error { return r.put(o, false) }

func (r *reflectorStore) put(o any, added bool) error {
	c, tr, err := r.keep(o)
	switch c := c.(type) {
	case *cachedService:
		r.s.putService(c)
	case *cachedSlice:
		r.s.putSlice(c, tr, added)
	}
	return err
}

// keep makes a decoded object into what the source keeps of it
// (proxyTrim), and reads a slice's last-change-trigger-time, which is not
// kept.
func (r *reflectorStore) keep(o any) (any, controlplane.Trigger, error) {
	var tr controlplane.Trigger
	if sl, ok := o.(*discoveryv1.EndpointSlice); ok {
		tr = triggerOf(sl)
	}
	c, err := r.trim.transform(o)
	return c, tr, err
}

// Delete takes a watch's deleted object, in its last state.
func (r *reflectorStore) Delete(o any) error {
	switch obj := o.(type) {
	case *corev1.Service:
		r.s.deleteService(serviceKey{obj.Namespace, obj.Name})
	case *discoveryv1.EndpointSlice:
		r.s.deleteSlice(obj.Namespace, obj.Name, obj.Labels[discoveryv1.LabelServiceName])
	default:
		return fmt.Errorf("API source: a watch deleted a %T", o)
	}
	return nil
}

// Replace takes a whole list, the first or a later one (a relist, after a
// watch could not go on): what the source holds and the list does not is
// deleted, and an object at the resource version held is left as it is,
// its Service not marked (one without a resource version is taken as
// changed).
func (r *reflectorStore) Replace(list []any, _ string) error {
	var services []*cachedService
	var slices []*cachedSlice
	var triggers []controlplane.Trigger
	var errs []error
	for i, o := range list {
		c, tr, err := r.keep(o)
		switch c := c.(type) {
		case *cachedService:
			services = append(services, c)
		case *cachedSlice:
			slices = append(slices, c)
			triggers = append(triggers, tr)
		}
		if err != nil {
			errs = append(errs, err)
		}
		list[i] = nil // the decoded object goes as soon as nothing else holds it
	}
	if r.slices {
		r.s.replaceSlices(slices, triggers)
	} else {
		r.s.replaceServices(services)
	}
	r.once.Do(func() { close(r.synced) })
	return errors.Join(errs...)
}

// Resync does nothing. An informer's resync hands every cached object to
// its handlers again; what the source builds is made from what it holds
// alone, so building it again would give the same ports (kube-proxy's
// change trackers find no change in a resync either).
func (r *reflectorStore) Resync() error { return nil }

// reflect lists and watches into store until ctx ends, as a Reflector's
// own Run does (its back-off between tries: 0.8 s doubling to 30 s,
// jittered, reset after two minutes without a failure), and warns of
// each failure.
func (s *Source) reflect(ctx context.Context, what string, r *cache.Reflector) {
	delay := wait.Backoff{Duration: 800 * time.Millisecond, Factor: 2, Jitter: 1, Steps: math.MaxInt32, Cap: 30 * time.Second}.
		DelayWithReset(clock.RealClock{}, 2*time.Minute)
	_ = delay.Until(ctx, true, true, func(ctx context.Context) (bool, error) {
		if err := r.ListAndWatchWithContext(ctx); err != nil {
			s.log().Warn("API watch failed; serving the last known state and retrying", "resource", what, "err", err)
		}
		return false, nil
	})
}

// stateFor is key's entry in bySvc, made if missing; slicesMu is held.
func (s *Source) stateFor(key serviceKey) *serviceState {
	st := s.bySvc.get(key)
	if st == nil {
		st = &serviceState{}
		s.bySvc.put(key, st)
	}
	return st
}

// putService keeps c as its Service and marks the Service.
func (s *Source) putService(c *cachedService) {
	key := serviceKey{c.Namespace, c.Name}
	s.slicesMu.Lock()
	s.stateFor(key).svc = c
	s.slicesMu.Unlock()
	s.markService(key)
}

// deleteService forgets key's Service and marks it, if it was held.
func (s *Source) deleteService(key serviceKey) {
	s.slicesMu.Lock()
	st := s.bySvc.get(key)
	held := st != nil && st.svc != nil
	if held {
		st.svc = nil
		s.dropEmpty(key, st)
	}
	s.slicesMu.Unlock()
	if held {
		s.markService(key)
	}
}

// replaceServices makes list the Services held, marking each one added,
// changed or gone.
func (s *Source) replaceServices(list []*cachedService) {
	var marks []serviceKey
	s.slicesMu.Lock()
	listed := make(map[serviceKey]bool, len(list))
	for _, c := range list {
		key := serviceKey{c.Namespace, c.Name}
		listed[key] = true
		st := s.stateFor(key)
		if st.svc != nil && st.svc.sameVersion(c.cachedMeta) {
			continue
		}
		st.svc = c
		marks = append(marks, key)
	}
	for key, st := range s.bySvc.all() {
		if st.svc != nil && !listed[key] {
			st.svc = nil
			s.dropEmpty(key, st)
			marks = append(marks, key)
		}
	}
	s.slicesMu.Unlock()
	for _, key := range marks {
		s.markService(key)
	}
}

// putSlice keeps c among its Service's slices, in place of the slice of
// its name held before, and marks the Services it left and joined. added
// says the watch called it new: it is looked for only under its own
// Service, where a changed one is looked for among every Service's too
// (its label may have changed, or it had none).
func (s *Source) putSlice(c *cachedSlice, tr controlplane.Trigger, added bool) {
	s.slicesMu.Lock()
	old := s.takeSlice(c.Namespace, c.Name, c.Slice.Service, !added)
	if c.Slice.Service != "" {
		st := s.stateFor(serviceKey{c.Namespace, c.Slice.Service})
		st.slices = append(st.slices, c)
	}
	s.slicesMu.Unlock()
	s.noteTrigger(tr)
	if old != nil && old.Slice.Service != c.Slice.Service {
		s.markSlice(old)
	}
	s.markSlice(c)
	s.counted(true)
}

// deleteSlice forgets the slice ns/name, last labelled for the Service
// named svc, and marks the Service it was held under.
func (s *Source) deleteSlice(ns, name, svc string) {
	s.slicesMu.Lock()
	old := s.takeSlice(ns, name, svc, true)
	s.slicesMu.Unlock()
	if old != nil {
		s.markSlice(old)
	}
	s.counted(true)
}

// takeSlice removes the slice ns/name from the slices held and returns it
// (nil: not held). It is looked for among the Service svc's first, then,
// with everywhere, among every Service's of the namespace: a walk of the
// namespace's, for a slice whose label changed, which the EndpointSlice
// controller never does. slicesMu is held.
func (s *Source) takeSlice(ns, name, svc string, everywhere bool) *cachedSlice {
	take := func(key serviceKey, st *serviceState) *cachedSlice {
		i := slices.IndexFunc(st.slices, func(c *cachedSlice) bool { return c.Name == name })
		if i < 0 {
			return nil
		}
		old := st.slices[i]
		st.slices = slices.Delete(st.slices, i, i+1)
		s.dropEmpty(key, st)
		return old
	}
	if svc != "" {
		key := serviceKey{ns, svc}
		if st := s.bySvc.get(key); st != nil {
			if old := take(key, st); old != nil {
				return old
			}
		}
	}
	if !everywhere {
		return nil
	}
	for name, st := range s.bySvc.byNS[ns] {
		if old := take(serviceKey{ns, name}, st); old != nil {
			return old
		}
	}
	return nil
}

// replaceSlices makes list the slices held, marking the Services of each
// one added, changed or gone; triggers are the list's
// last-change-trigger-times, one for each.
func (s *Source) replaceSlices(list []*cachedSlice, triggers []controlplane.Trigger) {
	var changed, relabelled, gone []*cachedSlice
	var changedTriggers []controlplane.Trigger
	s.slicesMu.Lock()
	held := map[serviceKey]*cachedSlice{} // by namespace and slice name
	for _, st := range s.bySvc.all() {
		for _, c := range st.slices {
			held[serviceKey{c.Namespace, c.Name}] = c
		}
	}
	for i, c := range list {
		name := serviceKey{c.Namespace, c.Name}
		old := held[name]
		delete(held, name)
		if old != nil && old.sameVersion(c.cachedMeta) {
			continue
		}
		if old != nil {
			s.takeSlice(old.Namespace, old.Name, old.Slice.Service, false)
			if old.Slice.Service != c.Slice.Service {
				relabelled = append(relabelled, old)
			}
		}
		if c.Slice.Service != "" {
			st := s.stateFor(serviceKey{c.Namespace, c.Slice.Service})
			st.slices = append(st.slices, c)
		}
		changed = append(changed, c)
		changedTriggers = append(changedTriggers, triggers[i])
	}
	for _, old := range held {
		s.takeSlice(old.Namespace, old.Name, old.Slice.Service, false)
		gone = append(gone, old)
	}
	s.slicesMu.Unlock()
	for i, c := range changed {
		s.noteTrigger(changedTriggers[i])
		s.markSlice(c)
		s.counted(true)
	}
	for _, old := range relabelled {
		s.markSlice(old)
	}
	for _, old := range gone {
		s.markSlice(old)
		s.counted(true)
	}
}
