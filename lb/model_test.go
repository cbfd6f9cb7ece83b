package lb

import (
	"strings"
	"testing"
)

// Compare orders names exactly as their String forms compare (then by
// protocol), over names whose pieces make the two orders differ if taken
// field by field.
func TestServicePortNameCompareMatchesStrings(t *testing.T) {
	names := []ServicePortName{
		{Namespace: "a", Name: "b"}, {Namespace: "a", Name: "b", Port: "x"}, {Namespace: "a-c", Name: "b"},
		{Namespace: "a", Name: "b-c"}, {Namespace: "a", Name: "b", Port: "x", Protocol: UDP}, {Namespace: "a", Name: "b:", Port: ""},
		{Namespace: "a/b", Name: ""}, {Namespace: "", Name: "a/b"}, {Namespace: "ab", Name: "c", Port: "1"}, {Namespace: "a", Name: "bc", Port: "1"},
		{Namespace: "a", Name: "b", Port: "x", Protocol: TCP}, {Namespace: "a", Name: "b", Port: "xy"},
	}
	for _, a := range names {
		for _, b := range names {
			want := strings.Compare(a.String(), b.String())
			if want == 0 {
				want = strings.Compare(string(a.Protocol), string(b.Protocol))
			}
			if got := a.Compare(b); got != want {
				t.Errorf("%q (%s) vs %q (%s): %d, want %d", a, a.Protocol, b, b.Protocol, got, want)
			}
		}
	}
}
