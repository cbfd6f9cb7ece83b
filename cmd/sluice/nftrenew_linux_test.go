package main

import (
	"context"
	"errors"
	"strconv"
	"testing"

	"sigs.k8s.io/knftables"
)

// A transaction of at least largeNFTTransaction operations leaves the
// Interface that ran it behind (with the buffer knftables keeps at its
// largest); a smaller one does not; what the new Interface serves is the
// same table.
func TestRenewingNFTIsMadeAnewAfterALargeTransaction(t *testing.T) {
	var made []*knftables.Fake
	table := knftables.NewFake(knftables.IPv4Family, "t")
	var refuse error
	newNFT := func() (knftables.Interface, error) {
		if refuse != nil {
			return nil, refuse
		}
		made = append(made, table)
		return table, nil
	}
	nft, err := newRenewingNFT(newNFT)
	if err != nil {
		t.Fatal(err)
	}
	run := func(ops int) {
		t.Helper()
		tx := nft.NewTransaction()
		tx.Add(&knftables.Table{})
		tx.Add(&knftables.Map{Name: "m", Type: "ipv4_addr : inet_service"})
		for i := 2; i < ops; i++ {
			tx.Add(&knftables.Element{Map: "m", Key: []string{"10.0." + strconv.Itoa(i/256) + "." + strconv.Itoa(i%256)}, Value: []string{"80"}})
		}
		if err := nft.Run(context.Background(), tx); err != nil {
			t.Fatal(err)
		}
	}
	run(10)
	if len(made) != 1 || nft.renewed.Load() != 0 {
		t.Fatalf("after a small transaction: made %d, renewed %d", len(made), nft.renewed.Load())
	}
	run(largeNFTTransaction)
	if len(made) != 2 || nft.renewed.Load() != 1 {
		t.Fatalf("after a large transaction: made %d, renewed %d", len(made), nft.renewed.Load())
	}
	els, err := nft.ListElements(context.Background(), "map", "m")
	if err != nil || len(els) != largeNFTTransaction-2 {
		t.Fatalf("the renewed Interface lists %d elements (%v), want %d", len(els), err, largeNFTTransaction-2)
	}
	// One that cannot be made leaves the last one serving.
	refuse = errors.New("nft is gone")
	run(largeNFTTransaction)
	if nft.renewed.Load() != 1 || nft.get() == nil {
		t.Fatalf("a failed renewal: renewed %d", nft.renewed.Load())
	}
	run(10)
}
