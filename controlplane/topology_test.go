package controlplane

import (
	"bytes"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/lb"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// Cluster traffic follows the EndpointSlices' topology hints as kube-proxy
// v1.34's topologyModeFromHints decides (pkg/proxy/topology.go): node
// hints first, when every ready endpoint has them and one is for this
// node; then zone hints, when every ready endpoint has them and one is for
// the node's zone; else every endpoint. Hints of endpoints that are not
// ready do not count.
func TestTopologyHintsAsKubeProxyReadsThem(t *testing.T) {
	objs, err := ParseManifest("test.yaml", []byte("apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: x}\nspec:\n  clusterIP: 10.96.0.10\n  ports: [{name: a, port: 80}]\n"))
	if err != nil {
		t.Fatal(err)
	}
	svc := objs.Services[0]
	type ep struct {
		ip     string
		ready  bool
		zones  string // comma-separated forZones ("": none)
		nodes  string // comma-separated forNodes
		sliceN int    // which slice it is in
	}
	build := func(node, zone string, eps ...ep) []string {
		t.Helper()
		var sls []*Slice
		for n := 0; n < 2; n++ {
			sl := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "x", Name: "web-" + string(rune('a'+n)), Labels: map[string]string{ServiceNameLabel: "web"}},
				AddressType: discoveryv1.AddressTypeIPv4, Ports: []discoveryv1.EndpointPort{{Name: ptr("a"), Port: ptr(int32(8080))}}}
			for _, e := range eps {
				if e.sliceN != n {
					continue
				}
				d := discoveryv1.Endpoint{Addresses: []string{e.ip}, Conditions: discoveryv1.EndpointConditions{Ready: ptr(e.ready)}}
				if e.zones != "" || e.nodes != "" {
					d.Hints = &discoveryv1.EndpointHints{}
					for _, z := range strings.Split(e.zones, ",") {
						if z != "" {
							d.Hints.ForZones = append(d.Hints.ForZones, discoveryv1.ForZone{Name: z})
						}
					}
					for _, n := range strings.Split(e.nodes, ",") {
						if n != "" {
							d.Hints.ForNodes = append(d.Hints.ForNodes, discoveryv1.ForNode{Name: n})
						}
					}
				}
				sl.Endpoints = append(sl.Endpoints, d)
			}
			if len(sl.Endpoints) > 0 {
				sls = append(sls, NewSliceFor(sl, node))
			}
		}
		ports, errs := BuildService(svc, sls, node, zone)
		if len(errs) > 0 || len(ports) != 1 {
			t.Fatalf("%d ports, %v", len(ports), errs)
		}
		var got []string
		for _, a := range ports[0].Select(false) {
			got = append(got, a.Addr().String())
		}
		return got
	}
	for _, tc := range []struct {
		name, node, zone string
		eps              []ep
		want             string
	}{
		{"no hints", "n1", "z1", []ep{{ip: "10.0.0.1", ready: true}, {ip: "10.0.0.2", ready: true}}, "10.0.0.1,10.0.0.2"},
		{"zone hints", "n1", "z1", []ep{{ip: "10.0.0.1", ready: true, zones: "z1"}, {ip: "10.0.0.2", ready: true, zones: "z2"}, {ip: "10.0.0.3", ready: true, zones: "z2,z1"}}, "10.0.0.1,10.0.0.3"},
		{"zone hints, no zone label", "n1", "", []ep{{ip: "10.0.0.1", ready: true, zones: "z1"}, {ip: "10.0.0.2", ready: true, zones: "z2"}}, "10.0.0.1,10.0.0.2"},
		{"zone hints, none for the zone", "n1", "z3", []ep{{ip: "10.0.0.1", ready: true, zones: "z1"}, {ip: "10.0.0.2", ready: true, zones: "z2"}}, "10.0.0.1,10.0.0.2"},
		{"one ready endpoint without hints", "n1", "z1", []ep{{ip: "10.0.0.1", ready: true, zones: "z1"}, {ip: "10.0.0.2", ready: true}}, "10.0.0.1,10.0.0.2"},
		{"an unready endpoint without hints", "n1", "z1", []ep{{ip: "10.0.0.1", ready: true, zones: "z1"}, {ip: "10.0.0.2", ready: true, zones: "z2"}, {ip: "10.0.0.3"}}, "10.0.0.1"},
		{"hints across slices", "n1", "z1", []ep{{ip: "10.0.0.1", ready: true, zones: "z1"}, {ip: "10.0.0.2", ready: true, zones: "z2", sliceN: 1}}, "10.0.0.1"},
		{"a slice without hints", "n1", "z1", []ep{{ip: "10.0.0.1", ready: true, zones: "z1"}, {ip: "10.0.0.2", ready: true, sliceN: 1}}, "10.0.0.1,10.0.0.2"},
		{"node hints", "n1", "z1", []ep{{ip: "10.0.0.1", ready: true, nodes: "n1", zones: "z2"}, {ip: "10.0.0.2", ready: true, nodes: "n2", zones: "z1"}}, "10.0.0.1"},
		{"node hints for other nodes: zone", "n3", "z1", []ep{{ip: "10.0.0.1", ready: true, nodes: "n1", zones: "z2"}, {ip: "10.0.0.2", ready: true, nodes: "n2", zones: "z1"}}, "10.0.0.2"},
		{"node hints on some: zone", "n1", "z1", []ep{{ip: "10.0.0.1", ready: true, nodes: "n1", zones: "z2"}, {ip: "10.0.0.2", ready: true, zones: "z1"}}, "10.0.0.2"},
		{"no node name", "", "z1", []ep{{ip: "10.0.0.1", ready: true, nodes: "n1", zones: "z1"}, {ip: "10.0.0.2", ready: true, nodes: "n2", zones: "z2"}}, "10.0.0.1"},
	} {
		if got := strings.Join(build(tc.node, tc.zone, tc.eps...), ","); got != tc.want {
			t.Errorf("%s: cluster traffic to %s, want %s", tc.name, got, tc.want)
		}
	}
	// A build with hints, then one without: the second's ports, copied
	// from the first's, keep nothing of its topology.
	build("n1", "z1", ep{ip: "10.0.0.1", ready: true, zones: "z1"}, ep{ip: "10.0.0.2", ready: true, zones: "z2"})
	if got := build("n1", "z1", ep{ip: "10.0.0.1", ready: true}, ep{ip: "10.0.0.2", ready: true}); !slices.Equal(got, []string{"10.0.0.1", "10.0.0.2"}) {
		t.Errorf("after a build with hints: %v", got)
	}
}

// webWithSlice is a Service x/web and its EndpointSlice, up to the
// slice's endpoints, which a test writes.
const webWithSlice = `apiVersion: v1
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
`

// A manifest source reads the node hints unless told to ignore them
// (kube-proxy's PreferSameTrafficDistribution gate off), and reads the
// zone hints either way.
func TestManifestSourceIgnoresNodeHintsWhenTold(t *testing.T) {
	const manifest = webWithSlice + `- addresses: [10.0.0.1]
  hints: {forNodes: [{name: node-a}], forZones: [{name: z1}]}
- addresses: [10.0.0.2]
  hints: {forNodes: [{name: node-b}], forZones: [{name: z1}]}
`
	for _, tc := range []struct {
		ignore bool
		want   string
	}{
		{false, "10.0.0.1"},         // node hints: this node's endpoint only
		{true, "10.0.0.1,10.0.0.2"}, // zone hints (no zone here): all
	} {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, "svc.yaml"), []byte(manifest), 0o644); err != nil {
			t.Fatal(err)
		}
		sink := &recordingSink{snaps: make(chan *lb.Snapshot, 1), rejects: make(chan error, 1)}
		src := &ManifestSource{Path: dir, Sink: sink, NodeName: "node-a", IgnoreNodeHints: tc.ignore}
		if err := src.Load(); err != nil {
			t.Fatal(err)
		}
		sp := (<-sink.snaps).Ports.Get(lb.ServicePortName{Namespace: "x", Name: "web", Port: "a", Protocol: lb.TCP})
		if sp == nil {
			t.Fatal("no port x/web:a")
		}
		var got []string
		for _, a := range sp.Select(false) {
			got = append(got, a.Addr().String())
		}
		slices.Sort(got)
		if strings.Join(got, ",") != tc.want {
			t.Errorf("IgnoreNodeHints=%v: cluster traffic to %v, want %s", tc.ignore, got, tc.want)
		}
	}
}

// With --manifests, this node's Node object in the files gives the zone
// that the slices' zone hints are read for, as the Node from the API
// server does: a change of its zone label rebuilds the Services, Nodes of
// other nodes are skipped, a second one or one that does not decode is
// refused naming it, and without it no zone hint is followed.
func TestManifestNodeZoneSteersTheZoneHints(t *testing.T) {
	const svc = webWithSlice + `- addresses: [10.0.0.1]
  hints: {forZones: [{name: z1}]}
- addresses: [10.0.0.2]
  hints: {forZones: [{name: z2}]}
`
	node := func(name, zone string) string {
		return fmt.Sprintf("apiVersion: v1\nkind: Node\nmetadata:\n  name: %s\n  labels: {topology.kubernetes.io/zone: %s}\n", name, zone)
	}
	dir := t.TempDir()
	write := func(name, text string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	remove := func(name string) {
		t.Helper()
		if err := os.Remove(filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	write("svc.yaml", svc)
	var logs bytes.Buffer
	sink := &recordingSink{snaps: make(chan *lb.Snapshot, 16), rejects: make(chan error, 16)}
	src := &ManifestSource{Path: dir, Sink: sink, NodeName: "node-a", Log: slog.New(slog.NewTextHandler(&logs, nil))}
	cluster := func(when string, want string) {
		t.Helper()
		var snap *lb.Snapshot
		select { // Reload is synchronous: what it gave is there
		case snap = <-sink.snaps:
		case err := <-sink.rejects:
			t.Fatalf("%s: rejected: %v", when, err)
		default:
			t.Fatalf("%s: nothing published (nothing changed)", when)
		}
		sp := snap.Ports.Get(lb.ServicePortName{Namespace: "x", Name: "web", Port: "a", Protocol: lb.TCP})
		if sp == nil {
			t.Fatalf("%s: no port x/web:a", when)
		}
		var got []string
		for _, a := range sp.Select(false) {
			got = append(got, a.Addr().String())
		}
		slices.Sort(got)
		if strings.Join(got, ",") != want {
			t.Fatalf("%s: cluster traffic to %v, want %s", when, got, want)
		}
	}
	rejected := func(when string, want ...string) {
		t.Helper()
		select {
		case snap := <-sink.snaps:
			t.Fatalf("%s: published snapshot %d, want a rejection", when, snap.ID)
		case err := <-sink.rejects:
			for _, w := range want {
				if !strings.Contains(err.Error(), w) {
					t.Fatalf("%s: error %q does not say %q", when, err, w)
				}
			}
		default:
			t.Fatalf("%s: accepted, nothing changed", when)
		}
	}
	if err := src.Load(); err != nil {
		t.Fatal(err)
	}
	cluster("no Node", "10.0.0.1,10.0.0.2")

	// A file of Nodes alone (not an empty file), another node's first.
	write("nodes.yaml", node("node-b", "z1")+"---\n"+node("node-a", "z2"))
	src.Reload()
	cluster("in zone z2", "10.0.0.2")
	for _, want := range []string{`zone=z2`, `kind="v1/Node (of another node than node-a)"`} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("the log does not say %s:\n%s", want, logs.String())
		}
	}

	write("nodes.yaml", node("node-b", "z1")+"---\n"+node("node-a", "z1"))
	src.Reload()
	cluster("moved to zone z1", "10.0.0.1")

	write("svc.yaml", svc+"---\n"+node("node-a", "z2"))
	src.Reload()
	rejected("a second Node of this node's", "Node node-a: metadata.name: duplicate object, first defined in "+filepath.Join(dir, "nodes.yaml")+"#2")

	write("svc.yaml", svc)
	write("nodes.yaml", node("node-a", "z2")+"spec: {bogus: 1}\n")
	src.Reload()
	rejected("a Node with an unknown field", "Node node-a: spec.bogus: unknown field")

	remove("nodes.yaml")
	write("node.json", `{"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-a", "labels": {"topology.kubernetes.io/zone": "z2"}}}`)
	src.Reload()
	cluster("in zone z2, from JSON", "10.0.0.2")

	remove("node.json")
	src.Reload()
	cluster("the Node gone", "10.0.0.1,10.0.0.2")
	if !strings.Contains(logs.String(), "no Node object for this node any more") {
		t.Errorf("the log does not say the Node went:\n%s", logs.String())
	}
}

// A file whose identity has not changed is replayed from its record, its
// Node with it, rather than read again; a Node that is a List's item has
// no document's place to be replayed at, so its file is read each load.
func TestNodeZoneOfAnUnchangedFileIsReplayed(t *testing.T) {
	const svc = "apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: x}\nspec:\n  ports: [{name: a, port: 80}]\n"
	for _, tc := range []struct {
		name, text string
		reread     bool
	}{
		{"node.yaml", svc + "---\napiVersion: v1\nkind: Node\nmetadata: {name: n1, labels: {topology.kubernetes.io/zone: z1}}\n", false},
		{"node.json", `{"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1", "labels": {"topology.kubernetes.io/zone": "z1"}}}`, false},
		{"list.yaml", "apiVersion: v1\nkind: List\nitems:\n- apiVersion: v1\n  kind: Node\n  metadata: {name: n1, labels: {topology.kubernetes.io/zone: z1}}\n", true},
	} {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, tc.name), []byte(tc.text), 0o644); err != nil {
			t.Fatal(err)
		}
		if tc.name != "node.yaml" {
			if err := os.WriteFile(filepath.Join(dir, "svc.yaml"), []byte(svc), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		// An hour ahead, the files' times are trusted (not "racy").
		c := &DocCache{node: "n1", now: func() time.Time { return time.Now().Add(time.Hour) }}
		for load := 0; load < 2; load++ {
			reads := c.reads
			objs, err := loadCached(dir, c)
			if err != nil {
				t.Fatalf("%s, load %d: %v", tc.name, load, err)
			}
			if zone, at, found := objs.NodeZone(); zone != "z1" || !found || !strings.HasPrefix(at, filepath.Join(dir, tc.name)) {
				t.Fatalf("%s, load %d: zone %q at %q (%v), want z1 in the file", tc.name, load, zone, at, found)
			}
			if load == 1 {
				if got, want := c.reads-reads, map[bool]int{false: 0, true: 1}[tc.reread]; got != want {
					t.Errorf("%s: the second load read %d files, want %d", tc.name, got, want)
				}
			}
		}
	}
}

// A Node as `kubectl get node -o yaml` writes it (managed fields,
// conditions, capacity, images, node info) decodes strictly, and what a
// proxy reads of it is kept.
func TestANodeAsKubectlWritesItIsRead(t *testing.T) {
	n := &corev1.Node{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Node"},
		ObjectMeta: metav1.ObjectMeta{Name: "node-a", UID: "0b8e6f4c-1d5b-4d0a-9a57-2c4f6d1f7e11", ResourceVersion: "4242",
			CreationTimestamp: metav1.Now(), Labels: map[string]string{"kubernetes.io/hostname": "node-a", corev1.LabelTopologyZone: "z1"},
			Annotations:   map[string]string{"node.alpha.kubernetes.io/ttl": "0"},
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubelet", Operation: metav1.ManagedFieldsOperationUpdate, APIVersion: "v1", FieldsType: "FieldsV1", FieldsV1: &metav1.FieldsV1{Raw: []byte(`{"f:metadata":{"f:labels":{".":{}}}}`)}}}},
		Spec: corev1.NodeSpec{PodCIDR: "10.244.1.0/24", PodCIDRs: []string{"10.244.1.0/24"}, ProviderID: "kind://docker/kind/node-a",
			Taints: []corev1.Taint{{Key: "node-role.kubernetes.io/control-plane", Effect: corev1.TaintEffectNoSchedule}}},
		Status: corev1.NodeStatus{
			Capacity:        corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("2"), corev1.ResourceMemory: resource.MustParse("24Gi")},
			Allocatable:     corev1.ResourceList{corev1.ResourcePods: resource.MustParse("110")},
			Conditions:      []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady", LastHeartbeatTime: metav1.Now()}},
			Addresses:       []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "192.168.1.5"}, {Type: corev1.NodeHostName, Address: "node-a"}},
			DaemonEndpoints: corev1.NodeDaemonEndpoints{KubeletEndpoint: corev1.DaemonEndpoint{Port: 10250}},
			NodeInfo:        corev1.NodeSystemInfo{KubeletVersion: "v1.34.2", OperatingSystem: "linux", Architecture: "amd64"},
			Images:          []corev1.ContainerImage{{Names: []string{"registry.k8s.io/pause:3.10"}, SizeBytes: 320368}},
		},
	}
	text, err := yaml.Marshal(n)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "node.yaml"), text, 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := (&ManifestSource{Path: dir, NodeName: "node-a"}).Prime()
	if err != nil {
		t.Fatalf("%v\n%s", err, text)
	}
	if got == nil || got.Labels[corev1.LabelTopologyZone] != "z1" || !slices.Equal(PodCIDRs(got), []string{"10.244.1.0/24"}) ||
		len(got.Status.Addresses) != 2 || !NodeEligible(got) || len(got.Spec.Taints) != 0 || got.Annotations != nil {
		t.Fatalf("read %+v", got)
	}
	if other, err := (&ManifestSource{Path: dir, NodeName: "node-b"}).Prime(); err != nil || other != nil {
		t.Fatalf("for node-b: %v, %v", other, err)
	}
}

// Prime's read, made for the Node before the data plane, is the one Load
// takes: the files are not read and the documents not decoded again.
func TestLoadAfterPrimeReadsNothingAgain(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "svc.yaml"), []byte(webWithSlice+"- addresses: [10.0.0.1]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "node.yaml"), []byte("apiVersion: v1\nkind: Node\nmetadata: {name: node-a, labels: {topology.kubernetes.io/zone: z1}}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	sink := &recordingSink{snaps: make(chan *lb.Snapshot, 1), rejects: make(chan error, 1)}
	// An hour ahead, the files' times are trusted (not "racy"), as those
	// of files written before a start-up are.
	src := &ManifestSource{Path: dir, Sink: sink, NodeName: "node-a", Now: func() time.Time { return time.Now().Add(time.Hour) }}
	n, err := src.Prime()
	if err != nil || n == nil || n.Labels[corev1.LabelTopologyZone] != "z1" {
		t.Fatalf("Prime: %v, %v", n, err)
	}
	reads, docs := src.cache.reads, len(src.cache.docs)
	if reads != 2 || docs != 2 {
		t.Fatalf("Prime read %d files and decoded %d documents, want 2 and 2", reads, docs)
	}
	if err := src.Load(); err != nil {
		t.Fatal(err)
	}
	select {
	case snap := <-sink.snaps:
		if snap.Ports.Get(lb.ServicePortName{Namespace: "x", Name: "web", Port: "a", Protocol: lb.TCP}) == nil {
			t.Fatal("Load after Prime does not serve x/web:a")
		}
	default:
		t.Fatal("Load after Prime published nothing")
	}
	if src.cache.reads != reads || len(src.cache.docs) != docs {
		t.Fatalf("Load after Prime read %d more files, %d more documents", src.cache.reads-reads, len(src.cache.docs)-docs)
	}
}
