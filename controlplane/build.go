package controlplane

import (
	"bytes"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"
	"unique"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/sluice-proxy/sluice/lb"
)

// ServiceNameLabel is the label that ties an EndpointSlice to its Service.
const ServiceNameLabel = discoveryv1.LabelServiceName

// maxAffinitySeconds is the API server's upper bound for the ClientIP timeout.
const maxAffinitySeconds = 86400

type objErr struct {
	origin string // the file it came from; empty for API objects
	id     string
	errors []error
}

func (e *objErr) add(field string, format string, a ...any) {
	e.errors = append(e.errors, &ManifestError{File: e.origin, Object: e.id, Field: field, Err: fmt.Errorf(format, a...)})
}

type svcKey struct{ ns, name string }

// Build validates the objects and turns them into a Snapshot. Every problem
// is reported, each naming file, object and field; on any problem no
// snapshot is returned, so a bad update never replaces a good state.
//
// Services of type ExternalName and with clusterIP None are skipped, as
// kube-proxy skips them. Unlike in a cluster, a manifest Service may omit its
// clusterIP (there is no allocator); its NodePorts and external IPs are still
// served.
func Build(objs *Objects) (*lb.Snapshot, error) { return BuildFor(objs, "") }

// BuildFor is Build for the node named nodeName: endpoints on that node are
// marked local, which internalTrafficPolicy and externalTrafficPolicy Local
// select. An empty nodeName marks none local. The slices' zone hints are
// read for the zone of the node's Node object, when the load found one
// (Objects.NodeZone).
func BuildFor(objs *Objects, nodeName string) (*lb.Snapshot, error) {
	return buildFull(objs, nodeName, nil)
}

// BuildMemo lets a reload reuse what the last one built: a Service whose
// object and contributing EndpointSlices and Endpoints are the very same
// (the DocCache hands back the same decoded objects for unchanged
// documents, and never mutates them) keeps its *lb.ServicePort values, so
// the snapshot comparison and the data plane skip it by pointer. A reload
// of 10k services after a one-endpoint edit then builds one Service.
//
// Its snapshots are deltas (issue 16): each names the one it last built as
// its Base and lists the ports that changed, so the data planes apply
// O(changed) work; a build that changes nothing returns the last snapshot
// itself.
type BuildMemo struct {
	// Reserved are the host ports sluice itself holds, which no NodePort
	// may take.
	Reserved []HostPort
	nodeName string
	zone     string // the zone the last build was for (Objects.NodeZone)
	prev     map[svcKey]memoService
	last     *lb.Snapshot // what prev built
	seq      uint64       // the last snapshot ID given
	// What the last build read, for builds that change a few objects in
	// place: the objects in load order (each Service's slices and
	// Endpoints are in prev).
	lastServices []*Service
	lastSlices   []*Slice
	//lint:ignore SA1019 v1 Endpoints are read on purpose, for older manifests
	lastEndpoints []*corev1.Endpoints
	inPlace       int // builds buildInPlace did, for tests
	spliced       int // and buildSpliced
}

// inPlaceLimit is how many changed objects a build takes in place; more,
// and it builds the maps again.
const inPlaceLimit = 64

// buildInPlace is Build when the load holds the same objects as the last
// build, in the same order, with a few of them replaced by new versions
// under the same names (and, for slices, the same Service): only the
// Services those touch are rebuilt, and the last build's maps are updated
// rather than made again (at 10k Services they were most of a reload). ok
// is false when the load is not such a change, or a rebuilt Service has a
// problem: Build then does it the long way, which reports it.
func (m *BuildMemo) buildInPlace(objs *Objects) (snap *lb.Snapshot, ok bool, err error) {
	if m.last == nil || m.prev == nil || len(objs.Services) != len(m.lastServices) ||
		len(objs.EndpointSlices) != len(m.lastSlices) || len(objs.Endpoints) != len(m.lastEndpoints) {
		return nil, false, nil
	}
	changed := map[svcKey][]any{} // the Service's new sources list, once made
	svcs := map[svcKey]*Service{}
	n := 0
	for i, svc := range objs.Services {
		if old := m.lastServices[i]; svc != old {
			if svc.Namespace != old.Namespace || svc.Name != old.Name {
				return nil, false, nil
			}
			k := svcKey{svc.Namespace, svc.Name}
			svcs[k] = svc
			if _, seen := changed[k]; !seen {
				changed[k] = m.prev[k].sources
			}
			if n++; n > inPlaceLimit {
				return nil, false, nil
			}
		}
	}
	replace := func(k svcKey, old, new any) bool {
		list, seen := changed[k]
		if !seen {
			list = m.prev[k].sources
		}
		i := slices.Index(list, old)
		if i < 0 {
			return false
		}
		list = slices.Clone(list)
		list[i] = new
		changed[k] = list
		return true
	}
	for i, sl := range objs.EndpointSlices {
		if old := m.lastSlices[i]; sl != old {
			if sl.Namespace != old.Namespace || sl.Name != old.Name || sl.Service != old.Service {
				return nil, false, nil
			}
			if !replace(svcKey{sl.Namespace, sl.Service}, old, sl) {
				return nil, false, nil
			}
			if n++; n > inPlaceLimit {
				return nil, false, nil
			}
		}
	}
	for i, ep := range objs.Endpoints {
		if old := m.lastEndpoints[i]; ep != old {
			if ep.Namespace != old.Namespace || ep.Name != old.Name || !replace(svcKey{ep.Namespace, ep.Name}, old, ep) {
				return nil, false, nil
			}
			if n++; n > inPlaceLimit {
				return nil, false, nil
			}
		}
	}
	if len(changed) == 0 {
		return m.last, true, nil
	}
	next := make(map[svcKey]*Service, len(changed))
	for k := range changed {
		p, had := m.prev[k]
		if !had {
			return nil, false, nil
		}
		next[k] = p.svc
		if s := svcs[k]; s != nil {
			next[k] = s
		}
	}
	snap, ok, err = m.rebuild(objs, next, changed)
	if ok && err == nil {
		m.inPlace++
	}
	return snap, ok, err
}

// rebuild ends a short-way build: each Service of next (nil: none of
// that name now) is built again from its sources, the last snapshot
// takes the changes, and the memo takes them and objs' lists. ok is false
// when a Service has a problem, or sources name one that is gone (the
// long way reports it); an error is a NodePort conflict, and leaves the
// memo as it was.
func (m *BuildMemo) rebuild(objs *Objects, next map[svcKey]*Service, sources map[svcKey][]any) (snap *lb.Snapshot, ok bool, err error) {
	set := map[lb.ServicePortName]*lb.ServicePort{}
	var del []lb.ServicePortName
	built := make(map[svcKey]memoService, len(next))
	var gone []svcKey
	for k, svc := range next {
		p, had := m.prev[k]
		if svc == nil && len(sources[k]) > 0 {
			return nil, false, nil
		}
		if had {
			for _, sp := range p.ports {
				del = append(del, sp.Name) // rebuilt or gone: its old ports go, its new ones come in set
			}
		}
		if svc == nil {
			if had {
				gone = append(gone, k)
			}
			continue
		}
		ms, ok := buildMemoService(svc, sources[k], m.nodeName, m.zone)
		if !ok {
			return nil, false, nil
		}
		for _, sp := range ms.ports {
			set[sp.Name] = sp
		}
		built[k] = ms
	}
	snap = m.last.With(set, del)
	if err := checkNodePorts(snap, objs, m.Reserved); err != nil {
		return nil, true, err
	}
	for k, ms := range built {
		m.prev[k] = ms
	}
	for _, k := range gone {
		delete(m.prev, k)
	}
	m.lastServices, m.lastSlices, m.lastEndpoints = objs.Services, objs.EndpointSlices, objs.Endpoints
	m.seq++
	snap.ID = m.seq
	m.last = snap
	return snap, true, nil
}

// splice returns the run of old that new replaced: old and new are the
// same but for old[i:j] replaced by new[i:k] (any of them empty).
func splice[T comparable](old, new []T) (i, j, k int) {
	for i < len(old) && i < len(new) && old[i] == new[i] {
		i++
	}
	j, k = len(old), len(new)
	for j > i && k > i && old[j-1] == new[k-1] {
		j, k = j-1, k-1
	}
	return i, j, k
}

// buildSpliced is Build when the load holds the last build's objects with
// one run of them replaced by another, as when a manifest file comes or
// goes, or a document is added to or removed from one (buildInPlace takes
// only replacements in place, the lists keeping their lengths): only the
// Services that run touches are rebuilt. Finding their slices and
// Endpoints again is one pass over those lists without building any map
// of them; at 50,000 Services a file added went through the long way's
// maps, some 115 ms, for one Service. ok is false when the run is longer
// than inPlaceLimit or a touched Service has a problem (Build then does
// it the long way, which reports it).
func (m *BuildMemo) buildSpliced(objs *Objects) (snap *lb.Snapshot, ok bool, err error) {
	if m.last == nil || m.prev == nil {
		return nil, false, nil
	}
	si, sj, sk := splice(m.lastServices, objs.Services)
	li, lj, lk := splice(m.lastSlices, objs.EndpointSlices)
	ei, ej, ek := splice(m.lastEndpoints, objs.Endpoints)
	if (sj-si)+(sk-si)+(lj-li)+(lk-li)+(ej-ei)+(ek-ei) > inPlaceLimit {
		return nil, false, nil
	}
	touched := map[svcKey]bool{}
	svcs := map[svcKey]*Service{} // the Services now among the run's
	for _, svc := range m.lastServices[si:sj] {
		touched[svcKey{svc.Namespace, svc.Name}] = true
	}
	for _, svc := range objs.Services[si:sk] {
		k := svcKey{svc.Namespace, svc.Name}
		touched[k], svcs[k] = true, svc
	}
	for _, sl := range slices.Concat(m.lastSlices[li:lj], objs.EndpointSlices[li:lk]) {
		touched[svcKey{sl.Namespace, sl.Service}] = true
	}
	for _, ep := range slices.Concat(m.lastEndpoints[ei:ej], objs.Endpoints[ei:ek]) {
		touched[svcKey{ep.Namespace, ep.Name}] = true
	}
	if len(touched) == 0 {
		return m.last, true, nil
	}
	// The touched Services' slices, then Endpoints, in load order, as the
	// long way gathers them.
	sources := make(map[svcKey][]any, len(touched))
	for _, sl := range objs.EndpointSlices {
		if k := (svcKey{sl.Namespace, sl.Service}); touched[k] {
			sources[k] = append(sources[k], sl)
		}
	}
	for _, ep := range objs.Endpoints {
		if k := (svcKey{ep.Namespace, ep.Name}); touched[k] {
			sources[k] = append(sources[k], ep)
		}
	}
	next := make(map[svcKey]*Service, len(touched))
	for k := range touched {
		next[k] = svcs[k]
		if p, had := m.prev[k]; next[k] == nil && had && !slices.Contains(m.lastServices[si:sj], p.svc) {
			next[k] = p.svc // outside the run: still there
		}
	}
	snap, ok, err = m.rebuild(objs, next, sources)
	if ok && err == nil {
		m.spliced++
	}
	return snap, ok, err
}

type memoService struct {
	svc     *Service
	sources []any // its slices, then its Endpoints, in load order
	ports   []*lb.ServicePort
}

// Build is BuildFor(objs, nodeName) with the memo. On any problem it
// returns what BuildFor returns, every problem reported in BuildFor's
// order, and the memo is left as it was.
func (m *BuildMemo) Build(objs *Objects, nodeName string) (*lb.Snapshot, error) {
	if m.nodeName != nodeName || m.zone != objs.zone() {
		// Every Service is built again for another node or zone, as
		// kube-proxy's proxiers resync on a change of the Node's topology
		// labels; the snapshot is a whole one.
		m.nodeName, m.zone, m.prev, m.last = nodeName, objs.zone(), nil, nil
	}
	if snap, ok, err := m.buildInPlace(objs); ok {
		return snap, err
	}
	if snap, ok, err := m.buildSpliced(objs); ok {
		return snap, err
	}
	known := make(map[svcKey]bool, len(objs.Services))
	for _, svc := range objs.Services {
		known[svcKey{svc.Namespace, svc.Name}] = true
	}
	sources := make(map[svcKey][]any, len(objs.Services))
	for _, sl := range objs.EndpointSlices {
		k := svcKey{sl.Namespace, sl.Service}
		if k.name == "" || !known[k] {
			return buildFull(objs, nodeName, m.Reserved) // an error: reported there
		}
		sources[k] = append(sources[k], sl)
	}
	for _, ep := range objs.Endpoints {
		k := svcKey{ep.Namespace, ep.Name}
		if !known[k] {
			return buildFull(objs, nodeName, m.Reserved)
		}
		sources[k] = append(sources[k], ep)
	}
	// set holds the ports of the Services built anew; the rest are the
	// last snapshot's, shared.
	set := map[lb.ServicePortName]*lb.ServicePort{}
	var del []lb.ServicePortName
	next := make(map[svcKey]memoService, len(objs.Services))
	for _, svc := range objs.Services {
		k := svcKey{svc.Namespace, svc.Name}
		p, had := m.prev[k]
		if had && p.svc == svc && slices.Equal(p.sources, sources[k]) {
			next[k] = p
			continue
		}
		if had {
			for _, sp := range p.ports {
				del = append(del, sp.Name) // rebuilt: its old ports go, its new ones come in set
			}
		}
		ms, ok := buildMemoService(svc, sources[k], nodeName, m.zone)
		if !ok {
			return buildFull(objs, nodeName, m.Reserved)
		}
		for _, sp := range ms.ports {
			set[sp.Name] = sp
		}
		next[k] = ms
	}
	if len(m.prev) > len(next)-len(set) { // some Service went (an upper bound test; the loop checks)
		for k, p := range m.prev {
			if _, kept := next[k]; !kept {
				for _, sp := range p.ports {
					del = append(del, sp.Name)
				}
			}
		}
	}
	var snap *lb.Snapshot
	if m.last == nil {
		ports := make(map[lb.ServicePortName]*lb.ServicePort, len(set))
		for _, n := range next {
			for _, sp := range n.ports {
				ports[sp.Name] = sp
			}
		}
		snap = lb.NewSnapshot(ports)
	} else {
		if len(set) == 0 && len(del) == 0 {
			m.prev = next
			m.remember(objs)
			return m.last, nil // nothing changed: the same snapshot
		}
		snap = m.last.With(set, del)
	}
	if err := checkNodePorts(snap, objs, m.Reserved); err != nil {
		return nil, err
	}
	m.seq++
	snap.ID = m.seq
	m.prev, m.last = next, snap
	m.remember(objs)
	return snap, nil
}

// remember keeps the objects a build read, in load order, for the short
// ways (each Service's slices and Endpoints are its entry in prev).
func (m *BuildMemo) remember(objs *Objects) {
	m.lastServices, m.lastSlices, m.lastEndpoints = objs.Services, objs.EndpointSlices, objs.Endpoints
}

// buildMemoService builds one Service from its slices and Endpoints (all
// already matched to it), for either build path; ok is false on any
// problem, which the full build then reports.
func buildMemoService(svc *Service, sources []any, nodeName, zone string) (ms memoService, ok bool) {
	if len(svc.problemList()) > 0 {
		return memoService{}, false
	}
	e := &objErr{}
	ports := svc.newPorts()
	known := map[svcKey]bool{{svc.Namespace, svc.Name}: true}
	collected := map[lb.ServicePortName][]lb.Endpoint{}
	hints := map[lb.ServicePortName][][]endpointHints{}
	for _, src := range sources {
		switch o := src.(type) {
		case *Slice:
			sliceEndpoints(o, known, nodeName, e, collected, hints)
		//lint:ignore SA1019 v1 Endpoints are read on purpose, for older manifests
		case *corev1.Endpoints:
			legacyEndpoints(o, known, nodeName, e, collected)
		}
	}
	if len(e.errors) > 0 {
		return memoService{}, false
	}
	for _, sp := range ports {
		sp.Endpoints = mergeEndpoints(collected[sp.Name])
		applyTopology(sp, hints[sp.Name], zone)
	}
	return memoService{svc: svc, sources: sources, ports: ports}, true
}

// HostPort is a port of this host that sluice itself listens on (its
// health and metrics servers, its proxy port range), which no Service's
// NodePort may take.
type HostPort struct {
	Proto       lb.Protocol // "" for every protocol
	First, Last uint16      // one port, or a range
	Owner       string      // the flag that holds it, e.g. "--healthz-bind-address 0.0.0.0:10256"
}

// checkNodePorts refuses two Services claiming one NodePort and protocol,
// a health-check node port (TCP) that is another Service's NodePort or
// health-check node port, and a NodePort on a port sluice itself holds
// (reserved): the API server's allocator forbids the first two, and from
// manifests they used to pass and fail later at bind. The later Service by
// name is the culprit; the error names both owners.
func checkNodePorts(snap *lb.Snapshot, objs *Objects, reserved []HostPort) error {
	type np struct {
		proto lb.Protocol
		port  uint16
	}
	type claim struct {
		sp    *lb.ServicePort
		key   np
		field string
	}
	// One pass keeps, for each port, the claim first by name; no sort of
	// every port (at 10k Services the sort was most of this check).
	owner := map[np]claim{}
	var claims []claim
	for _, sp := range snap.Ports.All() {
		if sp.NodePort != 0 {
			claims = append(claims, claim{sp, np{sp.Name.Protocol, sp.NodePort}, "spec.ports[" + sp.Name.Port + "].nodePort"})
		}
		if sp.HealthCheckNodePort != 0 {
			claims = append(claims, claim{sp, np{lb.TCP, sp.HealthCheckNodePort}, "spec.healthCheckNodePort"})
		}
	}
	before := func(a, b claim) bool {
		if c := a.sp.Name.Compare(b.sp.Name); c != 0 {
			return c < 0
		}
		return a.field < b.field
	}
	for _, c := range claims {
		if first, ok := owner[c.key]; !ok || before(c, first) {
			owner[c.key] = c
		}
	}
	var bad []claim
	for _, c := range claims {
		first := owner[c.key]
		clash := c.sp != first.sp || c.field != first.field
		if clash && first.sp.Name.Namespace == c.sp.Name.Namespace && first.sp.Name.Name == c.sp.Name.Name {
			clash = false // the same Service's ports (or its health check port, shared by its ports): refused by its own validation
		}
		if clash || reservedBy(reserved, c.key.proto, c.key.port) != "" {
			bad = append(bad, c)
		}
	}
	slices.SortFunc(bad, func(a, b claim) int {
		if before(a, b) {
			return -1
		}
		return 1
	})
	var errs []error
	for _, c := range bad {
		id := "Service " + c.sp.Name.Namespace + "/" + c.sp.Name.Name
		e := &objErr{origin: objs.Origin(id), id: id}
		if r := reservedBy(reserved, c.key.proto, c.key.port); r != "" {
			e.add(c.field, "%d/%s is sluice's own (%s)", c.key.port, c.key.proto, r)
		} else {
			first := owner[c.key]
			e.add(c.field, "%d/%s is already Service %s/%s's (%s)", c.key.port, c.key.proto, first.sp.Name.Namespace, first.sp.Name.Name, first.field)
		}
		errs = append(errs, e.errors...)
	}
	return errors.Join(errs...)
}

// reservedBy names what holds port among reserved, or "".
func reservedBy(reserved []HostPort, proto lb.Protocol, port uint16) string {
	for _, r := range reserved {
		if (r.Proto == "" || r.Proto == proto) && port >= r.First && port <= r.Last {
			return r.Owner
		}
	}
	return ""
}

// buildFull builds every Service from scratch and reports every problem.
func buildFull(objs *Objects, nodeName string, reserved []HostPort) (*lb.Snapshot, error) {
	all := map[lb.ServicePortName]*lb.ServicePort{}
	var errs []error
	known := map[svcKey]bool{}
	for _, svc := range objs.Services {
		known[svcKey{svc.Namespace, svc.Name}] = true
		if len(svc.problemList()) > 0 {
			// Found when it was decoded; named with where this load found it.
			origin := objs.Origin("Service " + svc.Namespace + "/" + svc.Name)
			for _, err := range svc.problemList() {
				if me, ok := err.(*ManifestError); ok {
					found := *me
					found.File = origin
					err = &found
				}
				errs = append(errs, err)
			}
			continue
		}
		for _, sp := range svc.newPorts() {
			all[sp.Name] = sp
		}
	}
	collected := map[lb.ServicePortName][]lb.Endpoint{}
	hints := map[lb.ServicePortName][][]endpointHints{}
	for _, sl := range objs.EndpointSlices {
		id := "EndpointSlice " + sl.Namespace + "/" + sl.Name
		e := &objErr{origin: objs.Origin(id), id: id}
		sliceEndpoints(sl, known, nodeName, e, collected, hints)
		errs = append(errs, e.errors...)
	}
	for _, ep := range objs.Endpoints {
		id := "Endpoints " + ep.Namespace + "/" + ep.Name
		e := &objErr{origin: objs.Origin(id), id: id}
		legacyEndpoints(ep, known, nodeName, e, collected)
		errs = append(errs, e.errors...)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	for name, eps := range collected {
		sp, ok := all[name]
		if !ok {
			continue // a port the Service does not have: ignored, as kube-proxy does
		}
		sp.Endpoints = mergeEndpoints(eps)
		applyTopology(sp, hints[name], objs.zone())
	}
	snap := lb.NewSnapshot(all)
	if err := checkNodePorts(snap, objs, reserved); err != nil {
		return nil, err
	}
	return snap, nil
}

// protocolOf is p as one of lb's protocol constants when it is one, so
// that what is kept holds no string of a decoded object's.
func protocolOf(p string) lb.Protocol {
	switch lb.Protocol(p) {
	case lb.TCP:
		return lb.TCP
	case lb.UDP:
		return lb.UDP
	case lb.SCTP:
		return lb.SCTP
	}
	return lb.Protocol(p)
}

func parseIPs(e *objErr, field string, ss []string) []netip.Addr {
	var out []netip.Addr
	for i, s := range ss {
		a, err := netip.ParseAddr(s)
		if err != nil {
			e.add(fmt.Sprintf("%s[%d]", field, i), "invalid IP address %q", s)
			continue
		}
		out = append(out, a.Unmap())
	}
	return out
}

// scanPorts is the number of a Service's ports up to which buildService
// finds repeated names and ports by scanning the earlier ones, with no map.
const scanPorts = 16

// buildService builds svc's ports; name is svc's name as they keep it
// (NewService's own copy).
func buildService(svc *corev1.Service, name string, e *objErr) []*lb.ServicePort {
	if svc.Spec.Type == corev1.ServiceTypeExternalName {
		return nil
	}
	if svc.Spec.ClusterIP == corev1.ClusterIPNone {
		return nil // headless
	}
	clusterIPs := svc.Spec.ClusterIPs
	if len(clusterIPs) == 0 && svc.Spec.ClusterIP != "" {
		clusterIPs = []string{svc.Spec.ClusterIP}
	}
	if len(svc.Spec.ClusterIPs) == 0 && svc.Spec.ClusterIP != "" {
		if _, err := netip.ParseAddr(svc.Spec.ClusterIP); err != nil {
			e.add("spec.clusterIP", "invalid IP address %q", svc.Spec.ClusterIP)
			clusterIPs = nil
		}
	}
	cips := parseIPs(e, "spec.clusterIPs", clusterIPs)
	eips := parseIPs(e, "spec.externalIPs", svc.Spec.ExternalIPs)
	var lbips []netip.Addr
	for i, ing := range svc.Status.LoadBalancer.Ingress {
		if ing.IP == "" || (ing.IPMode != nil && *ing.IPMode == corev1.LoadBalancerIPModeProxy) {
			continue
		}
		lbips = append(lbips, parseIPs(e, fmt.Sprintf("status.loadBalancer.ingress[%d].ip", i), []string{ing.IP})...)
	}
	var ranges []netip.Prefix
	for i, r := range svc.Spec.LoadBalancerSourceRanges {
		pf, err := netip.ParsePrefix(strings.TrimSpace(r))
		if err != nil {
			e.add(fmt.Sprintf("spec.loadBalancerSourceRanges[%d]", i), "invalid CIDR %q", r)
			continue
		}
		ranges = append(ranges, pf.Masked())
	}
	var hcnp uint16
	if n := svc.Spec.HealthCheckNodePort; n != 0 {
		if n < 1 || n > 65535 {
			e.add("spec.healthCheckNodePort", "must be 1-65535, got %d", n)
		} else if svc.Spec.ExternalTrafficPolicy == corev1.ServiceExternalTrafficPolicyLocal {
			hcnp = uint16(n) // only meaningful, and only set by the API server, for externalTrafficPolicy Local
		}
	}
	aff := lb.Affinity{}
	switch svc.Spec.SessionAffinity {
	case "", corev1.ServiceAffinityNone:
	case corev1.ServiceAffinityClientIP:
		aff = lb.Affinity{ClientIP: true, Timeout: lb.DefaultAffinityTimeout}
		if c := svc.Spec.SessionAffinityConfig; c != nil && c.ClientIP != nil && c.ClientIP.TimeoutSeconds != nil {
			ts := *c.ClientIP.TimeoutSeconds
			if ts <= 0 || ts > maxAffinitySeconds {
				e.add("spec.sessionAffinityConfig.clientIP.timeoutSeconds", "must be 1-%d, got %d", maxAffinitySeconds, ts)
			}
			aff.Timeout = time.Duration(ts) * time.Second
		}
	default:
		e.add("spec.sessionAffinity", "unsupported value %q: want None or ClientIP", svc.Spec.SessionAffinity)
	}
	if len(svc.Spec.Ports) == 0 {
		e.add("spec.ports", "at least one port is required")
	}
	internalLocal := svc.Spec.InternalTrafficPolicy != nil && *svc.Spec.InternalTrafficPolicy == corev1.ServiceInternalTrafficPolicyLocal
	externalLocal := false
	switch svc.Spec.ExternalTrafficPolicy {
	case "", corev1.ServiceExternalTrafficPolicyCluster:
	case corev1.ServiceExternalTrafficPolicyLocal:
		externalLocal = true
	default:
		e.add("spec.externalTrafficPolicy", "unsupported value %q: want Cluster or Local", svc.Spec.ExternalTrafficPolicy)
	}
	if p := svc.Spec.InternalTrafficPolicy; p != nil && *p != corev1.ServiceInternalTrafficPolicyLocal && *p != corev1.ServiceInternalTrafficPolicyCluster {
		e.add("spec.internalTrafficPolicy", "unsupported value %q: want Cluster or Local", *p)
	}
	// Checked without maps or formatting unless something is wrong: a
	// Service is built as it is decoded, and what it keeps must not be
	// spread among garbage (see mergeOwned).
	protoOf := func(p corev1.ServicePort) lb.Protocol {
		if p.Protocol == "" {
			return lb.TCP
		}
		return protocolOf(string(p.Protocol))
	}
	type portProto struct {
		port  int32
		proto lb.Protocol
	}
	var names map[string]int // past scanPorts ports: each name's last index so far
	var portProtos map[portProto]int
	out := make([]*lb.ServicePort, 0, len(svc.Spec.Ports))
	for i, p := range svc.Spec.Ports {
		f := func() string { return fmt.Sprintf("spec.ports[%d]", i) }
		if len(svc.Spec.Ports) > 1 && p.Name == "" {
			e.add(f()+".name", "required when a Service has more than one port")
		}
		proto := protoOf(p)
		// The last earlier port of the same name, and of the same port
		// and protocol: scanned for a few ports, looked up past that.
		sameName, samePort := -1, -1
		if len(svc.Spec.Ports) <= scanPorts {
			for j, q := range svc.Spec.Ports[:i] {
				if q.Name == p.Name {
					sameName = j
				}
				if q.Port == p.Port && protoOf(q) == proto {
					samePort = j
				}
			}
		} else {
			if names == nil {
				names, portProtos = map[string]int{}, map[portProto]int{}
			}
			if j, ok := names[p.Name]; ok {
				sameName = j
			}
			if j, ok := portProtos[portProto{p.Port, proto}]; ok {
				samePort = j
			}
			names[p.Name], portProtos[portProto{p.Port, proto}] = i, i
		}
		if sameName >= 0 {
			e.add(f()+".name", "duplicate port name %q (also spec.ports[%d])", p.Name, sameName)
		}
		if proto != lb.TCP && proto != lb.UDP && proto != lb.SCTP {
			e.add(f()+".protocol", "unsupported protocol %q: want TCP, UDP or SCTP", p.Protocol)
		}
		if p.Port < 1 || p.Port > 65535 {
			e.add(f()+".port", "must be 1-65535, got %d", p.Port)
		}
		if p.NodePort < 0 || p.NodePort > 65535 {
			e.add(f()+".nodePort", "must be 0-65535, got %d", p.NodePort)
		}
		if samePort >= 0 {
			e.add(f()+".port", "duplicate port %d/%s (also spec.ports[%d])", p.Port, proto, samePort)
		}
		out = append(out, &lb.ServicePort{
			Name:                lb.ServicePortName{Namespace: svc.Namespace, Name: name, Port: p.Name, Protocol: proto},
			ClusterIPs:          cips,
			Port:                uint16(p.Port),
			NodePort:            uint16(p.NodePort),
			External:            lb.NewExternalAddrs(eips, lbips, ranges),
			HealthCheckNodePort: hcnp,
			Affinity:            aff,
			InternalLocal:       internalLocal,
			// kube-proxy applies the external policy only to ports that
			// are reachable from outside.
			ExternalLocal: externalLocal && (p.NodePort != 0 || len(eips) > 0 || len(lbips) > 0),
		})
	}
	return out
}

// Slice is an EndpointSlice as the build reads it: its names, the
// Service it belongs to, and its ports and endpoints parsed and checked
// once, when it is decoded. It is what both sources keep of each slice
// (the manifest source between reloads, the API source in its informer's
// cache): decoded as discoveryv1 types, a slice of 10 endpoints held 2-3
// KiB (96-byte endpoints, an address string each, the labels' map), and
// the snapshot a copy of its endpoints besides; a Slice holds about a
// third of that, and the snapshot shares its lists (issue 16's memory
// budget). A Slice is never modified once made: snapshots share it.
type Slice struct {
	Namespace, Name string
	// Service is the kubernetes.io/service-name label ("" when missing).
	Service string

	// ports are its ports, each with its endpoints (a list beside them
	// was 8 bytes and an allocation more of every slice, and 16 of the
	// Slice: issue 16's memory budget).
	ports []slicePort
	// node is the node the endpoints were marked Local for ("": none),
	// interned: one word of each slice, not two (issue 16's memory
	// budget).
	node unique.Handle[string]
	// rare holds what few slices have, so the others hold one word for
	// it: 88 bytes a slice, where the three were 120.
	rare *sliceRare
}

// sliceRare is what a Slice rarely has.
type sliceRare struct {
	problems []fieldProblem // what is wrong with it, in the order found
	// hints are its endpoints' topology hints, sorted by address (port
	// 0), for those that have any.
	hints []endpointHints
	// src is kept only when node is "" (LoadManifests, which the tools
	// and tests build for any node): a build for another node parses it
	// again for that one. The sources parse for their own node and never
	// keep it.
	src *discoveryv1.EndpointSlice
}

// endpointHints is one endpoint's topology hints (discovery/v1
// EndpointHints), as a build reads them: the zones it is for, and whether
// it has node hints and one names the node the slice was parsed for.
type endpointHints struct {
	addr      lb.EndpointAddr // port 0
	zones     []string
	nodeHints bool
	forNode   bool
}

// hintsOf returns the endpoint's hints among hs (sorted), if it has any.
func hintsOf(hs []endpointHints, addr lb.EndpointAddr) (endpointHints, bool) {
	i, found := slices.BinarySearchFunc(hs, addr, func(h endpointHints, a lb.EndpointAddr) int { return h.addr.Compare(a) })
	if !found {
		return endpointHints{}, false
	}
	return hs[i], true
}

// nodeName is the node s marks endpoints Local for ("": none).
func (s *Slice) nodeName() string {
	if s.node == (unique.Handle[string]{}) {
		return ""
	}
	return s.node.Value()
}

// problems are what is wrong with s, in the order found.
func (s *Slice) problems() []fieldProblem {
	if s.rare == nil {
		return nil
	}
	return s.rare.problems
}

// fieldProblem is one problem of an object, with the field it is in.
type fieldProblem struct{ field, what string }

type slicePort struct {
	name  string
	proto lb.Protocol
	port  uint16
	// eps are the slice's endpoints with this port's number, merged as
	// the build merges a port's endpoints (mergeEndpoints), those on node
	// Local: a port whose endpoints all come from this slice takes its
	// list as it is, shared.
	eps []lb.Endpoint
}

// DropNodeHints removes sl's node hints, as kube-proxy reads slices with
// its PreferSameTrafficDistribution gate off; the zone hints stay. Both
// sources call it as a slice arrives.
func DropNodeHints(sl *discoveryv1.EndpointSlice) {
	for i := range sl.Endpoints {
		if h := sl.Endpoints[i].Hints; h != nil {
			h.ForNodes = nil
		}
	}
}

// NewSlice parses and checks sl for the build, which reports what it
// found wrong (when the slice's Service is known) and uses nothing of a
// slice with a problem. What is kept is sized exactly: it lives as long
// as the slice is unchanged. No endpoint is Local; a build for a node
// parses sl again (it is kept, and must not change).
func NewSlice(sl *discoveryv1.EndpointSlice) *Slice {
	s := NewSliceFor(sl, "")
	if s.rare == nil {
		s.rare = &sliceRare{}
	}
	s.rare.src = sl
	return s
}

// NewSliceFor is NewSlice for the node named nodeName: the endpoints on it
// are Local, and sl is not kept, so a build for another node reports the
// slice instead of guessing (the sources parse for the node they serve).
func NewSliceFor(sl *discoveryv1.EndpointSlice, nodeName string) *Slice {
	s := new(Slice)
	s.ParseFor(sl, nodeName)
	return s
}

// ParseFor sets s to what NewSliceFor(sl, nodeName) returns, in place: for
// a holder that keeps the Slice within itself (the API source's cache).
func (s *Slice) ParseFor(sl *discoveryv1.EndpointSlice, nodeName string) {
	*s = Slice{Namespace: sl.Namespace, Name: strings.Clone(sl.Name), Service: strings.Clone(sl.Labels[ServiceNameLabel]), node: unique.Make(nodeName)}
	var want func(netip.Addr) bool
	switch sl.AddressType {
	case discoveryv1.AddressTypeIPv4:
		want = netip.Addr.Is4
	case discoveryv1.AddressTypeIPv6:
		want = netip.Addr.Is6
	case discoveryv1.AddressTypeFQDN:
		return // kube-proxy ignores FQDN slices: no ports, nothing wrong
	default:
		s.problem("addressType", "unsupported value %q: want IPv4, IPv6 or FQDN", sl.AddressType)
		return
	}
	ports := make([]slicePort, 0, len(sl.Ports))
	for i, p := range sl.Ports {
		if p.Port == nil || *p.Port == 0 {
			continue // kube-proxy ignores ports without a number
		}
		if *p.Port < 1 || *p.Port > 65535 {
			s.problem(fmt.Sprintf("ports[%d].port", i), "must be 1-65535, got %d", *p.Port)
			continue
		}
		ref := slicePort{proto: lb.TCP, port: uint16(*p.Port)}
		if p.Name != nil {
			ref.name = *p.Name
		}
		if p.Protocol != nil {
			ref.proto = protocolOf(string(*p.Protocol))
		}
		ports = append(ports, ref)
	}
	eps := make([]lb.Endpoint, 0, len(sl.Endpoints)) // port 0, for now
	var hints []endpointHints
	for i, ep := range sl.Endpoints {
		// The field's name is made only for a problem: a slice is parsed
		// as it is decoded, and what it keeps must not be spread among
		// garbage (see mergeOwned).
		f := func() string { return fmt.Sprintf("endpoints[%d].addresses", i) }
		if len(ep.Addresses) == 0 {
			s.problem(f(), "at least one address is required")
			continue
		}
		a, err := netip.ParseAddr(ep.Addresses[0])
		if err != nil {
			s.problem(f()+"[0]", "invalid IP address %q", ep.Addresses[0])
			continue
		}
		a = a.Unmap()
		if a.Zone() != "" {
			s.problem(f()+"[0]", "invalid IP address %q: an endpoint address has no zone", ep.Addresses[0])
			continue
		}
		if !want(a) {
			s.problem(f()+"[0]", "address %s is not of addressType %s", a, sl.AddressType)
			continue
		}
		c := ep.Conditions
		if h := ep.Hints; h != nil && (len(h.ForZones) > 0 || len(h.ForNodes) > 0) {
			eh := endpointHints{addr: lb.EndpointAddrFrom(a, 0), nodeHints: len(h.ForNodes) > 0}
			for _, z := range h.ForZones {
				eh.zones = append(eh.zones, strings.Clone(z.Name))
			}
			for _, n := range h.ForNodes {
				eh.forNode = eh.forNode || nodeName != "" && n.Name == nodeName
			}
			hints = append(hints, eh)
		}
		eps = append(eps, lb.Endpoint{
			Addr:        lb.EndpointAddrFrom(a, 0),
			Ready:       c.Ready == nil || *c.Ready,
			Serving:     c.Serving == nil || *c.Serving,
			Terminating: c.Terminating != nil && *c.Terminating,
			Local:       nodeName != "" && ep.NodeName != nil && *ep.NodeName == nodeName,
		})
	}
	if len(s.problems()) > 0 || len(ports) == 0 {
		return
	}
	if len(hints) > 0 {
		slices.SortStableFunc(hints, func(a, b endpointHints) int { return a.addr.Compare(b.addr) })
		if s.rare == nil {
			s.rare = &sliceRare{}
		}
		s.rare.hints = slices.Clip(hints)
	}
	s.ports = slices.Clip(ports)
	for i, p := range s.ports {
		list := eps // the last port takes eps itself
		if i < len(ports)-1 {
			list = slices.Clone(eps)
		}
		for j := range list {
			list[j].Addr = lb.EndpointAddrFrom(list[j].Addr.Addr(), p.port)
		}
		s.ports[i].eps = mergeOwned(list)
	}
}

// mergeOwned is mergeEndpoints for a list the caller owns and gives up: it
// is merged in place (sorted, then each run of one address made one), so a
// slice's kept lists are the only allocations of their size that parsing
// it makes. Kept beside the decode's garbage, lists
// and copies made and dropped in turn left every other slot of their spans
// empty (BenchmarkInitialListHeapInUse).
func mergeOwned(eps []lb.Endpoint) []lb.Endpoint {
	if len(eps) == 0 {
		return nil
	}
	if merged(eps) {
		return slices.Clip(eps)
	}
	slices.SortStableFunc(eps, compareEndpointAddrs)
	out := eps[:0]
	for i := 0; i < len(eps); {
		j := i + 1
		for j < len(eps) && eps[j].Addr == eps[i].Addr {
			j++
		}
		// As mergeEndpoints: the first of an address, unless it is
		// terminating and a later one is not.
		keep := eps[i]
		if keep.Terminating {
			for _, ep := range eps[i+1 : j] {
				if !ep.Terminating {
					keep = ep
					break
				}
			}
		}
		out = append(out, keep)
		i = j
	}
	clear(eps[len(out):])
	return slices.Clip(out)
}

// compareEndpointAddrs orders endpoints as mergeEndpoints does, by their
// "ip:port" text, without making it.
func compareEndpointAddrs(x, y lb.Endpoint) int {
	var a, b [64]byte
	return bytes.Compare(x.Addr.AppendTo(a[:0]), y.Addr.AppendTo(b[:0]))
}

func (s *Slice) problem(field, format string, a ...any) {
	if s.rare == nil {
		s.rare = &sliceRare{}
	}
	s.rare.problems = append(s.rare.problems, fieldProblem{field, fmt.Sprintf(format, a...)})
}

// sliceEndpoints adds sl's endpoints to out, per service port, for the
// node named nodeName; it reports sl's problems, and one naming a Service
// that is not known, instead.
func sliceEndpoints(sl *Slice, known map[svcKey]bool, nodeName string, e *objErr, out map[lb.ServicePortName][]lb.Endpoint, hints map[lb.ServicePortName][][]endpointHints) {
	if sl.Service == "" {
		e.add("metadata.labels["+ServiceNameLabel+"]", "required: it names the Service this slice belongs to")
		return
	}
	if !known[svcKey{sl.Namespace, sl.Service}] {
		e.add("metadata.labels["+ServiceNameLabel+"]", "Service %s/%s not found", sl.Namespace, sl.Service)
		return
	}
	for _, p := range sl.problems() {
		e.add(p.field, "%s", p.what)
	}
	if len(sl.problems()) > 0 {
		return
	}
	if node := sl.nodeName(); node != nodeName {
		if sl.rare == nil || sl.rare.src == nil {
			e.add("metadata.name", "parsed for node %q, built for node %q", node, nodeName)
			return
		}
		sl = NewSliceFor(sl.rare.src, nodeName)
	}
	for _, p := range sl.ports {
		name := lb.ServicePortName{Namespace: sl.Namespace, Name: sl.Service, Port: p.name, Protocol: p.proto}
		if sl.rare != nil && len(sl.rare.hints) > 0 {
			hints[name] = append(hints[name], sl.rare.hints)
		}
		eps := p.eps
		if len(out[name]) == 0 {
			// Shared: the lists are exactly sized, so a later slice's
			// endpoints are appended to a copy, never into the Slice's.
			out[name] = eps
		} else {
			out[name] = append(out[name], eps...)
		}
	}
}

//lint:ignore SA1019 v1 Endpoints are read on purpose, for older manifests
func legacyEndpoints(ep *corev1.Endpoints, known map[svcKey]bool, nodeName string, e *objErr, out map[lb.ServicePortName][]lb.Endpoint) {
	if !known[svcKey{ep.Namespace, ep.Name}] {
		e.add("metadata.name", "Service %s/%s not found", ep.Namespace, ep.Name)
		return
	}
	for si, ss := range ep.Subsets {
		var addrs []lb.Endpoint
		add := func(list []corev1.EndpointAddress, field string, ready bool) {
			for i, a := range list {
				ip, err := netip.ParseAddr(a.IP)
				if err != nil {
					e.add(fmt.Sprintf("subsets[%d].%s[%d].ip", si, field, i), "invalid IP address %q", a.IP)
					continue
				}
				if ip.Zone() != "" {
					e.add(fmt.Sprintf("subsets[%d].%s[%d].ip", si, field, i), "invalid IP address %q: an endpoint address has no zone", a.IP)
					continue
				}
				addrs = append(addrs, lb.Endpoint{Addr: lb.EndpointAddrFrom(ip.Unmap(), 0), Ready: ready, Serving: ready,
					Local: nodeName != "" && a.NodeName != nil && *a.NodeName == nodeName})
			}
		}
		add(ss.Addresses, "addresses", true)
		add(ss.NotReadyAddresses, "notReadyAddresses", false)
		for pi, p := range ss.Ports {
			if p.Port < 1 || p.Port > 65535 {
				e.add(fmt.Sprintf("subsets[%d].ports[%d].port", si, pi), "must be 1-65535, got %d", p.Port)
				continue
			}
			proto := lb.Protocol(p.Protocol)
			if proto == "" {
				proto = lb.TCP
			}
			name := lb.ServicePortName{Namespace: ep.Namespace, Name: ep.Name, Port: p.Name, Protocol: proto}
			for _, le := range addrs {
				le.Addr = lb.EndpointAddrFrom(le.Addr.Addr(), uint16(p.Port))
				out[name] = append(out[name], le)
			}
		}
	}
}

// mergeEndpoints drops duplicate addresses (the first wins unless a later one
// is not terminating, as kube-proxy does) and sorts by "ip:port" string.
// The result is sized to the endpoints, not grown by appends: it is kept for
// as long as the Service is unchanged (10 endpoints took a 16-entry array,
// 13.5 MB of the live heap at 10k Services).
//
// A list that is merged already (one slice's, as Slice keeps them) is
// returned as it is: the snapshot shares it with the Slice.
func mergeEndpoints(eps []lb.Endpoint) []lb.Endpoint {
	if len(eps) == 0 {
		return nil
	}
	if merged(eps) {
		return slices.Clip(eps)
	}
	return mergeOwned(slices.Clone(eps)) // eps may be a slice's list, shared
}

// merged reports whether eps is in mergeEndpoints' order with no address
// twice: each "ip:port" string above the last (one address is one
// string), compared without making them.
func merged(eps []lb.Endpoint) bool {
	var a, b [64]byte
	last := eps[0].Addr.AppendTo(a[:0])
	for _, ep := range eps[1:] {
		next := ep.Addr.AppendTo(b[:0])
		if bytes.Compare(last, next) >= 0 {
			return false
		}
		last = append(a[:0], next...)
	}
	return true
}

// Service is a Service as the builds read it: its ports built and checked
// once, when it is decoded, without endpoints, and the problems found. It
// is what both sources keep of each Service (the manifest source between
// reloads, the API source in its informer's cache): a decoded
// corev1.Service held about 1 KiB (issue 16's memory budget). What it
// says never changes once made; only which copy of its ports it holds
// does (newPorts), on the goroutine that builds.
type Service struct {
	Namespace, Name string
	// ports are the Service's ports for the builds: the first build takes
	// them themselves, so that a Service built once holds one copy; the
	// second makes them anew without endpoints (else the first build's
	// lists would be held as long as the Service) and gives a copy, as
	// every later build does. At 10k Services the second copy of every
	// port was about a tenth of what the manifest source held.
	ports []*lb.ServicePort
	given portsGiven
	// problems are what is wrong with it (nil: nothing), behind a pointer:
	// few Services have any, and a list in line made the API source's
	// cached Service 112 bytes, where it is 96 (issue 16's memory budget).
	problems *[]error
}

// problemList is what is wrong with svc (none: nothing).
func (svc *Service) problemList() []error {
	if svc.problems == nil {
		return nil
	}
	return *svc.problems
}

// portsGiven is what the builds have done with a Service's ports.
type portsGiven uint8

const (
	portsKept   portsGiven = iota // none built it: the first takes them
	portsTaken                    // a build took them and gave them endpoints
	portsCopied                   // they are copies without endpoints, never given
)

// NewService builds svc's ports, without endpoints, for BuildService.
// A skipped Service (ExternalName, headless) has none and no problem.
func NewService(svc *corev1.Service) *Service {
	s := new(Service)
	s.Parse(svc)
	return s
}

// Parse sets s to what NewService(svc) returns, in place: for a holder
// that keeps the Service within itself (the API source's cache).
func (s *Service) Parse(svc *corev1.Service) {
	e := &objErr{id: "Service " + svc.Namespace + "/" + svc.Name}
	name := strings.Clone(svc.Name)
	ports := buildService(svc, name, e)
	if len(e.errors) > 0 {
		problems := slices.Clip(e.errors)
		*s = Service{Namespace: svc.Namespace, Name: name, problems: &problems}
		return
	}
	*s = Service{Namespace: svc.Namespace, Name: name, ports: slices.Clip(ports)}
}

// BuildService builds one Service's ports for the node named nodeName, with
// the endpoints of slices, which must all be labelled with that Service's
// name (NewService and NewSlice make them; a port's endpoints may share a
// slice's list, which is why a Slice never changes). It is the incremental
// path of an API source: one Service at a time. Each problem is returned,
// naming its object and field; a bad Service yields no ports, and a bad
// slice is left out while the others are used. A skipped Service
// (ExternalName, headless) yields no ports and no error. The ports are new
// each time: svc's own are never handed out.
// zone is the node's topology.kubernetes.io/zone label ("": none), for
// the slices' zone hints.
func BuildService(svc *Service, slices []*Slice, nodeName, zone string) ([]*lb.ServicePort, []error) {
	if len(svc.problemList()) > 0 {
		return nil, svc.problemList()
	}
	if len(svc.ports) == 0 {
		return nil, nil
	}
	known := map[svcKey]bool{{svc.Namespace, svc.Name}: true}
	collected := map[lb.ServicePortName][]lb.Endpoint{}
	hints := map[lb.ServicePortName][][]endpointHints{}
	var errs []error
	for _, sl := range slices {
		se := &objErr{id: "EndpointSlice " + sl.Namespace + "/" + sl.Name}
		sliceEndpoints(sl, known, nodeName, se, collected, hints)
		errs = append(errs, se.errors...)
	}
	ports := svc.newPorts()
	for _, sp := range ports {
		sp.Endpoints = mergeEndpoints(collected[sp.Name])
		applyTopology(sp, hints[sp.Name], zone)
	}
	return ports, errs
}

// newPorts are svc's ports for a build to give endpoints: the ports
// themselves to the first build, copies to the later ones. The builds of
// one Service run one at a time (each source builds on one goroutine).
func (svc *Service) newPorts() []*lb.ServicePort {
	copies := func() []*lb.ServicePort {
		ports := make([]*lb.ServicePort, len(svc.ports))
		for i, proto := range svc.ports {
			sp := *proto
			sp.Endpoints = nil
			if sp.OutOfTopology() != nil {
				sp.SetOutOfTopology(nil) // what the first build's endpoints were
			}
			ports[i] = &sp
		}
		return ports
	}
	switch svc.given {
	case portsKept:
		svc.given = portsTaken
		return svc.ports
	case portsTaken:
		// A new list, never the one the first build holds.
		svc.ports, svc.given = copies(), portsCopied
	}
	return copies()
}

// applyTopology is kube-proxy's topology-aware routing for one port
// (topologyModeFromHints, availableForTopology): when every ready endpoint
// has node hints and one is for this node (the slices were parsed for it),
// cluster traffic goes only to those for this node; else, when every ready
// endpoint has zone hints and one is for zone, only to those for zone;
// else to all. The others are set out of the port's topology. lists are
// the hints of the port's slices that have any; an endpoint in none of
// them has no hints. The node hints are read as kube-proxy v1.34 reads
// them by default (its PreferSameTrafficDistribution gate on).
func applyTopology(sp *lb.ServicePort, lists [][]endpointHints, zone string) {
	if sp.OutOfTopology() != nil {
		sp.SetOutOfTopology(nil) // a port copied from one an earlier build set
	}
	if len(lists) == 0 || len(sp.Endpoints) == 0 {
		return
	}
	hs := make([]endpointHints, len(sp.Endpoints))
	allNode, anyNode, allZone, anyZone := true, false, true, false
	for i, ep := range sp.Endpoints {
		if !ep.Ready {
			continue
		}
		addr := lb.EndpointAddrFrom(ep.Addr.Addr(), 0)
		for _, l := range lists {
			if h, ok := hintsOf(l, addr); ok {
				hs[i] = h
				break
			}
		}
		h := hs[i]
		if !h.nodeHints {
			allNode = false
		} else if h.forNode {
			anyNode = true
		}
		if len(h.zones) == 0 {
			allZone = false
		} else if zone != "" && slices.Contains(h.zones, zone) {
			anyZone = true
		}
	}
	var available func(h endpointHints) bool
	switch {
	case allNode && anyNode:
		available = func(h endpointHints) bool { return h.forNode }
	case allZone && anyZone:
		available = func(h endpointHints) bool { return slices.Contains(h.zones, zone) }
	default:
		return
	}
	var out []lb.EndpointAddr
	for i, ep := range sp.Endpoints {
		if ep.Ready && !available(hs[i]) {
			out = append(out, ep.Addr)
		}
	}
	if len(out) > 0 {
		slices.SortFunc(out, lb.EndpointAddr.Compare)
		sp.SetOutOfTopology(out)
	}
}
