package main

import (
	"net"
	"os"
)

// fileListener turns an inherited descriptor into a listener (the
// descriptor is closed; the listener has its own).
func fileListener(fd int) (net.Listener, error) {
	f := os.NewFile(uintptr(fd), "inherited listener")
	defer f.Close()
	return net.FileListener(f)
}
