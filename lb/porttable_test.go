package lb

import (
	"fmt"
	stdmaps "maps"
	"math/rand/v2"
	"testing"
)

// A PortTable after any sequence of sets and deletes holds what a plain
// map holds, with names hashed as they are and with every name's hash
// one of three, so that most names share theirs with others.
func TestPortTableMatchesAPlainMap(t *testing.T) {
	for _, collide := range []bool{false, true} {
		t.Run(fmt.Sprintf("collide=%v", collide), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(3, 4))
			name := func(i int) ServicePortName {
				return ServicePortName{Namespace: "ns", Name: fmt.Sprintf("s%d", i), Port: "p", Protocol: TCP}
			}
			tab := PortTable[*ServicePort]{NameOf: func(sp *ServicePort) ServicePortName { return sp.Name }}
			if collide {
				tab.hash = func(n ServicePortName) uint64 { return uint64(len(n.Name) % 3) }
			}
			ref := map[ServicePortName]*ServicePort{}
			for step := range 3000 {
				n := name(rng.IntN(200))
				if rng.IntN(3) == 0 {
					tab.Delete(n)
					delete(ref, n)
				} else {
					sp := &ServicePort{Name: n, Port: uint16(step + 1)}
					tab.Set(n, sp)
					ref[n] = sp
				}
				if tab.Len() != len(ref) {
					t.Fatalf("step %d: Len %d, want %d", step, tab.Len(), len(ref))
				}
				for i := range 200 {
					got, ok := tab.Get(name(i))
					if want, wok := ref[name(i)]; got != want || ok != wok {
						t.Fatalf("step %d: Get(%s) = %v, %v; want %v, %v", step, name(i), got, ok, want, wok)
					}
				}
			}
			got := stdmaps.Collect(tab.All())
			if !stdmaps.Equal(got, ref) {
				t.Fatalf("All yields %d entries, want %d", len(got), len(ref))
			}
			if collide && len(tab.more) == 0 {
				t.Fatal("no name was kept by its name: the collisions were not exercised")
			}
			for name := range tab.All() { // deleting while ranging, as over a map
				tab.Delete(name)
			}
			if tab.Len() != 0 {
				t.Fatalf("%d entries left after deleting each", tab.Len())
			}
		})
	}
}

func TestPortTableRefusesAValueUnderAnotherName(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("no panic")
		}
	}()
	tab := PortTable[*ServicePort]{NameOf: func(sp *ServicePort) ServicePortName { return sp.Name }}
	tab.Set(ServicePortName{Name: "a"}, &ServicePort{Name: ServicePortName{Name: "b"}})
}
