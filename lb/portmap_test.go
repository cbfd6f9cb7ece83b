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
