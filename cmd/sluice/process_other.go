//go:build !linux

package main

import (
	"log/slog"

	"github.com/sluice-proxy/sluice/config"
)

// prepareProcess has nothing to do outside Linux.
func prepareProcess(*config.Config, *slog.Logger) error { return nil }
