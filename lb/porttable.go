package lb

import "iter"

// PortTable is a mutable map from service port names to values that know
// their own names (NameOf). It is keyed by a 64-bit hash of the name,
// the name read back from the value, so an entry is 16 bytes where a Go
// map keyed by the 64-byte name took some 120 per port at 10k (issue 16's
// memory budget); a name whose hash another name already has is kept in
// a second map by its name, so no two names are ever confused. The zero
// value is not usable: set NameOf. Not safe for concurrent use.
type PortTable[V any] struct {
	NameOf func(V) ServicePortName
	// hash is hashOf but in tests, which make names collide.
	hash func(ServicePortName) uint64

	byHash map[uint64]V
	more   map[ServicePortName]V // names whose hash another name holds in byHash
}

// Get returns the value under name, and whether there is one.
func (t *PortTable[V]) Get(name ServicePortName) (V, bool) {
	if v, ok := t.byHash[t.hashOf(name)]; ok && t.NameOf(v) == name {
		return v, true
	}
	v, ok := t.more[name]
	return v, ok
}

// Set puts v under name, which must be v's own (it panics otherwise).
func (t *PortTable[V]) Set(name ServicePortName, v V) {
	if t.NameOf(v) != name {
		panic("lb: PortTable.Set: a value under a name not its own: " + name.String())
	}
	if t.byHash == nil {
		t.byHash = map[uint64]V{}
	}
	h := t.hashOf(name)
	old, ok := t.byHash[h]
	switch {
	case !ok:
		delete(t.more, name) // it may be there from when another name held h
		t.byHash[h] = v
	case t.NameOf(old) == name:
		t.byHash[h] = v
	default:
		if t.more == nil {
			t.more = map[ServicePortName]V{}
		}
		t.more[name] = v
	}
}

// Delete takes name out; nothing happens when it is not there.
func (t *PortTable[V]) Delete(name ServicePortName) {
	h := t.hashOf(name)
	if v, ok := t.byHash[h]; ok && t.NameOf(v) == name {
		delete(t.byHash, h)
		return
	}
	delete(t.more, name)
}

// Len is the number of entries.
func (t *PortTable[V]) Len() int { return len(t.byHash) + len(t.more) }

// All yields every entry, in no particular order. Entries may be deleted
// meanwhile, as in a range over a map.
func (t *PortTable[V]) All() iter.Seq2[ServicePortName, V] {
	return func(yield func(ServicePortName, V) bool) {
		for _, v := range t.byHash {
			if !yield(t.NameOf(v), v) {
				return
			}
		}
		for name, v := range t.more {
			if !yield(name, v) {
				return
			}
		}
	}
}

// Values yields every value, in no particular order.
func (t *PortTable[V]) Values() iter.Seq[V] {
	return func(yield func(V) bool) {
		for _, v := range t.All() {
			if !yield(v) {
				return
			}
		}
	}
}

func (t *PortTable[V]) hashOf(name ServicePortName) uint64 {
	if t.hash != nil {
		return t.hash(name)
	}
	return hashOf(name)
}
