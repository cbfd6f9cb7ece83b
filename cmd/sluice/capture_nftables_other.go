//go:build !linux

package main

import (
	"errors"
	"log/slog"
)

func newNFTablesCapture(*localAddrs, *slog.Logger) (*portalCapture, error) {
	return nil, errors.New("nftables needs Linux")
}

func cleanupNFTablesCapture() error { return nil }
