//go:build !linux

package listeners

import "net/netip"

// On other systems a wildcard UDP listener replies from the address the
// routing table picks; bind a specific address to control it.
func enablePktinfo(uintptr, bool) error { return nil }
func pktinfoDst([]byte) netip.Addr      { return netip.Addr{} }
func pktinfoSrc(netip.Addr) []byte      { return nil }

const oobSize = 0

func disableGRO(uintptr) {}
