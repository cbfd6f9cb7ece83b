package lb

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"testing"
)

// A PortMap after any sequence of With calls holds what a plain map after
// the same sets and deletes holds; every earlier PortMap still holds what
// it held (nothing is shared mutably); and two PortMaps with the same
// entries are DeepEqual however they were made.
func TestPortMapMatchesAPlainMap(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	name := func(i int) ServicePortName {
		return ServicePortName{Namespace: "ns", Name: fmt.Sprintf("s%d", i), Port: "p", Protocol: TCP}
	}
	ports := make([]*ServicePort, 600)
	for i := range ports {
		ports[i] = &ServicePort{Name: name(i % 300), Port: uint16(i + 1)}
	}
	var m PortMap
	ref := map[ServicePortName]*ServicePort{}
	type kept struct {
		m   PortMap
		ref map[ServicePortName]*ServicePort
	}
	var history []kept
	for step := 0; step < 300; step++ {
		set := map[ServicePortName]*ServicePort{}
		var del []ServicePortName
		for k := rng.IntN(20); k > 0; k-- {
			if rng.IntN(3) == 0 {
				del = append(del, name(rng.IntN(300)))
			} else {
				sp := ports[rng.IntN(len(ports))]
				set[sp.Name] = sp
			}
		}
		m = m.With(set, del)
		for _, n := range del {
			if _, ok := set[n]; !ok {
				delete(ref, n)
			}
		}
		for n, sp := range set {
			ref[n] = sp
		}
		got := map[ServicePortName]*ServicePort{}
		for n, sp := range m.All() {
			got[n] = sp
		}
		if !reflect.DeepEqual(got, ref) || m.Len() != len(ref) {
			t.Fatalf("step %d: %d entries (Len %d), want %d", step, len(got), m.Len(), len(ref))
		}
		for n, sp := range ref {
			if m.Get(n) != sp {
				t.Fatalf("step %d: Get(%v) wrong", step, n)
			}
		}
		if fresh := NewPortMap(ref); !reflect.DeepEqual(fresh, m) {
			t.Fatalf("step %d: a PortMap made afresh with the same entries is not DeepEqual", step)
		}
		history = append(history, kept{m, maps(ref)})
	}
	for i, h := range history {
		got := map[ServicePortName]*ServicePort{}
		for n, sp := range h.m.All() {
			got[n] = sp
		}
		if !reflect.DeepEqual(got, h.ref) {
			t.Fatalf("the PortMap of step %d changed after it was made", i)
		}
	}
	if (PortMap{}).Get(name(1)) != nil || (PortMap{}).Len() != 0 {
		t.Fatal("the zero PortMap is not empty")
	}
}

func maps(m map[ServicePortName]*ServicePort) map[ServicePortName]*ServicePort {
	out := make(map[ServicePortName]*ServicePort, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// DeltaSince says a snapshot's changes only relative to its base.
func TestDeltaSince(t *testing.T) {
	s := &Snapshot{ID: 7, Base: 6, Changed: []ServicePortName{{Name: "a"}}}
	if names, ok := s.DeltaSince(6); !ok || len(names) != 1 {
		t.Fatal("the base's changes not given")
	}
	for _, id := range []uint64{0, 5, 7} {
		if _, ok := s.DeltaSince(id); ok {
			t.Fatalf("a delta since %d", id)
		}
	}
	if _, ok := (&Snapshot{ID: 1}).DeltaSince(0); ok {
		t.Fatal("a snapshot without a base gave a delta")
	}
}

// Names whose hashes are equal are told apart by the names themselves,
// in name order, whatever order they came in.
func TestPortMapFindOrdersEqualHashesByName(t *testing.T) {
	a, b, c := ServicePortName{Namespace: "ns", Name: "a"}, ServicePortName{Namespace: "ns", Name: "b"}, ServicePortName{Namespace: "ns", Name: "c"}
	shard := []portEntry{{h: 3, sp: &ServicePort{Name: c}}, {h: 5, sp: &ServicePort{Name: a}}, {h: 5, sp: &ServicePort{Name: c}}, {h: 9, sp: &ServicePort{Name: b}}}
	for _, tc := range []struct {
		h    uint64
		name ServicePortName
		at   int
		ok   bool
	}{{5, a, 1, true}, {5, c, 2, true}, {5, b, 2, false}, {3, c, 0, true}, {3, a, 0, false}, {9, b, 3, true}, {9, a, 3, false}, {10, a, 4, false}} {
		if at, ok := find(shard, tc.h, tc.name); at != tc.at || ok != tc.ok {
			t.Errorf("find(%d, %s) = %d, %v; want %d, %v", tc.h, tc.name, at, ok, tc.at, tc.ok)
		}
	}
}

// A port set under another name than its own is refused: the map reads
// names from the ports.
func TestPortMapRefusesAPortUnderAnotherName(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("no panic")
		}
	}()
	NewPortMap(map[ServicePortName]*ServicePort{{Name: "a"}: {Name: ServicePortName{Name: "b"}}})
}
