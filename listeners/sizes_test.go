package listeners

import (
	"testing"
	"unsafe"
)

// A service port with listeners of its own holds one ownFrontends and a
// slice of openFrontends: each is held to its size class, as its doc
// says (issue 16's memory budget), so that a field added among them is
// seen.
func TestPortRecordSizes(t *testing.T) {
	if n := unsafe.Sizeof(openFrontend{}); n > 48 {
		t.Errorf("openFrontend is %d bytes, want at most 48", n)
	}
	if n := unsafe.Sizeof(ownFrontends{}); n > 32 {
		t.Errorf("ownFrontends is %d bytes, want at most 32", n)
	}
	if n := unsafe.Sizeof(Target{}); n > 48 {
		t.Errorf("Target is %d bytes, want at most 48", n)
	}
}

// roleIndex and roles name each role the same way round.
func TestRolesRoundTrip(t *testing.T) {
	for _, r := range []Role{RoleNodePort, RoleExternalIP, RoleLoadBalancer, RoleProxyPort, RoleExternalProxyPort, RoleClusterIP} {
		if got := roles()[roleIndex(r)]; got != r {
			t.Errorf("role %q came back as %q", r, got)
		}
	}
}
