//go:build !linux

package main

import (
	"log/slog"

	"github.com/sluice-proxy/sluice/config"
)

// applyConntrack: no conntrack off Linux.
func applyConntrack(*config.Config, *slog.Logger) {}
