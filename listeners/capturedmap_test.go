package listeners

import (
	"net/netip"
	"sync"
	"testing"
)

// What a batch writes is seen by get at once and by the data path's load
// only once committed; a delete likewise; a shard emptied is dropped.
func TestCapturedMapCommitsBatches(t *testing.T) {
	var m capturedMap
	a, b := netip.MustParseAddrPort("10.96.0.1:80"), netip.MustParseAddrPort("10.96.0.2:80")
	ta, tb := &Target{}, &Target{}
	m.store(a, ta)
	m.store(b, tb)
	if m.load(a) != nil || m.get(a) != ta {
		t.Fatalf("before commit: load %p, get %p", m.load(a), m.get(a))
	}
	m.commit()
	if m.load(a) != ta || m.load(b) != tb {
		t.Fatal("committed destinations not loaded")
	}
	m.delete(a)
	if m.load(a) != ta || m.get(a) != nil {
		t.Fatal("an uncommitted delete is seen by load, or not by get")
	}
	m.commit()
	if m.load(a) != nil || m.load(b) != tb {
		t.Fatal("after the delete's commit")
	}
	m.delete(b)
	m.commit()
	for i := range m.shards {
		if m.shards[i].Load() != nil {
			t.Fatalf("shard %d kept after its last destination went", i)
		}
	}
}

// 20,000 ClusterIPs of one /16 on one port spread over the shards, none
// with more than twice its share (a write copies one shard).
func TestCapturedMapSpreadsServiceIPs(t *testing.T) {
	var m capturedMap
	count := make([]int, capturedShards)
	for i := range 20000 {
		count[m.shard(netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 96, byte(i / 250), byte(i%250 + 1)}), 80))]++
	}
	for i, n := range count {
		if n > 2*20000/capturedShards {
			t.Fatalf("shard %d holds %d of 20000", i, n)
		}
	}
}

// Readers load while a writer stores, deletes and commits (run with -race):
// a reader sees a destination's Target or nothing, never another's.
func TestCapturedMapReadsWhileWritten(t *testing.T) {
	var m capturedMap
	const n = 512
	dsts := make([]netip.AddrPort, n)
	targets := make([]*Target, n)
	for i := range dsts {
		dsts[i] = netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 96, byte(i / 250), byte(i%250 + 1)}), 443)
		targets[i] = &Target{}
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				for i, d := range dsts {
					if got := m.load(d); got != nil && got != targets[i] {
						t.Errorf("destination %d resolved to another's Target", i)
						return
					}
				}
			}
		}()
	}
	for round := range 50 {
		for i, d := range dsts {
			if (i+round)%3 == 0 {
				m.delete(d)
			} else {
				m.store(d, targets[i])
			}
		}
		m.commit()
	}
	close(stop)
	wg.Wait()
}
