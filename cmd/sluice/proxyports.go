package main

import (
	"fmt"
	"strings"

	"github.com/sluice-proxy/sluice/config"
	"github.com/sluice-proxy/sluice/listeners"
)

// The files the kernel's ephemeral range and its reserved ports are read
// from (they hold the process's network namespace's values).
const (
	procEphemeralRange = "/proc/sys/net/ipv4/ip_local_port_range"
	procReservedPorts  = "/proc/sys/net/ipv4/ip_local_reserved_ports"
)

// ephemeralProxyPorts is the allocator of random proxy ports (no
// --proxy-port-range): listeners.NewEphemeralPortAllocator over the range
// and reserved ports read (with read: os.ReadFile) from procEphemeralRange
// and procReservedPorts, each parsed as --proxy-port-range is. Where they
// cannot be read or parsed (not Linux) it returns the kernel-chooses
// allocator and says why.
func ephemeralProxyPorts(read func(string) ([]byte, error)) (*listeners.PortAllocator, error) {
	kernel := listeners.NewPortAllocator(0, 0)
	data, err := read(procEphemeralRange)
	if err != nil {
		return kernel, err
	}
	f := strings.Fields(string(data))
	if len(f) != 2 {
		return kernel, fmt.Errorf("%s: %q is not a port range", procEphemeralRange, strings.TrimSpace(string(data)))
	}
	rng, err := config.ParsePortRange(f[0] + "-" + f[1])
	if err != nil || rng.Base == 0 {
		return kernel, fmt.Errorf("%s: %q is not a port range: %v", procEphemeralRange, strings.TrimSpace(string(data)), err)
	}
	if data, err = read(procReservedPorts); err != nil {
		return kernel, err
	}
	var reserved []config.PortRange
	for _, item := range strings.Split(strings.TrimSpace(string(data)), ",") {
		if item == "" {
			continue
		}
		r, err := config.ParsePortRange(item)
		if err != nil || r.Base == 0 {
			return kernel, fmt.Errorf("%s: %q is not a port or range: %v", procReservedPorts, item, err)
		}
		reserved = append(reserved, r)
	}
	return listeners.NewEphemeralPortAllocator(rng.Base, rng.Base+rng.Size-1, func(p int) bool {
		for _, r := range reserved {
			if p >= r.Base && p < r.Base+r.Size {
				return true
			}
		}
		return false
	}), nil
}
