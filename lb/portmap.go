package lb

import (
	"hash/maphash"
	"iter"
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
type PortMap struct {
	shards *[portShards]map[ServicePortName]*ServicePort
	n      int
}

// portSeed hashes names to shards; fixed for the process so that maps
// made apart agree (reflect.DeepEqual compares shard by shard).
var portSeed = maphash.MakeSeed()

func shardOf(name ServicePortName) int {
	var h maphash.Hash
	h.SetSeed(portSeed)
	h.WriteString(name.Namespace)
	h.WriteByte(0)
	h.WriteString(name.Name)
	h.WriteByte(0)
	h.WriteString(name.Port)
	h.WriteByte(0)
	h.WriteString(string(name.Protocol))
	return int(h.Sum64() % portShards)
}

// NewPortMap returns a PortMap holding m's entries (m is not kept).
func NewPortMap(m map[ServicePortName]*ServicePort) PortMap {
	return PortMap{}.With(m, nil)
}

// Get returns the port named name, or nil.
func (m PortMap) Get(name ServicePortName) *ServicePort {
	if m.shards == nil {
		return nil
	}
	return m.shards[shardOf(name)][name]
}

// Len is the number of entries.
func (m PortMap) Len() int { return m.n }

// All yields every entry, in no particular order.
func (m PortMap) All() iter.Seq2[ServicePortName, *ServicePort] {
	return func(yield func(ServicePortName, *ServicePort) bool) {
		if m.shards == nil {
			return
		}
		for _, sh := range m.shards {
			for k, v := range sh {
				if !yield(k, v) {
					return
				}
			}
		}
	}
}

// With returns m with the entries of set added or replaced and the names
// in del removed (a name in both is set). m itself is unchanged: only the
// shards the names fall in are copied.
func (m PortMap) With(set map[ServicePortName]*ServicePort, del []ServicePortName) PortMap {
	if len(set) == 0 && len(del) == 0 {
		return m
	}
	var shards [portShards]map[ServicePortName]*ServicePort
	if m.shards != nil {
		shards = *m.shards
	}
	var copied [portShards]bool
	own := func(i int) map[ServicePortName]*ServicePort {
		if !copied[i] {
			copied[i] = true
			next := make(map[ServicePortName]*ServicePort, len(shards[i])+1)
			for k, v := range shards[i] {
				next[k] = v
			}
			shards[i] = next
		}
		if shards[i] == nil { // emptied by a delete above
			shards[i] = map[ServicePortName]*ServicePort{}
		}
		return shards[i]
	}
	n := m.n
	for _, name := range del {
		if _, kept := set[name]; kept {
			continue
		}
		i := shardOf(name)
		if _, ok := shards[i][name]; ok {
			delete(own(i), name)
			n--
			if len(shards[i]) == 0 {
				shards[i] = nil // as a shard never written: equal maps stay DeepEqual
			}
		}
	}
	for name, sp := range set {
		i := shardOf(name)
		if _, ok := shards[i][name]; !ok {
			n++
		}
		own(i)[name] = sp
	}
	return PortMap{shards: &shards, n: n}
}
