//go:build !windows

package main

import (
	"context"
	"errors"
)

// serveAsWindowsService is Windows only; elsewhere --windows-service is
// accepted and ignored, as kube-proxy does (and reported with the flags
// the mode does not use).
func serveAsWindowsService(context.Context, func(context.Context) int) (int, error) {
	return 1, errors.New("--windows-service works only on Windows")
}
