//go:build !unix

package handover

import (
	"errors"
	"net/netip"
	"time"
)

func closeFD(int) error { return nil }

// Predecessor: no hand-over off Unix.
type Predecessor struct{}

// Connect finds no predecessor off Unix: a restart there rebinds.
func Connect(string, *Broker, time.Duration) (*Predecessor, error) { return nil, nil }

// Retire does nothing off Unix.
func (p *Predecessor) Retire() error { return nil }

// Offer: no hand-over off Unix.
type Offer struct{}

// Serve is not available off Unix.
func Serve(string, *Broker, func()) (*Offer, error) {
	return nil, errors.New("hand-over needs Unix sockets with descriptor passing")
}

// Close does nothing.
func (o *Offer) Close() {}

// boundAddr is not asked off Unix: every held socket keeps its address.
func boundAddr(int) netip.AddrPort { return netip.AddrPort{} }
