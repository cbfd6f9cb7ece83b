//go:build !linux

package main

import (
	"errors"
	"log/slog"
	"time"

	"github.com/sluice-proxy/sluice/lb"
	"github.com/sluice-proxy/sluice/listeners"
)

// nftablesCapture does not exist off Linux.
type nftablesCapture struct{}

func newNFTablesCapture(*localAddrs, *slog.Logger) (*nftablesCapture, error) {
	return nil, errors.New("nftables needs Linux")
}

func (*nftablesCapture) families() string                                      { return "" }
func (*nftablesCapture) watch(time.Duration)                                   {}
func (*nftablesCapture) close()                                                {}
func (*nftablesCapture) before(*lb.Snapshot) error                             { return nil }
func (*nftablesCapture) after(*lb.Snapshot, func() []listeners.Frontend) error { return nil }
func (*nftablesCapture) resync() error                                         { return nil }

func cleanupNFTablesCapture() error { return nil }
