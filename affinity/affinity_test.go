package affinity

import (
	"net/netip"
	"testing"
	"time"
)

var (
	client1 = netip.MustParseAddr("10.0.0.1")
	client2 = netip.MustParseAddr("10.0.0.2")
	ep1     = netip.MustParseAddrPort("10.180.0.1:80")
	ep2     = netip.MustParseAddrPort("10.180.0.2:80")
)

func TestPinExpiresAfterTTLOfDisuse(t *testing.T) {
	clk := NewManualClock(time.Unix(1000, 0))
	tab := NewTable(10*time.Second, clk)
	tab.Pin(client1, ep1)
	clk.Step(9 * time.Second)
	if got, ok := tab.Lookup(client1); !ok || got != ep1 {
		t.Fatalf("lookup before ttl = %v %v, want %v", got, ok, ep1)
	}
	// The lookup refreshed last use, so 9s more is still inside the TTL.
	clk.Step(9 * time.Second)
	if _, ok := tab.Lookup(client1); !ok {
		t.Fatal("pin expired although it was used 9s ago")
	}
	clk.Step(10 * time.Second)
	if _, ok := tab.Lookup(client1); ok {
		t.Fatal("pin survived a full TTL of disuse")
	}
	if tab.Len() != 0 {
		t.Fatalf("expired pin was not removed, len=%d", tab.Len())
	}
}

func TestRetainDropsOnlyPinsToRemovedEndpoints(t *testing.T) {
	tab := NewTable(time.Hour, NewManualClock(time.Time{}))
	tab.Pin(client1, ep1)
	tab.Pin(client2, ep2)
	tab.Retain(func(ep netip.AddrPort) bool { return ep == ep2 })
	if _, ok := tab.Lookup(client1); ok {
		t.Error("pin to removed endpoint survived")
	}
	if got, ok := tab.Lookup(client2); !ok || got != ep2 {
		t.Error("pin to surviving endpoint was dropped")
	}
}

func TestUnpinOnlyMatchingEndpoint(t *testing.T) {
	tab := NewTable(time.Hour, NewManualClock(time.Time{}))
	tab.Pin(client1, ep1)
	tab.Unpin(client1, ep2)
	if _, ok := tab.Lookup(client1); !ok {
		t.Fatal("Unpin of another endpoint removed the pin")
	}
	tab.Unpin(client1, ep1)
	if _, ok := tab.Lookup(client1); ok {
		t.Fatal("Unpin did not remove the pin")
	}
}

func TestExpireSweepsAndSetTTLApplies(t *testing.T) {
	clk := NewManualClock(time.Unix(0, 0))
	tab := NewTable(time.Hour, clk)
	tab.Pin(client1, ep1)
	clk.Step(time.Minute)
	tab.Pin(client2, ep2)
	tab.SetTTL(time.Minute)
	if n := tab.Expire(); n != 1 {
		t.Fatalf("Expire removed %d pins, want 1", n)
	}
	if _, ok := tab.Lookup(client2); !ok {
		t.Fatal("fresh pin expired")
	}
}

// PerEndpoint counts live pins only: one unused for a TTL is not counted
// even before Expire removes it.
func TestPerEndpointCountsLivePins(t *testing.T) {
	clk := NewManualClock(time.Unix(1000, 0))
	tab := NewTable(10*time.Second, clk)
	tab.Pin(client1, ep1)
	clk.Step(6 * time.Second)
	tab.Pin(client2, ep1)
	tab.Pin(netip.MustParseAddr("10.0.0.3"), ep2)
	if got := tab.PerEndpoint(); got[ep1] != 2 || got[ep2] != 1 || len(got) != 2 {
		t.Fatalf("pins %v", got)
	}
	clk.Step(5 * time.Second) // client1's pin is 11s old
	if got := tab.PerEndpoint(); got[ep1] != 1 || got[ep2] != 1 {
		t.Fatalf("pins after client1's TTL %v", got)
	}
	if tab.Len() != 3 {
		t.Fatalf("PerEndpoint removed pins: len %d", tab.Len())
	}
}
