package main

import (
	"context"
	"sync/atomic"

	"sigs.k8s.io/knftables"
)

// renewingNFT is a knftables.Interface made anew after a large
// transaction. knftables writes every transaction into one buffer, nft's
// stdin, and keeps that buffer at its largest for as long as the
// Interface lives: after the userspace capture's first sync of 20,000
// portals it held 2-4 MB, and nftables mode's first full sync at 10,000
// Services far more, for the life of the process (issue 16). Making the
// Interface again costs what knftables.New costs (two runs of nft), paid
// only after a transaction of at least large operations.
type renewingNFT struct {
	cur   atomic.Pointer[knftables.Interface]
	renew func() (knftables.Interface, error)
	large int
	// renewed counts the Interfaces made after large transactions, for
	// tests.
	renewed atomic.Int64
}

// largeNFTTransaction is how many operations make a transaction large
// enough to renew the Interface after it: the buffer it leaves is some
// 100 B per operation.
const largeNFTTransaction = 1000

// newRenewingNFT makes the first Interface with newNFT, and the later ones
// with it too.
func newRenewingNFT(newNFT func() (knftables.Interface, error)) (*renewingNFT, error) {
	nft, err := newNFT()
	if err != nil {
		return nil, err
	}
	r := &renewingNFT{renew: newNFT, large: largeNFTTransaction}
	r.cur.Store(&nft)
	return r, nil
}

func (r *renewingNFT) get() knftables.Interface { return *r.cur.Load() }

func (r *renewingNFT) NewTransaction() *knftables.Transaction { return r.get().NewTransaction() }

// Run runs tx, then, when tx was large, replaces the Interface that ran
// it (and the buffer it keeps); if a new one cannot be made, the old one
// stays.
func (r *renewingNFT) Run(ctx context.Context, tx *knftables.Transaction) error {
	err := r.get().Run(ctx, tx)
	r.after(tx)
	return err
}

func (r *renewingNFT) Check(ctx context.Context, tx *knftables.Transaction) error {
	err := r.get().Check(ctx, tx)
	r.after(tx)
	return err
}

func (r *renewingNFT) after(tx *knftables.Transaction) {
	if tx.NumOperations() < r.large {
		return
	}
	if nft, err := r.renew(); err == nil {
		r.cur.Store(&nft)
		r.renewed.Add(1)
	}
}

func (r *renewingNFT) ListAll(ctx context.Context) (map[string][]string, error) {
	return r.get().ListAll(ctx)
}

func (r *renewingNFT) List(ctx context.Context, objectType string) ([]string, error) {
	return r.get().List(ctx, objectType)
}

func (r *renewingNFT) ListRules(ctx context.Context, chain string) ([]*knftables.Rule, error) {
	return r.get().ListRules(ctx, chain)
}

func (r *renewingNFT) ListElements(ctx context.Context, objectType, name string) ([]*knftables.Element, error) {
	return r.get().ListElements(ctx, objectType, name)
}

func (r *renewingNFT) ListCounters(ctx context.Context) ([]*knftables.Counter, error) {
	return r.get().ListCounters(ctx)
}

var _ knftables.Interface = (*renewingNFT)(nil)
