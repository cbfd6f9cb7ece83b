package nftables

import (
	"context"
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/knftables"

	"github.com/sluice-proxy/sluice/kernel/netnstest"
	"github.com/sluice-proxy/sluice/lb"
)

// tableLines is the ip kube-proxy table, canonical (CanonicalDump).
func tableLines() ([]string, error) {
	out, err := exec.Command("nft", "-j", "list", "table", "ip", Table).Output()
	if err != nil {
		return nil, fmt.Errorf("nft list table: %w", err)
	}
	return CanonicalDump(out)
}

// On the real kernel, through nft: a first sync and a restart's full
// sync written in batches make the table one transaction makes, and a
// partial sync goes on from them. The kernel refuses what the fake may
// not (a goto to a chain of another transaction, an element added to a
// map before its chain exists, a chain flushed while bound).
func TestFullSyncBatchesOnRealNFTables(t *testing.T) {
	netnstest.Need(t, "nft")
	netnstest.Run(t, func() error {
		ctx := context.Background()
		nft, err := knftables.New(knftables.IPv4Family, Table)
		if err != nil {
			return err
		}
		// The table one transaction makes of s, from an empty one.
		oneTransaction := func(s *lb.Snapshot) ([]string, error) {
			if err := Cleanup(ctx, nft); err != nil {
				return nil, err
			}
			if err := (&Proxier{NFT: nft, Options: opts(), FullSyncBatch: -1}).Sync(ctx, s); err != nil {
				return nil, fmt.Errorf("one transaction: %w", err)
			}
			return tableLines()
		}
		first, restart := freshPorts(25), movedPorts(24, 10)
		wantFirst, err := oneTransaction(first)
		if err != nil {
			return err
		}
		wantRestart, err := oneTransaction(restart)
		if err != nil {
			return err
		}
		if err := Cleanup(ctx, nft); err != nil {
			return err
		}
		p := &Proxier{NFT: nft, Options: opts(), FullSyncBatch: 4}
		if err := p.Sync(ctx, first); err != nil {
			return fmt.Errorf("first sync in batches: %w", err)
		}
		if got, err := tableLines(); err != nil || !slices.Equal(got, wantFirst) {
			return fmt.Errorf("batched table differs from one transaction's (%v):\n%s\nwant:\n%s", err, strings.Join(got, "\n"), strings.Join(wantFirst, "\n"))
		}
		if st, err := p.SyncStats(ctx, freshPorts(24)); err != nil || st.Full {
			return fmt.Errorf("partial sync after the batched one: %+v %v", st, err)
		}
		restarted := &Proxier{NFT: nft, Options: opts(), FullSyncBatch: 4}
		if err := restarted.Sync(ctx, restart); err != nil {
			return fmt.Errorf("a restart's full sync in batches: %w", err)
		}
		// The chains no service uses any more were flushed; a sync a
		// second later deletes them, in a transaction of its own.
		if !restarted.StaleChains() {
			return fmt.Errorf("the restart's full sync flushed no chain")
		}
		later := time.Now().Add(StaleChainDelay)
		restarted.Now = func() time.Time { return later }
		if st, err := restarted.SyncStats(ctx, restart); err != nil || st.CleanupErr != nil || restarted.StaleChains() {
			return fmt.Errorf("the sync a second later: %v, %v, stale chains left: %v", err, st.CleanupErr, restarted.StaleChains())
		}
		if got, err := tableLines(); err != nil || !slices.Equal(got, wantRestart) {
			return fmt.Errorf("after the restart, the table differs from one transaction's (%v):\n%s\nwant:\n%s", err, strings.Join(got, "\n"), strings.Join(wantRestart, "\n"))
		}
		return Cleanup(ctx, nft)
	})
}
