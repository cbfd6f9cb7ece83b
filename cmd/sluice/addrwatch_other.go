//go:build !linux

package main

import (
	"errors"
	"runtime"
)

// netlinkAddrWatch exists on Linux only; elsewhere the local addresses
// are listed before every apply.
type netlinkAddrWatch struct{}

func newAddrWatch() (*netlinkAddrWatch, error) {
	return nil, errors.New("address watch: no rtnetlink on " + runtime.GOOS)
}

func (*netlinkAddrWatch) Changed() bool { return true }
func (*netlinkAddrWatch) Close() error  { return nil }
