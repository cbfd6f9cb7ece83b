//go:build !linux

package main

import (
	"errors"
	"log/slog"
	"net/netip"

	"github.com/sluice-proxy/sluice/admin"
	"github.com/sluice-proxy/sluice/config"
)

var errNFTablesUnavailable = errors.New("nftables is Linux only")

// nftablesPlane does not exist off Linux.
type nftablesPlane struct{ dataPlane }

func (*nftablesPlane) Close() {}

func (*nftablesPlane) SetServiceCIDRs([]netip.Prefix) {}

func newNFTablesPlane(*config.Config, *localAddrs, *admin.Metrics, *slog.Logger) (*nftablesPlane, error) {
	return nil, errNFTablesUnavailable
}

func cleanupNFTables(*slog.Logger) error { return nil }

func nftablesLeftover() []string { return nil }
