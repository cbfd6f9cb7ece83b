package lb

import (
	"cmp"
	"hash/maphash"
	"iter"
	"slices"
)

// portShards is how many shards a PortMap splits its entries into: an
// update copies only the shards its names fall in (at 10k service ports,
// some 40 entries each), not the whole map.
const portShards = 256

// PortMap is an immutable map from service port names to service ports
// whose updates share what they do not change (issue 16: a whole new map
// per API event cost milliseconds at 10k Services). The zero value is an
// empty map. A PortMap is never modified once made; With returns a new
// one.
//
// A shard is a list of (hash of the name, port) sorted by hash, searched
// by halves, the name read from the port itself: 16 bytes an entry, where
// a Go map keyed by the 64-byte name took some 120 per port at 10k
// (issue 16's memory budget). Entries are in a fixed order, so two
// PortMaps with the same entries are reflect.DeepEqual however they were
// made, and All yields them in the same order each time.
type PortMap struct {
	shards *[portShards][]portEntry
	n      int
}

// portEntry is one port of a shard and its name's hash.
type portEntry struct {
	h  uint64
	sp *ServicePort
}

// portSeed hashes names; fixed for the process so that maps made apart
// agree.
var portSeed = maphash.MakeSeed()

func hashOf(name ServicePortName) uint64 { return maphash.Comparable(portSeed, name) }

// find returns where name is in shard (ok) or would go (!ok): entries are
// ordered by hash, then by name where hashes are equal.
func find(shard []portEntry, h uint64, name ServicePortName) (int, bool) {
	return slices.BinarySearchFunc(shard, portEntry{h: h}, func(e, _ portEntry) int {
		if c := cmp.Compare(e.h, h); c != 0 {
			return c
		}
		return e.sp.Name.Compare(name)
	})
}

// NewPortMap returns a PortMap holding m's entries (m is not kept); each
// port must be under its own name.
func NewPortMap(m map[ServicePortName]*ServicePort) PortMap {
	return PortMap{}.With(m, nil)
}

// Get returns the port named name, or nil.
func (m PortMap) Get(name ServicePortName) *ServicePort {
	if m.shards == nil {
		return nil
	}
	h := hashOf(name)
	shard := m.shards[h%portShards]
	if i, ok := find(shard, h, name); ok {
		return shard[i].sp
	}
	return nil
}

// Len is the number of entries.
func (m PortMap) Len() int { return m.n }

// All yields every entry, in an order fixed by the names.
func (m PortMap) All() iter.Seq2[ServicePortName, *ServicePort] {
	return func(yield func(ServicePortName, *ServicePort) bool) {
		if m.shards == nil {
			return
		}
		for _, sh := range m.shards {
			for _, e := range sh {
				if !yield(e.sp.Name, e.sp) {
					return
				}
			}
		}
	}
}

// With returns m with the entries of set added or replaced and the names
// in del removed (a name in both is set). Each port in set must be under
// its own name (it panics otherwise: the name is read from the port). m
// itself is unchanged: only the shards the names fall in are copied, each
// once, with room for the ports it gains (a shard that also loses some
// keeps their room).
func (m PortMap) With(set map[ServicePortName]*ServicePort, del []ServicePortName) PortMap {
	if len(set) == 0 && len(del) == 0 {
		return m
	}
	var shards [portShards][]portEntry
	if m.shards != nil {
		shards = *m.shards
	}
	// Each touched shard's changes, made in one copy of it.
	type change struct {
		h    uint64
		name ServicePortName
		sp   *ServicePort // nil: delete
	}
	touched := map[uint64][]change{}
	for _, name := range del {
		if _, kept := set[name]; !kept {
			h := hashOf(name)
			touched[h%portShards] = append(touched[h%portShards], change{h: h, name: name})
		}
	}
	for name, sp := range set {
		if sp == nil || sp.Name != name {
			panic("lb: PortMap.With: a port set under a name not its own: " + name.String())
		}
		h := hashOf(name)
		touched[h%portShards] = append(touched[h%portShards], change{h: h, name: name, sp: sp})
	}
	n := m.n
	for i, changes := range touched {
		old := shards[i]
		grow := 0
		for _, c := range changes {
			if _, ok := find(old, c.h, c.name); !ok && c.sp != nil {
				grow++
			}
		}
		next := make([]portEntry, len(old), len(old)+grow)
		copy(next, old)
		for _, c := range changes {
			j, ok := find(next, c.h, c.name)
			switch {
			case c.sp == nil: // a delete
				if ok {
					next = slices.Delete(next, j, j+1)
					n--
				}
			case ok:
				next[j].sp = c.sp
			default:
				next = slices.Insert(next, j, portEntry{h: c.h, sp: c.sp})
				n++
			}
		}
		if len(next) == 0 {
			next = nil // as a shard never written: equal maps stay DeepEqual
		}
		shards[i] = next
	}
	return PortMap{shards: &shards, n: n}
}
