package main

import (
	"errors"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/events"

	"github.com/sluice-proxy/sluice/admin"
)

// kubeEvents records the Kubernetes Events kube-proxy v1.34 records, through
// the events.k8s.io API and under its reporting controller's name
// ("kube-proxy"), so that `kubectl describe node` and `kubectl get events`
// show what they showed before the swap: "Starting" on the Node when the
// proxy starts, and "FailedToStartServiceHealthcheck" on a Service whose
// health check node port cannot be opened. A nil *kubeEvents records
// nothing (manifests mode has no API to record to).
type kubeEvents struct {
	broadcaster events.EventBroadcaster
	recorder    events.EventRecorder
	node        string
	done        chan struct{} // closed by stop: ends the broadcaster's series refreshers
}

// newKubeEvents starts recording to client's API for node.
func newKubeEvents(client kubernetes.Interface, node string) *kubeEvents {
	b := events.NewBroadcaster(&events.EventSinkImpl{Interface: client.EventsV1()})
	done := make(chan struct{})
	b.StartRecordingToSink(done)
	return &kubeEvents{broadcaster: b, recorder: b.NewRecorder(scheme.Scheme, "kube-proxy"), node: node, done: done}
}

// stop sends what is queued, as far as the broadcaster does, and stops.
func (k *kubeEvents) stop() {
	if k != nil {
		close(k.done)
		k.broadcaster.Shutdown()
	}
}

// starting is kube-proxy's "Starting" Event on its Node.
func (k *kubeEvents) starting() {
	if k == nil {
		return
	}
	ref := &corev1.ObjectReference{Kind: "Node", Name: k.node, UID: types.UID(k.node)}
	k.recorder.Eventf(ref, nil, corev1.EventTypeNormal, "Starting", "StartKubeProxy", "")
}

// healthCheckFailed is kube-proxy's Warning on a Service whose health
// check node port could not be opened (err, when it is one).
func (k *kubeEvents) healthCheckFailed(err error) {
	var hc *admin.HealthCheckError
	if k == nil || !errors.As(err, &hc) {
		return
	}
	nsn := hc.Namespace + "/" + hc.Name
	ref := &corev1.ObjectReference{Kind: "Service", Namespace: hc.Namespace, Name: hc.Name, UID: types.UID(nsn)}
	k.recorder.Eventf(ref, nil, corev1.EventTypeWarning, "FailedToStartServiceHealthcheck", "Listen",
		"node %s failed to start healthcheck %q on port %d: %v", k.node, nsn, hc.Port, hc.Err)
}
