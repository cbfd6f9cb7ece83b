package main

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/netip"
	"slices"
	"testing"

	"github.com/sluice-proxy/sluice/admin"
	"github.com/sluice-proxy/sluice/config"
	"github.com/sluice-proxy/sluice/kernel/nftables"
	"github.com/sluice-proxy/sluice/lb"
	"sigs.k8s.io/knftables"
)

// refusingNFT is knftables' fake whose transactions fail, as nft does when
// the kernel refuses one; it counts them.
type refusingNFT struct {
	*knftables.Fake
	runs int
}

func (n *refusingNFT) Run(ctx context.Context, tx *knftables.Transaction) error {
	n.runs++
	return errors.New("nft: Error: Could not process rule: No such file or directory")
}

// The nftables plane names the family whose sync failed (familyError),
// so that /healthz holds that family alone pending, and still syncs the
// other.
func TestNFTablesPlaneNamesTheFamilyThatFailed(t *testing.T) {
	cfg := config.Defaults()
	v4 := knftables.NewFake(knftables.IPv4Family, nftables.Table)
	v6 := &refusingNFT{Fake: knftables.NewFake(knftables.IPv6Family, nftables.Table)}
	p := &nftablesPlane{cfg: cfg, local: &localAddrs{set: map[netip.Addr]bool{}}, metrics: admin.NewMetrics(),
		log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		proxiers: []*nftables.Proxier{{NFT: v4, Options: nftablesOptions(cfg, false, nodeFacts{})},
			{NFT: v6, Options: nftablesOptions(cfg, true, nodeFacts{})}}}
	err := p.Apply(lb.NewSnapshot(nil))
	if got := failedFamilies(err); !slices.Equal(got, []string{"IPv6"}) || v6.runs == 0 {
		t.Fatalf("failed families %v (err %v), IPv6 transactions %d", got, err, v6.runs)
	}
	if v4.Table == nil {
		t.Fatalf("IPv4's table was not written while IPv6 failed")
	}
}
