package kube

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/sluice-proxy/sluice/lb"
)

// controllerSlice is an EndpointSlice as Kubernetes' EndpointSlice
// controller writes one (labels, owner, conditions, node, zone, the pod
// each endpoint is), the shape the API churn bench loads.
func controllerSlice(i, endpoints int) *discoveryv1.EndpointSlice {
	name := fmt.Sprintf("svc-%05d", i)
	port, pname, proto := int32(8080), "http", corev1.ProtocolTCP
	yes, no, node, zone := true, false, fmt.Sprintf("node-%d", i%8), "zone-a"
	sl := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: name + "-x7k2p", GenerateName: name + "-", Namespace: "default",
			UID: types.UID(fmt.Sprintf("0b7e2f4c-1d2e-4f3a-9b8c-%012d", i)), ResourceVersion: fmt.Sprint(100000 + i),
			Labels:      map[string]string{discoveryv1.LabelServiceName: name, discoveryv1.LabelManagedBy: "endpointslice-controller.k8s.io"},
			Annotations: map[string]string{corev1.EndpointsLastChangeTriggerTime: "2026-11-26T09:00:00Z"},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Service", Name: name,
				UID: types.UID(fmt.Sprintf("6f1c2a3b-4d5e-4f60-8a7b-%012d", i)), Controller: &yes, BlockOwnerDeletion: &yes}}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: &pname, Port: &port, Protocol: &proto}},
	}
	for e := 0; e < endpoints; e++ {
		host := fmt.Sprintf("%s-7d4b9c8f6d-%05d", name, e)
		sl.Endpoints = append(sl.Endpoints, discoveryv1.Endpoint{
			Addresses:  []string{fmt.Sprintf("10.%d.%d.%d", 244+e, i>>8&255, i&255)},
			Conditions: discoveryv1.EndpointConditions{Ready: &yes, Serving: &yes, Terminating: &no},
			NodeName:   &node, Zone: &zone,
			TargetRef: &corev1.ObjectReference{Kind: "Pod", Namespace: "default", Name: host,
				UID: types.UID(fmt.Sprintf("6f1c2a3b-4d5e-4f60-8a7b-%012d", i*16+e))}})
	}
	return sl
}

// appService is a Service as an application's chart writes one: labels,
// a selector, one named port, a ClusterIP of each family's list.
func appService(i int) *corev1.Service {
	name := fmt.Sprintf("svc-%05d", i)
	labels := map[string]string{"app.kubernetes.io/name": name, "app.kubernetes.io/instance": "prod",
		"app.kubernetes.io/managed-by": "Helm", "helm.sh/chart": "web-1.2.3"}
	ip := fmt.Sprintf("10.96.%d.%d", i>>8&255, i&255)
	single, cluster := corev1.IPFamilyPolicySingleStack, corev1.ServiceInternalTrafficPolicyCluster
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", Labels: labels,
			UID: types.UID(fmt.Sprintf("6f1c2a3b-4d5e-4f60-8a7b-%012d", i)), ResourceVersion: fmt.Sprint(100000 + i)},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP, ClusterIP: ip, ClusterIPs: []string{ip},
			Selector:   map[string]string{"app.kubernetes.io/name": name, "app.kubernetes.io/instance": "prod"},
			Ports:      []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP, AppProtocol: ptr("http")}},
			IPFamilies: []corev1.IPFamily{corev1.IPv4Protocol}, IPFamilyPolicy: &single, InternalTrafficPolicy: &cluster,
			SessionAffinity: corev1.ServiceAffinityNone},
	}
}

// BenchmarkCachedObjectBytes is what one Service and one EndpointSlice of
// 10 endpoints hold on the heap once the source has them: decoded
// from protobuf, as the API client receives them, then made into what the
// source keeps (cachedService, cachedSlice: issue 16's memory budget).
// Trimmed discoveryv1 and corev1 objects held 3288 and 976 bytes; the
// compact ones 1120 and 656 at first, then 504 and 384, 488 and 304 now, and the
// snapshot shares the slice's endpoint lists besides. The figures are
// counted, not timed: live heap after a collection, divided by the
// objects held.
// go test -run '^$' -bench CachedObjectBytes ./controlplane/kube
func BenchmarkCachedObjectBytes(b *testing.B) {
	const n = 5000
	for _, kind := range []struct {
		name    string
		marshal func(i int) ([]byte, error)
		decode  func([]byte) (any, error)
	}{
		{"slice", func(i int) ([]byte, error) { return controllerSlice(i, 10).Marshal() },
			func(w []byte) (any, error) { o := &discoveryv1.EndpointSlice{}; return o, o.Unmarshal(w) }},
		{"service", func(i int) ([]byte, error) { return appService(i).Marshal() },
			func(w []byte) (any, error) { o := &corev1.Service{}; return o, o.Unmarshal(w) }},
	} {
		b.Run(kind.name, func(b *testing.B) {
			wire := make([][]byte, n)
			for i := range wire {
				var err error
				if wire[i], err = kind.marshal(i); err != nil {
					b.Fatal(err)
				}
			}
			trim := newProxyTrim("node-1")
			var perObject float64
			for b.Loop() {
				held := make([]any, n)
				before := liveHeap()
				for i, w := range wire {
					o, err := kind.decode(w)
					if err != nil {
						b.Fatal(err)
					}
					if held[i], err = trim.transform(o); err != nil {
						b.Fatal(err)
					}
				}
				perObject = float64(liveHeap()-before) / n
				runtime.KeepAlive(held)
			}
			b.ReportMetric(perObject, "B/object")
		})
	}
}

func liveHeap() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// BenchmarkSourceHeldBytesPerService is what the API source holds per
// Service of one port and an EndpointSlice of 10 endpoints once its
// initial list is published, the snapshot included: the source's own map
// of each Service, its slices and its built ports, and what the
// reflectors keep (issue 16's memory budget). The fake API's store is made
// before the count starts, and the list's copies are garbage by its end.
// go test -run '^$' -bench SourceHeldBytes ./controlplane/kube
func BenchmarkSourceHeldBytesPerService(b *testing.B) {
	const n = 5000
	var objs []kruntime.Object
	for i := range n {
		objs = append(objs, appService(i), controllerSlice(i, 10))
	}
	var perService float64
	for b.Loop() {
		client := fake.NewClientset(objs...)
		s := &benchSink{snaps: make(chan *lb.Snapshot, 1), own: make(chan time.Duration, 1)}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		before := liveHeap()
		go func() { done <- (&Source{Client: client, Sink: s, NodeName: "node-1"}).Run(ctx) }()
		snap := <-s.snaps
		perService = float64(liveHeap()-before) / n
		if got := snap.Ports.Len(); got != n {
			b.Fatalf("%d ports published, want %d", got, n)
		}
		cancel()
		if err := <-done; err != nil && err != context.Canceled {
			b.Fatal(err)
		}
	}
	b.ReportMetric(perService, "B/service")
}

// BenchmarkInitialListHeapInUse is the heap a list of 10,000 Services and
// their EndpointSlices (10 endpoints each) keeps in use once the source
// has made what it keeps of it, as on a first list:
// every object decoded from protobuf, then each transformed, then the
// decoded ones dropped. Beside the live bytes it reports the heap in use
// (spans with a live object in them), which is what resident memory
// follows: a kept object that holds one string of its decoded self, or a
// list made among garbage of its size, keeps the whole span
// (TestCachedObjectsKeepNoDecodedString). Counted, not timed.
// go test -run '^$' -bench InitialListHeapInUse -benchtime 3x ./controlplane/kube
func BenchmarkInitialListHeapInUse(b *testing.B) {
	const n = 10000
	wire := make([][2][]byte, n)
	for i := range wire {
		var err error
		if wire[i][0], err = appService(i).Marshal(); err != nil {
			b.Fatal(err)
		}
		if wire[i][1], err = controllerSlice(i, 10).Marshal(); err != nil {
			b.Fatal(err)
		}
	}
	var live, inUse float64
	for b.Loop() {
		trim := newProxyTrim("node-1")
		runtime.GC()
		var m0 runtime.MemStats
		runtime.ReadMemStats(&m0)
		decoded := make([]any, 0, 2*n)
		for _, w := range wire {
			svc, sl := &corev1.Service{}, &discoveryv1.EndpointSlice{}
			if err := svc.Unmarshal(w[0]); err != nil {
				b.Fatal(err)
			}
			if err := sl.Unmarshal(w[1]); err != nil {
				b.Fatal(err)
			}
			decoded = append(decoded, svc, sl)
		}
		held := make([]any, len(decoded))
		for i, o := range decoded {
			var err error
			if held[i], err = trim.transform(o); err != nil {
				b.Fatal(err)
			}
		}
		decoded = nil
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		live = (float64(m.HeapAlloc) - float64(m0.HeapAlloc)) / n
		inUse = (float64(m.HeapInuse) - float64(m0.HeapInuse)) / n
		runtime.KeepAlive(held)
	}
	b.ReportMetric(live, "live-B/service")
	b.ReportMetric(inUse, "inuse-B/service")
}
