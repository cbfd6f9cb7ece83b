package controlplane

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
	"unsafe"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sluice-proxy/sluice/lb"
)

const goodManifest = `
apiVersion: v1
kind: Service
metadata: {name: web, namespace: demo}
spec:
  type: NodePort
  clusterIP: 10.96.0.10
  sessionAffinity: ClientIP
  sessionAffinityConfig: {clientIP: {timeoutSeconds: 60}}
  ports:
  - {name: http, port: 80, nodePort: 30080}
  - {name: dns, port: 53, protocol: UDP}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-a
  namespace: demo
  labels: {kubernetes.io/service-name: web}
addressType: IPv4
ports: [{name: http, port: 8080}, {name: dns, port: 5353, protocol: UDP}]
endpoints:
- addresses: [10.0.0.2]
- addresses: [10.0.0.1]
  conditions: {ready: false, serving: true, terminating: true}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-b
  namespace: demo
  labels: {kubernetes.io/service-name: web}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints:
- addresses: [10.0.0.1]
- addresses: [10.0.0.3]
  conditions: {ready: false}
---
apiVersion: v1
kind: Service
metadata: {name: legacy}
spec:
  clusterIP: 10.96.0.11
  ports: [{port: 81}]
---
apiVersion: v1
kind: Endpoints
metadata: {name: legacy}
subsets:
- addresses: [{ip: 10.1.0.1}]
  notReadyAddresses: [{ip: 10.1.0.2}]
  ports: [{port: 9000}]
---
apiVersion: v1
kind: Service
metadata: {name: ext}
spec: {type: ExternalName, externalName: example.com}
`

func build(t *testing.T, manifest string) (*lb.Snapshot, error) {
	t.Helper()
	objs, err := ParseManifest("test.yaml", []byte(manifest))
	if err != nil {
		return nil, err
	}
	return Build(objs)
}

func TestBuildMergesSlicesAndLegacyEndpoints(t *testing.T) {
	snap, err := build(t, goodManifest)
	if err != nil {
		t.Fatal(err)
	}
	if snap.Ports.Len() != 3 {
		t.Fatalf("got %d ports, want 3 (ExternalName skipped): %v", snap.Ports.Len(), snap.Ports)
	}
	http := snap.Ports.Get(lb.ServicePortName{Namespace: "demo", Name: "web", Port: "http", Protocol: lb.TCP})
	if http == nil || http.NodePort != 30080 || http.Port != 80 || http.ClusterIPs[0] != netip.MustParseAddr("10.96.0.10") {
		t.Fatalf("http port wrong: %+v", http)
	}
	if !http.Affinity.ClientIP || http.Affinity.Timeout != time.Minute {
		t.Fatalf("affinity wrong: %+v", http.Affinity)
	}
	// 10.0.0.1 appears terminating in web-a and ready in web-b: the ready one wins.
	var got []string
	for _, ep := range http.Endpoints {
		got = append(got, ep.Addr.String())
	}
	if strings.Join(got, ",") != "10.0.0.1:8080,10.0.0.2:8080,10.0.0.3:8080" {
		t.Fatalf("endpoints %v", got)
	}
	if !http.Endpoints[0].Ready {
		t.Fatalf("duplicate merge kept the terminating copy: %+v", http.Endpoints[0])
	}
	if u := http.Usable(); len(u) != 2 {
		t.Fatalf("usable = %v, want the two ready", u)
	}
	dns := snap.Ports.Get(lb.ServicePortName{Namespace: "demo", Name: "web", Port: "dns", Protocol: lb.UDP})
	if dns == nil || len(dns.Endpoints) != 2 {
		t.Fatalf("dns wrong: %+v", dns)
	}
	legacy := snap.Ports.Get(lb.ServicePortName{Namespace: "default", Name: "legacy", Protocol: lb.TCP})
	if legacy == nil || len(legacy.Endpoints) != 2 || len(legacy.Usable()) != 1 || legacy.Usable()[0].String() != "10.1.0.1:9000" {
		t.Fatalf("legacy wrong: %+v", legacy)
	}
}

func TestBadManifestsNameFileObjectAndField(t *testing.T) {
	svc := "apiVersion: v1\nkind: Service\nmetadata: {name: s}\nspec:\n  clusterIP: 10.96.0.1\n"
	cases := []struct{ name, manifest, want string }{
		{"bad yaml", "apiVersion: v1\nkind: [", "test.yaml#1: malformed YAML/JSON"},
		{"unknown kind", "apiVersion: v1\nkind: Servce\nmetadata: {name: p}\n", `Servce default/p: unknown kind "Servce"`},
		{"unknown field", svc + "  portz: []\n", `Service default/s: spec.portz: unknown field`},
		{"unknown nested field", svc + "  ports: [{port: 80, protocl: TCP}]\n", `Service default/s: spec.ports[0].protocl: unknown field`},
		{"wrong type", svc + "  ports: [{port: eighty}]\n", `Service default/s: invalid Service`},
		{"invalid cluster ip", "apiVersion: v1\nkind: Service\nmetadata: {name: s}\nspec:\n  clusterIP: 10.96.0.300\n  ports: [{port: 80}]\n", `Service default/s: spec.clusterIP: invalid IP address "10.96.0.300"`},
		{"invalid external ip", svc + "  externalIPs: [nope]\n  ports: [{port: 80}]\n", `spec.externalIPs[0]: invalid IP address "nope"`},
		{"port out of range", svc + "  ports: [{port: 70000}]\n", `Service default/s: spec.ports[0].port: must be 1-65535, got 70000`},
		{"node port out of range", svc + "  ports: [{port: 80, nodePort: 99999}]\n", `spec.ports[0].nodePort: must be 0-65535`},
		{"duplicate port names", svc + "  ports: [{name: a, port: 80}, {name: a, port: 81}]\n", `spec.ports[1].name: duplicate port name "a"`},
		{"duplicate port names, the last earlier named", svc + "  ports: [{name: a, port: 80}, {name: b, port: 81}, {name: a, port: 82}, {name: a, port: 83}]\n", `spec.ports[3].name: duplicate port name "a" (also spec.ports[2])`},
		{"duplicate ports", svc + "  ports: [{name: a, port: 80}, {name: b, port: 80, protocol: UDP}, {name: c, port: 80}]\n", `spec.ports[2].port: duplicate port 80/TCP (also spec.ports[0])`},
		{"duplicate ports among many", svc + "  ports: [" + manyPorts(20) + ", {name: again, port: 1005}, {name: p3, port: 2000}]\n", `spec.ports[20].port: duplicate port 1005/TCP (also spec.ports[5])`},
		{"duplicate names among many", svc + "  ports: [" + manyPorts(20) + ", {name: again, port: 1005}, {name: p3, port: 2000}]\n", `spec.ports[21].name: duplicate port name "p3" (also spec.ports[3])`},
		{"duplicate ports, the default protocol", svc + "  ports: [{name: a, port: 53, protocol: UDP}, {name: b, port: 53, protocol: UDP}]\n", `spec.ports[1].port: duplicate port 53/UDP (also spec.ports[0])`},
		{"negative affinity", svc + "  sessionAffinity: ClientIP\n  sessionAffinityConfig: {clientIP: {timeoutSeconds: -5}}\n  ports: [{port: 80}]\n", `spec.sessionAffinityConfig.clientIP.timeoutSeconds: must be 1-86400, got -5`},
		{"slice to unknown service", "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: x, labels: {kubernetes.io/service-name: ghost}}\naddressType: IPv4\nendpoints: []\n", `EndpointSlice default/x: metadata.labels[kubernetes.io/service-name]: Service default/ghost not found`},
		{"slice bad address", svc + "  ports: [{port: 80}]\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: x, labels: {kubernetes.io/service-name: s}}\naddressType: IPv4\nports: [{port: 80}]\nendpoints: [{addresses: [fe80::1]}]\n", `test.yaml#2: EndpointSlice default/x: endpoints[0].addresses[0]: address fe80::1 is not of addressType IPv4`},
		{"slice unparsable address", svc + "  ports: [{port: 80}]\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: x, labels: {kubernetes.io/service-name: s}}\naddressType: IPv4\nports: [{port: 80}]\nendpoints: [{addresses: [10.0.0.1]}, {addresses: [10.0.0.300]}]\n", `EndpointSlice default/x: endpoints[1].addresses[0]: invalid IP address "10.0.0.300"`},
		{"slice zoned address", svc + "  ports: [{port: 80}]\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: x, labels: {kubernetes.io/service-name: s}}\naddressType: IPv6\nports: [{port: 80}]\nendpoints: [{addresses: [\"fe80::1%eth0\"]}]\n", `EndpointSlice default/x: endpoints[0].addresses[0]: invalid IP address "fe80::1%eth0": an endpoint address has no zone`},
		{"endpoints zoned address", svc + "  ports: [{port: 80}]\n---\napiVersion: v1\nkind: Endpoints\nmetadata: {name: s}\nsubsets: [{addresses: [{ip: \"fe80::1%eth0\"}], ports: [{port: 80}]}]\n", `subsets[0].addresses[0].ip: invalid IP address "fe80::1%eth0": an endpoint address has no zone`},
		{"slice endpoint without address", svc + "  ports: [{port: 80}]\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: x, labels: {kubernetes.io/service-name: s}}\naddressType: IPv4\nports: [{port: 80}]\nendpoints: [{addresses: []}]\n", `EndpointSlice default/x: endpoints[0].addresses: at least one address is required`},
		{"slice port out of range", svc + "  ports: [{port: 80}]\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: x, labels: {kubernetes.io/service-name: s}}\naddressType: IPv4\nports: [{port: 80}, {port: 70000}]\nendpoints: [{addresses: [10.0.0.1]}]\n", `EndpointSlice default/x: ports[1].port: must be 1-65535, got 70000`},
		{"slice address type", svc + "  ports: [{port: 80}]\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: x, labels: {kubernetes.io/service-name: s}}\naddressType: IPv5\nports: [{port: 80}]\nendpoints: [{addresses: [10.0.0.1]}]\n", `EndpointSlice default/x: addressType: unsupported value "IPv5": want IPv4, IPv6 or FQDN`},
		{"slice without service label", svc + "  ports: [{port: 80}]\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: x}\naddressType: IPv4\nports: [{port: 80}]\nendpoints: [{addresses: [10.0.0.1]}]\n", `EndpointSlice default/x: metadata.labels[kubernetes.io/service-name]: required`},
		{"missing name", "apiVersion: v1\nkind: Service\nmetadata: {}\n", `metadata.name: required`},
		{"bad source range", svc + "  type: LoadBalancer\n  loadBalancerSourceRanges: [10.0.0.0/8, 300.0.0.0/8]\n  ports: [{port: 80}]\n", `Service default/s: spec.loadBalancerSourceRanges[1]: invalid CIDR "300.0.0.0/8"`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := build(t, tc.manifest)
			if err == nil {
				t.Fatal("accepted")
			}
			if !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "test.yaml") {
				t.Fatalf("error %q does not contain %q and the file name", err, tc.want)
			}
			culprits := Culprits(err)
			if tc.name == "bad yaml" {
				if len(culprits) != 0 {
					t.Fatalf("a file-level error named objects %v", culprits)
				}
			} else if len(culprits) != 1 || !strings.Contains(err.Error(), ": "+culprits[0]+":") {
				t.Fatalf("culprits %v for %q", culprits, err)
			}
		})
	}
}

func TestBuildSourceRangesAndHealthCheckNodePort(t *testing.T) {
	snap, err := build(t, `apiVersion: v1
kind: Service
metadata: {name: lb, namespace: demo}
spec:
  type: LoadBalancer
  clusterIP: 10.96.0.20
  externalTrafficPolicy: Local
  healthCheckNodePort: 32000
  loadBalancerSourceRanges: [" 192.168.1.7/24 ", "fd00::/64"]
  ports: [{name: http, port: 80, nodePort: 30080}]
status:
  loadBalancer: {ingress: [{ip: 198.51.100.1}]}
`)
	if err != nil {
		t.Fatal(err)
	}
	sp := snap.Ports.Get(lb.ServicePortName{Namespace: "demo", Name: "lb", Port: "http", Protocol: lb.TCP})
	if sp == nil || sp.HealthCheckNodePort != 32000 || len(sp.SourceRanges()) != 2 ||
		sp.SourceRanges()[0] != netip.MustParsePrefix("192.168.1.0/24") || sp.LoadBalancerIPs()[0] != netip.MustParseAddr("198.51.100.1") {
		t.Fatalf("%+v", sp)
	}
}

type recordingSink struct {
	snaps   chan *lb.Snapshot
	rejects chan error
}

func (r *recordingSink) Publish(s *lb.Snapshot) { r.snaps <- s }
func (r *recordingSink) Reject(err error)       { r.rejects <- err }
func (r *recordingSink) Queued()                {}
func (r *recordingSink) Unchanged()             {}

func TestManifestSourceHotReloadAndBadReload(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "svc.yaml")
	if err := os.WriteFile(file, []byte(goodManifest), 0o644); err != nil {
		t.Fatal(err)
	}
	sink := &recordingSink{snaps: make(chan *lb.Snapshot, 16), rejects: make(chan error, 16)}
	src := &ManifestSource{Path: dir, Sink: sink, Coalesce: time.Millisecond}
	if err := src.Load(); err != nil {
		t.Fatal(err)
	}
	<-sink.snaps
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- src.Run(ctx) }()
	defer func() { cancel(); <-done }()

	// Bad update: rejected, nothing published.
	write := func(content string) {
		tmp := filepath.Join(dir, ".tmp")
		if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, file); err != nil {
			t.Fatal(err)
		}
	}
	write(strings.Replace(goodManifest, "port: 80,", "port: 0,", 1))
	for rejected := false; !rejected; {
		select {
		case err := <-sink.rejects:
			if !strings.Contains(err.Error(), "spec.ports[0].port") {
				t.Fatalf("reject error %v", err)
			}
			rejected = true
		case s := <-sink.snaps:
			t.Fatalf("bad update published: %v", s)
		}
	}
	// Good update: published, with the change. The bad update's burst of
	// events (the temporary file, the rename) may still bring a reload of
	// the bad file, rejected again before the good write is seen.
	write(strings.Replace(goodManifest, "nodePort: 30080", "nodePort: 30081", 1))
	var next *lb.Snapshot
	bound := time.After(20 * time.Second)
	for next == nil {
		select {
		case next = <-sink.snaps:
		case err := <-sink.rejects:
			if !strings.Contains(err.Error(), "spec.ports[0].port") {
				t.Fatalf("good update rejected: %v", err)
			}
		case <-bound:
			t.Fatal("the good update was never published")
		}
	}
	if np := next.Ports.Get(lb.ServicePortName{Namespace: "demo", Name: "web", Port: "http", Protocol: lb.TCP}).NodePort; np != 30081 {
		t.Fatalf("nodePort after reload = %d", np)
	}
}

type countingSink struct {
	queued    int
	published chan struct{}
}

func (c *countingSink) Publish(*lb.Snapshot) { c.published <- struct{}{} }
func (c *countingSink) Reject(error)         {}
func (c *countingSink) Queued()              { c.queued++ }
func (c *countingSink) Unchanged()           { c.published <- struct{}{} }

// A burst of change notices becomes one Queued and one reload, driven by an
// injected timer: no real time passes in this test.
func TestBurstsOfChangesCoalesceIntoOneReload(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "a.yaml"), []byte(goodManifest), 0o644)
	sink := &countingSink{published: make(chan struct{}, 10)}
	timers := make(chan chan time.Time, 10)
	after := func(time.Duration) <-chan time.Time {
		ch := make(chan time.Time, 1)
		timers <- ch
		return ch
	}
	src := &ManifestSource{Path: dir, Sink: sink}
	if err := src.Load(); err != nil {
		t.Fatal(err)
	}
	<-sink.published
	changes := make(chan struct{})
	done := make(chan struct{})
	ctx, cancel := context.WithCancel(context.Background())
	go func() { src.coalesce(ctx, changes, after, time.Second); close(done) }()

	for burst := 0; burst < 2; burst++ {
		for i := 0; i < 5; i++ {
			changes <- struct{}{} // unbuffered: each send is received before the next
		}
		timer := <-timers
		if len(timers) != 0 {
			t.Fatal("a burst armed more than one timer")
		}
		timer <- time.Time{}
		<-sink.published // exactly one reload for the burst
	}
	cancel()
	<-done
	if sink.queued != 2 || len(sink.published) != 0 {
		t.Fatalf("queued %d, extra publishes %d; want 2 bursts and no extra reloads", sink.queued, len(sink.published))
	}
}

// The document cache changes nothing but speed: a reload through it equals
// a cold load, sees an edited document, still finds duplicates among cached
// documents, and names the right document in errors.
func TestDocumentCacheIsTransparent(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "a.yaml")
	os.WriteFile(file, []byte(goodManifest), 0o644)
	var cache DocCache
	cold, err := LoadManifests(dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := loadCached(dir, &cache); err != nil {
		t.Fatal(err)
	}
	warm, err := loadCached(dir, &cache)
	if err != nil {
		t.Fatal(err)
	}
	if len(cache.docs) != 6 {
		t.Fatalf("cache holds %d documents, want the 6 objects", len(cache.docs))
	}
	a, _ := Build(cold)
	b, _ := Build(warm)
	if !reflect.DeepEqual(a, b) {
		t.Fatal("a load through the cache differs from a cold load")
	}
	// Edit one document: the change is seen.
	os.WriteFile(file, []byte(strings.Replace(goodManifest, "nodePort: 30080", "nodePort: 30090", 1)), 0o644)
	edited, err := loadCached(dir, &cache)
	if err != nil {
		t.Fatal(err)
	}
	snap, _ := Build(edited)
	if np := snap.Ports.Get(lb.ServicePortName{Namespace: "demo", Name: "web", Port: "http", Protocol: lb.TCP}).NodePort; np != 30090 {
		t.Fatalf("edit not seen through the cache: nodePort %d", np)
	}
	// A cached document repeated is a duplicate, reported at its own place.
	os.WriteFile(file, []byte(goodManifest+"---\n"+strings.SplitN(goodManifest, "---\n", 2)[0]), 0o644)
	_, err = loadCached(dir, &cache)
	if err == nil || !strings.Contains(err.Error(), "a.yaml#7: Service demo/web: metadata.name: duplicate object, first defined in "+file+"#1") {
		t.Fatalf("duplicate through the cache: %v", err)
	}
	// A broken document after cached ones names its own position.
	os.WriteFile(file, []byte(goodManifest+"---\napiVersion: v1\nkind: [\n"), 0o644)
	_, err = loadCached(dir, &cache)
	if err == nil || !strings.Contains(err.Error(), "a.yaml#7: malformed") {
		t.Fatalf("bad document through the cache: %v", err)
	}
}

// TestBuildMemoMatchesAFreshBuild applies random edits (endpoint moves,
// port changes, removed and added objects, bad objects) to a set of
// manifests, loading each state through the document cache: the memoized
// build must equal a fresh one, error for error, and every Service whose
// documents did not change must keep its very ServicePort values.
func TestBuildMemoMatchesAFreshBuild(t *testing.T) {
	const n = 12
	type state struct {
		port    [n]int // service port; 0: Service removed
		ep      [n]int // last octet of the endpoint; 0: slice removed
		legacy  [n]bool
		orphan  bool // a slice naming a missing Service
		badAddr int  // a slice with an invalid address on service badAddr-1
	}
	render := func(s state) string {
		var b strings.Builder
		for i := 0; i < n; i++ {
			if s.port[i] != 0 {
				fmt.Fprintf(&b, "apiVersion: v1\nkind: Service\nmetadata: {name: s%d, namespace: m}\nspec:\n  clusterIP: 10.96.0.%d\n  ports: [{name: p, port: %d}]\n---\n", i, i+1, s.port[i])
			}
			if s.ep[i] != 0 && !s.legacy[i] {
				addr := fmt.Sprintf("10.0.%d.%d", i, s.ep[i])
				if s.badAddr == i+1 {
					addr = "10.0.999.1"
				}
				fmt.Fprintf(&b, "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: s%d, namespace: m, labels: {kubernetes.io/service-name: s%d}}\naddressType: IPv4\nports: [{name: p, port: 8080}]\nendpoints: [{addresses: [%q]}]\n---\n", i, i, addr)
			}
			if s.ep[i] != 0 && s.legacy[i] {
				fmt.Fprintf(&b, "apiVersion: v1\nkind: Endpoints\nmetadata: {name: s%d, namespace: m}\nsubsets: [{addresses: [{ip: 10.1.%d.%d}], ports: [{name: p, port: 9090}]}]\n---\n", i, i, s.ep[i])
			}
		}
		if s.orphan {
			b.WriteString("apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: orphan, namespace: m, labels: {kubernetes.io/service-name: nobody}}\naddressType: IPv4\nendpoints: [{addresses: [10.9.9.9]}]\n---\n")
		}
		// A fixed last document: the file's last one is read without its
		// separator, so a document that moved there would be new to the
		// cache.
		b.WriteString("apiVersion: v1\nkind: Service\nmetadata: {name: tail, namespace: m}\nspec: {clusterIP: 10.96.1.1, ports: [{port: 1}]}\n")
		return b.String()
	}
	var s state
	for i := range s.port {
		s.port[i], s.ep[i] = 80, 1
	}
	rng := rand.New(rand.NewPCG(1, 2))
	dir := t.TempDir()
	file := filepath.Join(dir, "m.yaml")
	var cache DocCache
	var memo BuildMemo
	var prev, lastGood *lb.Snapshot
	var old state // the state prev was built from, the step before
	failed := 0
	for step := 0; step < 300; step++ {
		i := rng.IntN(n)
		switch rng.IntN(7) {
		case 0:
			if s.port[i] != 0 {
				s.ep[i] = rng.IntN(3) // 0 removes the slice
			}
		case 1:
			s.port[i] = []int{0, 80, 81}[rng.IntN(3)] // 0 removes the Service, and its endpoints with it
			if s.port[i] == 0 {
				s.ep[i] = 0
			}
		case 2:
			s.legacy[i] = !s.legacy[i]
		case 3:
			s.orphan = rng.IntN(8) == 0
		case 4:
			s.badAddr = 0
			if rng.IntN(8) == 0 {
				s.badAddr = i + 1
			}
		}
		if err := os.WriteFile(file, []byte(render(s)), 0o644); err != nil {
			t.Fatal(err)
		}
		objs, lerr := loadCached(dir, &cache)
		if lerr != nil {
			t.Fatalf("step %d: load: %v", step, lerr)
		}
		got, gerr := memo.Build(objs, "")
		fresh, err := LoadManifests(dir)
		if err != nil {
			t.Fatal(err)
		}
		want, werr := Build(fresh)
		if fmt.Sprint(gerr) != fmt.Sprint(werr) || (got == nil) != (want == nil) || got != nil && !reflect.DeepEqual(got.Ports, want.Ports) {
			t.Fatalf("step %d: memoized build differs from a fresh one:\ngot  %v %v\nwant %v %v", step, got, gerr, want, werr)
		}
		if gerr != nil {
			failed++
			prev = nil // the memo keeps its last good build, but the document cache moved on
			continue
		}
		// The delta it claims is the truth: its base is the last good
		// build, and every port that differs from it is named.
		if lastGood != nil {
			if got == lastGood {
				if !reflect.DeepEqual(got.Ports, lastGood.Ports) {
					t.Fatalf("step %d: the same snapshot returned for a change", step)
				}
			} else {
				if got.Base != lastGood.ID || got.ID == lastGood.ID {
					t.Fatalf("step %d: snapshot %d based on %d, want based on the last good build %d", step, got.ID, got.Base, lastGood.ID)
				}
				named := map[lb.ServicePortName]bool{}
				for _, c := range got.Changed {
					named[c] = true
				}
				check := func(name lb.ServicePortName) {
					if !reflect.DeepEqual(lastGood.Ports.Get(name), got.Ports.Get(name)) && !named[name] {
						t.Fatalf("step %d: %s changed but the delta does not name it", step, name)
					}
				}
				for name := range got.Ports.All() {
					check(name)
				}
				for name := range lastGood.Ports.All() {
					check(name)
				}
			}
		}
		lastGood = got
		if prev != nil {
			for j := 0; j < n; j++ {
				name := lb.ServicePortName{Namespace: "m", Name: fmt.Sprintf("s%d", j), Port: "p", Protocol: lb.TCP}
				a, b := prev.Ports.Get(name), got.Ports.Get(name)
				unchanged := old.port[j] == s.port[j] && old.ep[j] == s.ep[j] && old.legacy[j] == s.legacy[j] && (old.badAddr == j+1) == (s.badAddr == j+1)
				if a != nil && b != nil && unchanged && a != b {
					t.Fatalf("step %d: untouched service s%d was rebuilt (a new *ServicePort)", step, j)
				}
			}
		}
		prev, old = got, s
	}
	if failed > 100 {
		t.Fatalf("%d of 300 states were rejected: the walk tests errors more than builds", failed)
	}
	if memo.inPlace < 10 || memo.spliced < 30 {
		t.Fatalf("%d builds in place, %d spliced: the walk does not test the short ways", memo.inPlace, memo.spliced)
	}
}

// loadCached is loadManifests without a size limit.
func loadCached(dir string, c *DocCache) (*Objects, error) {
	objs, _, err := loadManifests(dir, c, 0)
	return objs, err
}

// A Service rebuilt with a port renamed loses the old port in the delta
// snapshot, and the delta names both.
func TestBuildMemoDeltaDropsARenamedPort(t *testing.T) {
	svc := func(port string) string {
		return "apiVersion: v1\nkind: Service\nmetadata: {name: a, namespace: x}\nspec:\n  clusterIP: 10.96.0.1\n  ports: [{name: " + port + ", port: 80}]\n---\n" +
			"apiVersion: v1\nkind: Service\nmetadata: {name: b, namespace: x}\nspec:\n  clusterIP: 10.96.0.2\n  ports: [{name: p, port: 80}]\n"
	}
	var m BuildMemo
	objs, err := ParseManifest("m.yaml", []byte(svc("p")))
	if err != nil {
		t.Fatal(err)
	}
	first, err := m.Build(objs, "")
	if err != nil {
		t.Fatal(err)
	}
	objs2, _ := ParseManifest("m.yaml", []byte(svc("q")))
	objs2.Services[1] = objs.Services[1] // b unchanged, as the document cache hands it back
	second, err := m.Build(objs2, "")
	if err != nil {
		t.Fatal(err)
	}
	p := lb.ServicePortName{Namespace: "x", Name: "a", Port: "p", Protocol: lb.TCP}
	q := lb.ServicePortName{Namespace: "x", Name: "a", Port: "q", Protocol: lb.TCP}
	if second.Ports.Get(p) != nil || second.Ports.Get(q) == nil || second.Ports.Len() != 2 || second.Base != first.ID {
		t.Fatalf("ports %v base %d", second.Ports, second.Base)
	}
	changed := slices.SortedFunc(slices.Values(second.Changed), lb.ServicePortName.Compare)
	if fmt.Sprint(changed) != fmt.Sprint([]lb.ServicePortName{p, q}) {
		t.Fatalf("changed %v", second.Changed)
	}
}

// Edits that replace a few objects under the same names are built in
// place, again and again on the same Service, each equal to a fresh
// build; an edit that adds a Service goes the long way.
func TestBuildMemoInPlaceEdits(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "m.yaml")
	render := func(ep1, ep2 string, extra bool) string {
		out := ""
		for _, x := range []struct{ name, ip, ep string }{{"a", "10.96.0.1", ep1}, {"b", "10.96.0.2", ep2}} {
			out += fmt.Sprintf("apiVersion: v1\nkind: Service\nmetadata: {name: %s, namespace: x}\nspec:\n  clusterIP: %s\n  ports: [{name: p, port: 80}]\n---\n", x.name, x.ip)
			out += fmt.Sprintf("apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: %s-1, namespace: x, labels: {kubernetes.io/service-name: %s}}\naddressType: IPv4\nports: [{name: p, port: 8080}]\nendpoints: [{addresses: [%s]}]\n---\n", x.name, x.name, x.ep)
		}
		if extra {
			out += "apiVersion: v1\nkind: Service\nmetadata: {name: c, namespace: x}\nspec:\n  clusterIP: 10.96.0.3\n  ports: [{name: p, port: 80}]\n"
		}
		return out
	}
	var cache DocCache
	var memo BuildMemo
	step := func(text string) *lb.Snapshot {
		t.Helper()
		os.WriteFile(file, []byte(text), 0o644)
		objs, err := loadCached(dir, &cache)
		if err != nil {
			t.Fatal(err)
		}
		got, err := memo.Build(objs, "")
		if err != nil {
			t.Fatal(err)
		}
		fresh, _ := LoadManifests(dir)
		want, _ := Build(fresh)
		if !reflect.DeepEqual(got.Ports, want.Ports) {
			t.Fatalf("differs from a fresh build:\n%v\n%v", got.Ports, want.Ports)
		}
		return got
	}
	step(render("10.0.0.1", "10.0.0.2", false))
	step(render("10.0.0.5", "10.0.0.2", false))
	step(render("10.0.0.6", "10.0.0.2", false))
	step(render("10.0.0.6", "10.0.0.7", false))
	if memo.inPlace != 3 {
		t.Fatalf("%d of 3 endpoint edits built in place", memo.inPlace)
	}
	step(render("10.0.0.6", "10.0.0.7", true))
	if memo.inPlace != 3 {
		t.Fatal("a new Service was built in place")
	}
	step(render("10.0.0.8", "10.0.0.7", true))
	if memo.inPlace != 4 {
		t.Fatalf("after the long way, an edit was not built in place (%d)", memo.inPlace)
	}
}

// A file that shrank and is then taken from the cache gives what it holds
// now: its record is the document slots of its last read, cut to its
// documents then, with the places that gave no object (an empty document)
// skipped, and a reused origin map names only this load's objects.
func TestCachedFileThatShrankReplaysWhatItHolds(t *testing.T) {
	dir := t.TempDir()
	svc := func(name string) string {
		return "apiVersion: v1\nkind: Service\nmetadata: {name: " + name + ", namespace: x}\nspec:\n  ports: [{name: p, port: 80}]\n"
	}
	write := func(file, text string) {
		if err := os.WriteFile(filepath.Join(dir, file), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// Reads an hour on: every write is well before them (no racy re-read).
	c := DocCache{now: func() time.Time { return time.Now().Add(time.Hour) }}
	load := func(want ...string) {
		t.Helper()
		reads := c.reads
		objs, err := loadCached(dir, &c)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, s := range objs.Services {
			got = append(got, s.Name)
		}
		if !slices.Equal(got, want) {
			t.Fatalf("Services %v, want %v (files read: %d)", got, want, c.reads-reads)
		}
		for _, n := range []string{"a1", "a2", "a3", "b", "b2"} {
			if o := objs.Origin("Service x/" + n); (o != "") != slices.Contains(want, n) {
				t.Errorf("origin of %s: %q with Services %v", n, o, want)
			}
		}
	}
	write("a.yaml", svc("a1")+"---\n---\n"+svc("a2"))
	write("b.yaml", svc("b"))
	load("a1", "a2", "b")
	write("a.yaml", svc("a3"))
	load("a3", "b")
	write("b.yaml", svc("b2"))
	reads := c.reads
	load("a3", "b2") // a.yaml from the cache
	if c.reads-reads != 1 {
		t.Fatalf("%d files read, want only b.yaml", c.reads-reads)
	}
	load("a3", "b2") // both from the cache
}

// The document cache keeps decodings and origins across loads and sweeps
// the ones no load found when they outnumber the live ones. A random walk
// of edits, renames (some making duplicates), moves, truncations and
// growths of one file, with a sweep whenever one is due, must load through
// the cache exactly as a cold load does: the same errors, the same build,
// the same origins. (A slot kept past a file's end, or a decoding swept
// while a slot still held it, would let a duplicate through.)
func TestDocCacheSweepsAndStaysTransparent(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "a.yaml")
	rng := rand.New(rand.NewPCG(16, 2026))
	cache := DocCache{sweepSlack: 1}
	type place struct{ name, v int }
	doc := func(p place) string {
		return fmt.Sprintf("apiVersion: v1\nkind: Service\nmetadata: {name: s%d, namespace: walk}\nspec:\n  clusterIP: 10.96.0.%d\n  ports: [{name: p, port: %d}]\n", p.name, p.name+1, 80+p.v)
	}
	var places []place
	for i := 0; i < 30; i++ {
		places = append(places, place{i, 0})
	}
	dups := 0
	var tail []place // what the last truncation cut, from cut on
	cut := 0
	for step := 0; step < 600; step++ {
		switch op := rng.IntN(8); {
		case op == 0 && len(places) > 0:
			places[rng.IntN(len(places))].v = rng.IntN(4)
		case op == 1 && len(places) > 0:
			// Often another's name: a duplicate.
			places[rng.IntN(len(places))].name = places[rng.IntN(len(places))].name
		case op == 2 && len(places) > 1:
			cut = 1 + rng.IntN(len(places)-1)
			tail = slices.Clone(places[cut:])
			places = places[:cut]
		case op >= 6 && tail != nil && len(places) >= cut:
			// The cut documents back at their places, the same text: a
			// slot kept past the file's end would take them unread.
			places = append(places[:cut], tail...)
			if op == 7 {
				// With one of them named as a document before them.
				places[rng.IntN(cut)].name = tail[rng.IntN(len(tail))].name
			}
		case op == 3:
			for n := rng.IntN(15); n > 0 && len(places) < 60; n-- {
				places = append(places, place{rng.IntN(250), rng.IntN(4)})
			}
		case op == 4 && len(places) > 1:
			k := rng.IntN(len(places))
			places = append(places[k:], places[:k]...) // every document moves
		default:
			// A fresh set: everything the cache holds goes stale.
			places = places[:0]
			for _, name := range rng.Perm(250)[:1+rng.IntN(40)] {
				places = append(places, place{name, rng.IntN(4)})
			}
		}
		var text []string
		for _, p := range places {
			text = append(text, doc(p))
		}
		if err := os.WriteFile(file, []byte(strings.Join(text, "---\n")), 0o644); err != nil {
			t.Fatal(err)
		}
		got, gerr := loadCached(dir, &cache)
		want, werr := LoadManifests(dir)
		if (gerr == nil) != (werr == nil) || (gerr != nil && gerr.Error() != werr.Error()) {
			t.Fatalf("step %d: through the cache %v, cold %v", step, gerr, werr)
		}
		if werr != nil {
			if strings.Contains(werr.Error(), "duplicate object") {
				dups++
			}
			continue
		}
		a, aerr := Build(got)
		b, berr := Build(want)
		if (aerr == nil) != (berr == nil) || !reflect.DeepEqual(a, b) {
			t.Fatalf("step %d: the build through the cache differs from a cold one (%v, %v)", step, aerr, berr)
		}
		for _, svc := range want.Services {
			id := "Service " + svc.Namespace + "/" + svc.Name
			if g, w := got.Origin(id), want.Origin(id); g != w || w == "" {
				t.Fatalf("step %d: origin of %s %q through the cache, %q cold", step, id, g, w)
			}
		}
	}
	if cache.sweeps == 0 || dups == 0 {
		t.Fatalf("the walk swept %d times and met %d duplicates; it must do both", cache.sweeps, dups)
	}
	t.Logf("%d sweeps, %d loads with duplicates, %d documents cached at the end", cache.sweeps, dups, len(cache.docs))
}

// A manifest file that comes or goes is built spliced: only the Services
// its objects touch are rebuilt, with their slices and Endpoints from
// every file in load order (a second slice of a Service in another
// file, one before the new file and one after it), as a fresh build has
// them; a Service that goes takes its ports with it.
func TestBuildMemoSplicesFilesThatComeAndGo(t *testing.T) {
	dir := t.TempDir()
	svc := func(name, ip string) string {
		return fmt.Sprintf("apiVersion: v1\nkind: Service\nmetadata: {name: %s, namespace: m}\nspec:\n  clusterIP: %s\n  ports: [{name: p, port: 80}]\n---\n", name, ip)
	}
	slice := func(name, svc, addr string) string {
		return fmt.Sprintf("apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: %s, namespace: m, labels: {kubernetes.io/service-name: %s}}\naddressType: IPv4\nports: [{name: p, port: 8080}]\nendpoints: [{addresses: [%q]}]\n---\n", name, svc, addr)
	}
	write := func(file, content string) {
		if err := os.WriteFile(filepath.Join(dir, file), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("a.yaml", svc("s1", "10.96.0.1")+slice("s1-a", "s1", "10.0.0.1"))
	write("c.yaml", svc("s2", "10.96.0.2")+slice("s2-a", "s2", "10.0.0.2")+slice("s1-c", "s1", "10.0.0.3"))
	var cache DocCache
	var memo BuildMemo
	check := func(what string, wantSpliced int) *lb.Snapshot {
		t.Helper()
		objs, err := loadCached(dir, &cache)
		if err != nil {
			t.Fatal(err)
		}
		got, gerr := memo.Build(objs, "")
		fresh, err := LoadManifests(dir)
		if err != nil {
			t.Fatal(err)
		}
		want, werr := Build(fresh)
		if fmt.Sprint(gerr) != fmt.Sprint(werr) || gerr == nil && !reflect.DeepEqual(got.Ports, want.Ports) {
			t.Fatalf("%s: memoized build differs from a fresh one:\ngot  %v %v\nwant %v %v", what, got, gerr, want, werr)
		}
		if memo.spliced != wantSpliced {
			t.Fatalf("%s: %d spliced builds, want %d", what, memo.spliced, wantSpliced)
		}
		return got
	}
	check("first", 0)
	s1 := lb.ServicePortName{Namespace: "m", Name: "s1", Port: "p", Protocol: lb.TCP}
	write("b.yaml", slice("s1-b", "s1", "10.0.0.4")) // between a and c
	if got := check("a third slice of s1 in a new file", 1); len(got.Ports.Get(s1).Endpoints) != 3 {
		t.Fatalf("s1 has %v, want the endpoints of its three slices", got.Ports.Get(s1).Endpoints)
	}
	write("d.yaml", svc("s3", "10.96.0.3")+slice("s3-a", "s3", "10.0.0.5"))
	check("a new Service in a new file", 2)
	if err := os.Remove(filepath.Join(dir, "b.yaml")); err != nil {
		t.Fatal(err)
	}
	if got := check("the new slice's file gone", 3); len(got.Ports.Get(s1).Endpoints) != 2 {
		t.Fatalf("s1 has %v, want the endpoints of its two slices", got.Ports.Get(s1).Endpoints)
	}
	if err := os.Remove(filepath.Join(dir, "d.yaml")); err != nil {
		t.Fatal(err)
	}
	if got := check("a Service's file gone", 4); got.Ports.Get(lb.ServicePortName{Namespace: "m", Name: "s3", Port: "p", Protocol: lb.TCP}) != nil {
		t.Fatal("a Service whose file went is still served")
	}
	// A slice of a Service that is gone: the error a fresh build reports.
	write("e.yaml", slice("s9-a", "s9", "10.0.0.9"))
	check("a slice of no Service", 4)
}

// A slice's endpoints are kept per port, merged, and a port whose
// endpoints come from that slice alone shares its list with the snapshot
// (issue 16's memory budget). Each port still gets its own port number,
// another slice's endpoints are merged into a copy, and a build for a
// node other than the one a slice was parsed for (none, here: it was
// parsed without a source) marks a fresh parse: nothing is written
// through into the shared list.
func TestSliceListsAreSharedAndNeverWrittenThrough(t *testing.T) {
	objs, err := ParseManifest("test.yaml", []byte(`apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  clusterIP: 10.96.0.10
  ports: [{name: a, port: 80}, {name: b, port: 81}]
---
apiVersion: v1
kind: Service
metadata: {name: api}
spec:
  clusterIP: 10.96.0.11
  ports: [{name: a, port: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: a, port: 8080}, {name: b, port: 9090}]
endpoints:
- addresses: [10.0.0.1]
  nodeName: n1
- addresses: [10.0.0.2]
  nodeName: n2
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: api-1, labels: {kubernetes.io/service-name: api}}
addressType: IPv4
ports: [{name: a, port: 8080}]
endpoints:
- addresses: [10.0.0.5]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: api-2, labels: {kubernetes.io/service-name: api}}
addressType: IPv4
ports: [{name: a, port: 8080}]
endpoints:
- addresses: [10.0.0.3]
`))
	if err != nil {
		t.Fatal(err)
	}
	eps := func(snap *lb.Snapshot, svc, port string) string {
		sp := snap.Ports.Get(lb.ServicePortName{Namespace: "default", Name: svc, Port: port, Protocol: lb.TCP})
		if sp == nil {
			t.Fatalf("no port %s:%s", svc, port)
		}
		var out []string
		for _, ep := range sp.Endpoints {
			s := ep.Addr.String()
			if ep.Local {
				s += " local"
			}
			out = append(out, s)
		}
		return strings.Join(out, ",")
	}
	for _, node := range []string{"", "n1", "n2", ""} {
		snap, err := BuildFor(objs, node)
		if err != nil {
			t.Fatal(err)
		}
		wantA, wantB := "10.0.0.1:8080,10.0.0.2:8080", "10.0.0.1:9090,10.0.0.2:9090"
		switch node {
		case "n1":
			wantA, wantB = "10.0.0.1:8080 local,10.0.0.2:8080", "10.0.0.1:9090 local,10.0.0.2:9090"
		case "n2":
			wantA, wantB = "10.0.0.1:8080,10.0.0.2:8080 local", "10.0.0.1:9090,10.0.0.2:9090 local"
		}
		if got := eps(snap, "web", "a"); got != wantA {
			t.Fatalf("node %q: web:a %s, want %s", node, got, wantA)
		}
		if got := eps(snap, "web", "b"); got != wantB {
			t.Fatalf("node %q: web:b %s, want %s", node, got, wantB)
		}
		if got := eps(snap, "api", "a"); got != "10.0.0.3:8080,10.0.0.5:8080" {
			t.Fatalf("node %q: api:a %s", node, got)
		}
	}
	// The slices themselves are as they were made.
	for _, sl := range objs.EndpointSlices {
		for _, p := range sl.ports {
			for _, ep := range p.eps {
				if ep.Local || ep.Addr.Port() != p.port {
					t.Fatalf("slice %s port %d holds %+v", sl.Name, p.port, ep)
				}
			}
		}
		if sl.Name == "api-1" && len(sl.ports[0].eps) != 1 {
			t.Fatalf("api-1's list took another slice's endpoints: %+v", sl.ports[0].eps)
		}
	}
}

// A source parses its slices for its node: the endpoints on it are Local
// in the slice itself, whose lists the snapshot shares as they are, and
// the slice keeps nothing to be parsed again; a build for another node
// names the slice instead of guessing; a cache told of another node
// starts empty.
func TestASourcesSlicesAreParsedForItsNode(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "web.yaml"), []byte(`apiVersion: v1
kind: Service
metadata: {name: web, namespace: x}
spec:
  clusterIP: 10.96.0.10
  ports: [{name: a, port: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, namespace: x, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: a, port: 8080}]
endpoints:
- addresses: [10.0.0.1]
  nodeName: n1
- addresses: [10.0.0.2]
  nodeName: n2
`), 0o644); err != nil {
		t.Fatal(err)
	}
	name := lb.ServicePortName{Namespace: "x", Name: "web", Port: "a", Protocol: lb.TCP}
	var c DocCache
	for _, node := range []string{"n1", "n1", "n2"} {
		c.forNode(node, false)
		objs, err := loadCached(dir, &c)
		if err != nil {
			t.Fatal(err)
		}
		sl := objs.EndpointSlices[0]
		if sl.rare != nil && sl.rare.src != nil {
			t.Fatalf("node %s: the source's slice kept its decoded form", node)
		}
		snap, err := BuildFor(objs, node)
		if err != nil {
			t.Fatal(err)
		}
		eps := snap.Ports.Get(name).Endpoints
		var local []string
		for _, ep := range eps {
			if ep.Local {
				local = append(local, ep.Addr.String())
			}
		}
		want := map[string]string{"n1": "10.0.0.1:8080", "n2": "10.0.0.2:8080"}[node]
		if strings.Join(local, ",") != want {
			t.Fatalf("node %s: local endpoints %v, want %s", node, local, want)
		}
		if &eps[0] != &sl.ports[0].eps[0] {
			t.Fatalf("node %s: the snapshot copied the slice's list", node)
		}
		other := map[string]string{"n1": "n2", "n2": "n1"}[node]
		if _, err := BuildFor(objs, other); err == nil || !strings.Contains(err.Error(), fmt.Sprintf("parsed for node %q, built for node %q", node, other)) ||
			!strings.Contains(err.Error(), "web-1") {
			t.Fatalf("node %s: a build for %s gave %v", node, other, err)
		}
	}
}

// The first build of a Service takes its ports themselves (one copy held
// while it is not rebuilt); the second gives copies, never writes into the
// first's, and lets the first's endpoint lists go; every later one gives
// copies too.
func TestTheFirstBuildTakesAServicesPorts(t *testing.T) {
	objs, err := ParseManifest("test.yaml", []byte(`apiVersion: v1
kind: Service
metadata: {name: web, namespace: x}
spec:
  clusterIP: 10.96.0.10
  ports: [{name: a, port: 80}, {name: b, port: 81}]
`))
	if err != nil {
		t.Fatal(err)
	}
	svc := objs.Services[0]
	slice := func(ip string) *Slice {
		return NewSlice(&discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "x", Name: "web-" + ip, Labels: map[string]string{ServiceNameLabel: "web"}},
			AddressType: discoveryv1.AddressTypeIPv4, Ports: []discoveryv1.EndpointPort{{Name: ptr("a"), Port: ptr(int32(8080))}, {Name: ptr("b"), Port: ptr(int32(9090))}},
			Endpoints: []discoveryv1.Endpoint{{Addresses: []string{ip}}}})
	}
	build := func(ip string) []*lb.ServicePort {
		t.Helper()
		ports, errs := BuildService(svc, []*Slice{slice(ip)}, "", "")
		if len(errs) > 0 || len(ports) != 2 {
			t.Fatalf("%d ports, %v", len(ports), errs)
		}
		for _, sp := range ports {
			if len(sp.Endpoints) != 1 || sp.Endpoints[0].Addr.Addr().String() != ip {
				t.Fatalf("port %s: endpoints %v, want %s", sp.Name, sp.Endpoints, ip)
			}
		}
		return ports
	}
	first := build("10.0.0.1")
	if first[0] != svc.ports[0] || first[1] != svc.ports[1] {
		t.Fatal("the first build copied the Service's ports")
	}
	second := build("10.0.0.2")
	third := build("10.0.0.3")
	for i := range first {
		if second[i] == first[i] || third[i] == second[i] || third[i] == first[i] {
			t.Fatalf("port %d: a later build gave a port another build holds", i)
		}
		if svc.ports[i] == first[i] || svc.ports[i].Endpoints != nil {
			t.Fatalf("port %d: the Service still holds the first build's port (endpoints %v)", i, svc.ports[i].Endpoints)
		}
	}
	// Each build's ports kept their own endpoints (checked again).
	for i, want := range map[int]string{0: "10.0.0.1", 1: "10.0.0.2", 2: "10.0.0.3"} {
		for _, sp := range [][]*lb.ServicePort{first, second, third}[i] {
			if got := sp.Endpoints[0].Addr.Addr().String(); got != want {
				t.Fatalf("build %d's port %s now has %s", i+1, sp.Name, got)
			}
		}
	}
}

func ptr[T any](v T) *T { return &v }

// refMerge is the merge rule written plainly, as mergeEndpoints once did
// it: the first of an address wins unless it is terminating and a later
// one is not; sorted by "ip:port" text.
func refMerge(eps []lb.Endpoint) []lb.Endpoint {
	if len(eps) == 0 {
		return nil
	}
	seen := map[lb.EndpointAddr]int{}
	var out []lb.Endpoint
	for _, ep := range eps {
		if i, dup := seen[ep.Addr]; dup {
			if out[i].Terminating && !ep.Terminating {
				out[i] = ep
			}
			continue
		}
		seen[ep.Addr] = len(out)
		out = append(out, ep)
	}
	slices.SortFunc(out, func(a, b lb.Endpoint) int { return strings.Compare(a.Addr.String(), b.Addr.String()) })
	return out
}

// TestMergeOwnedMatchesMergeEndpoints checks both merges (in place, and on
// a copy) against the rule written plainly, on random lists with addresses
// repeated, terminating or not, ports and families mixed.
func TestMergeOwnedMatchesMergeEndpoints(t *testing.T) {
	r := rand.New(rand.NewPCG(16, 12))
	addrs := []netip.Addr{netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.10"), netip.MustParseAddr("10.0.0.2"),
		netip.MustParseAddr("9.1.1.1"), netip.MustParseAddr("fd00::1"), netip.MustParseAddr("fd00::a")}
	ports := []uint16{80, 8080, 9}
	for round := range 2000 {
		n := r.IntN(12)
		eps := make([]lb.Endpoint, n)
		for i := range eps {
			eps[i] = lb.Endpoint{Addr: lb.EndpointAddrFrom(addrs[r.IntN(len(addrs))], ports[r.IntN(len(ports))]),
				Ready: r.IntN(2) == 0, Serving: r.IntN(2) == 0, Terminating: r.IntN(2) == 0, Local: r.IntN(2) == 0}
		}
		want := refMerge(eps)
		in := slices.Clone(eps)
		for name, got := range map[string][]lb.Endpoint{"mergeOwned": mergeOwned(slices.Clone(eps)), "mergeEndpoints": mergeEndpoints(in)} {
			if !slices.Equal(got, want) {
				t.Fatalf("round %d: %s(%v)\n= %v\nwant %v", round, name, eps, got, want)
			}
			if len(got) != cap(got) {
				t.Fatalf("round %d: %s kept %d endpoints with room for %d", round, name, len(got), cap(got))
			}
		}
		if !slices.Equal(in, eps) {
			t.Fatalf("round %d: mergeEndpoints changed the list it was given", round)
		}
	}
}

// TestLoadsShareNamespacesAndPortNames checks that the objects of a load
// keep one copy of each namespace and port name, not the strings decoded
// from their documents: one decoded string kept keeps the span it was
// decoded into, and with it the room of the garbage decoded beside it
// (BenchmarkManifestHeldBytesPerService reports the heap in use).
func TestLoadsShareNamespacesAndPortNames(t *testing.T) {
	dir := t.TempDir()
	var doc strings.Builder
	for i := range 3 {
		fmt.Fprintf(&doc, "apiVersion: v1\nkind: Service\nmetadata: {name: s%d, namespace: team-a}\nspec:\n  clusterIP: 10.96.0.%d\n  ports: [{name: http, port: 80}]\n---\n", i, i+1)
		fmt.Fprintf(&doc, "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: s%d-x, namespace: team-a, labels: {kubernetes.io/service-name: s%d}}\naddressType: IPv4\nports: [{name: http, port: 8080}]\nendpoints: [{addresses: [10.0.0.%d]}]\n---\n", i, i, i+1)
	}
	if err := os.WriteFile(filepath.Join(dir, "a.yaml"), []byte(doc.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	objs, err := LoadManifests(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(objs.Services) != 3 || len(objs.EndpointSlices) != 3 {
		t.Fatalf("%d Services, %d slices", len(objs.Services), len(objs.EndpointSlices))
	}
	var namespaces, portNames []string
	for _, svc := range objs.Services {
		namespaces = append(namespaces, svc.Namespace)
		for _, p := range svc.ports {
			namespaces = append(namespaces, p.Name.Namespace)
			portNames = append(portNames, p.Name.Port)
		}
	}
	for _, sl := range objs.EndpointSlices {
		namespaces = append(namespaces, sl.Namespace)
		for _, p := range sl.ports {
			portNames = append(portNames, p.name)
		}
	}
	for what, names := range map[string][]string{"namespace": namespaces, "port name": portNames} {
		if len(names) != 9 && len(names) != 6 {
			t.Fatalf("%d %ss", len(names), what)
		}
		for _, n := range names[1:] {
			if n != names[0] || unsafe.StringData(n) != unsafe.StringData(names[0]) {
				t.Errorf("%s %q is a copy of its own, not the load's shared %q", what, n, names[0])
			}
		}
	}
}

// manyPorts is n ports as a manifest lists them: p0 on 1000, p1 on 1001...
func manyPorts(n int) string {
	var b strings.Builder
	for i := range n {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "{name: p%d, port: %d}", i, 1000+i)
	}
	return b.String()
}
