package kube

import (
	"context"
	"fmt"
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

// BenchmarkOneSliceUpdateAt10k is the API source's share of one
// EndpointSlice update at 10k Services: ns/op from the fake API's write
// to the snapshot published (most of it the fake's own bookkeeping), and
// own-us/op from the event's arrival at the source to the snapshot
// published, the source's part of sluice_update_apply_seconds (issue 16).
// go test -bench OneSliceUpdate ./controlplane/kube
func BenchmarkOneSliceUpdateAt10k(b *testing.B) {
	const n = 10000
	var objs []runtime.Object
	for i := 0; i < n; i++ {
		name := fmt.Sprintf("s%d", i)
		objs = append(objs, service(name, func(s *corev1.Service) {
			ip := fmt.Sprintf("10.96.%d.%d", i>>8, i&255)
			s.Spec.ClusterIP, s.Spec.ClusterIPs = ip, []string{ip}
		}), slice(name, name+"-a", discoveryv1.AddressTypeIPv4, ready(fmt.Sprintf("10.244.%d.%d", i>>8, i&255), "n1")))
	}
	client := fake.NewClientset(objs...)
	s := &benchSink{snaps: make(chan *lb.Snapshot, 1), own: make(chan time.Duration, 1)}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- (&Source{Client: client, Sink: s}).Run(ctx) }()
	defer func() { cancel(); <-done }()
	<-s.snaps // the initial list
	var own time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		name := fmt.Sprintf("s%d", i%n)
		sl := slice(name, name+"-a", discoveryv1.AddressTypeIPv4, ready(fmt.Sprintf("10.245.%d.%d", i>>8&255, i&255), "n1"))
		if _, err := client.DiscoveryV1().EndpointSlices("default").Update(ctx, sl, metav1.UpdateOptions{}); err != nil {
			b.Fatal(err)
		}
		<-s.snaps
		own += <-s.own
	}
	b.ReportMetric(float64(own.Microseconds())/float64(b.N), "own-us/op")
}

// benchSink hands over published snapshots and, for timed ones, the
// time from the change's arrival to now; it drops the rest.
type benchSink struct {
	snaps chan *lb.Snapshot
	own   chan time.Duration
}

func (s *benchSink) Publish(snap *lb.Snapshot) { s.snaps <- snap }
func (s *benchSink) PublishTimed(snap *lb.Snapshot, times controlplane.UpdateTimes) {
	var took time.Duration
	for _, at := range times.Arrived {
		took = max(took, time.Since(at))
	}
	s.snaps <- snap
	s.own <- took
}
func (s *benchSink) Unchanged()   {}
func (s *benchSink) Reject(error) {}
func (s *benchSink) Queued()      {}
