package kubetest

import "testing"

// The ports drawn for etcd and kube-apiserver go through the caller's
// claim (ClaimPorts): one it says was handed out already is never used,
// and one it accepted is recorded by it.
func TestClusterPortsGoThroughTheCallersClaim(t *testing.T) {
	var o options
	handedOut := map[int]bool{}
	refused := 0
	ClaimPorts(func(port int) bool {
		if refused < 3 { // as if the caller had handed out these three
			refused++
			handedOut[port] = false
			return false
		}
		if _, seen := handedOut[port]; seen {
			return false
		}
		handedOut[port] = true
		return true
	})(&o)
	c := &Cluster{t: t, claim: o.claim}
	a, b := c.freePort(), c.freePort()
	if refused != 3 || !handedOut[a] || !handedOut[b] || a == b {
		t.Fatalf("ports %d and %d; the claim refused %d and recorded %v", a, b, refused, handedOut)
	}
}
