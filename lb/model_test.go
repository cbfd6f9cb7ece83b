package lb

import (
	"net/netip"
	"reflect"
	"strings"
	"testing"
	"unsafe"
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

// With names every port it sets or removes, once, and bases the result on
// the snapshot it came from.
func TestSnapshotWithNamesTheChange(t *testing.T) {
	a := ServicePortName{Namespace: "x", Name: "a", Protocol: TCP}
	b := ServicePortName{Namespace: "x", Name: "b", Protocol: TCP}
	c := ServicePortName{Namespace: "x", Name: "c", Protocol: TCP}
	base := NewSnapshot(map[ServicePortName]*ServicePort{a: {Name: a}, b: {Name: b}})
	base.ID = 7
	next := base.With(map[ServicePortName]*ServicePort{a: {Name: a}, c: {Name: c}}, []ServicePortName{a, b})
	names := map[ServicePortName]int{}
	for _, n := range next.Changed {
		names[n]++
	}
	if next.Base != 7 || next.ID != 0 || len(names) != 3 || names[a] != 1 || names[b] != 1 || names[c] != 1 {
		t.Fatalf("base %d id %d changed %v", next.Base, next.ID, next.Changed)
	}
	if next.Ports.Get(b) != nil || next.Ports.Get(c) == nil || next.Ports.Get(a) == base.Ports.Get(a) || base.Ports.Get(b) == nil {
		t.Fatal("ports wrong, or the base changed")
	}
}

// An endpoint is 24 bytes with no pointer and a service port 144, as
// their docs say: one is held per endpoint or port, and a field added
// between the others, or a string, would grow every one (issue 16's memory
// budget); a pointer would have the collector scan every endpoint list.
func TestModelSizes(t *testing.T) {
	if n := unsafe.Sizeof(Endpoint{}); n != 24 {
		t.Fatalf("lb.Endpoint is %d bytes, want 24", n)
	}
	if hasPointers(reflect.TypeFor[Endpoint]()) {
		t.Fatal("lb.Endpoint holds a pointer")
	}
	if n := unsafe.Sizeof(ServicePort{}); n != 144 {
		t.Fatalf("lb.ServicePort is %d bytes, want 144", n)
	}
	// One per service port (two for split traffic policies): the shared
	// settings keep it in the 112-byte size class.
	if n := unsafe.Sizeof(Picker{}); n > 112 {
		t.Fatalf("lb.Picker is %d bytes, want at most 112", n)
	}
}

// A port's external addresses are held only when it has some: ports built
// alike compare equal whichever way their lists were set, and emptied
// lists leave none; the setters never change what an earlier copy points
// to.
func TestExternalAddrsAreHeldOnlyWhenSet(t *testing.T) {
	eip, lbip := netip.MustParseAddr("203.0.113.1"), netip.MustParseAddr("198.51.100.1")
	ranges := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}
	if NewExternalAddrs(nil, []netip.Addr{}, nil) != nil {
		t.Fatal("empty lists made an ExternalAddrs")
	}
	var a ServicePort
	a.SetExternalIPs([]netip.Addr{eip})
	a.SetLoadBalancerIPs([]netip.Addr{lbip})
	a.SetSourceRanges(ranges)
	b := ServicePort{External: NewExternalAddrs([]netip.Addr{eip}, []netip.Addr{lbip}, ranges)}
	if !reflect.DeepEqual(a, b) || !a.SameFrontend(&b) {
		t.Fatalf("set one by one %+v, made at once %+v", a.External, b.External)
	}
	before := a
	a.SetExternalIPs(nil)
	if len(before.ExternalIPs()) != 1 || len(a.ExternalIPs()) != 0 || a.SameFrontend(&before) {
		t.Fatal("a setter changed what a copy holds, or the change went unseen")
	}
	a.SetLoadBalancerIPs(nil)
	a.SetSourceRanges(nil)
	if a.External != nil || a.ExternalIPs() != nil || a.LoadBalancerIPs() != nil || a.SourceRanges() != nil {
		t.Fatalf("emptied lists left %+v", a.External)
	}
}

// hasPointers reports whether a value of t holds a pointer the garbage
// collector would follow.
func hasPointers(t reflect.Type) bool {
	switch t.Kind() {
	case reflect.Bool, reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Float32, reflect.Float64:
		return false
	case reflect.Array:
		return t.Len() > 0 && hasPointers(t.Elem())
	case reflect.Struct:
		for i := range t.NumField() {
			if hasPointers(t.Field(i).Type) {
				return true
			}
		}
		return false
	}
	return true
}
