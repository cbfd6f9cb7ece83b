// Package vmtest owns the VM test suite: it boots a stock Debian cloud
// kernel under qemu (TCG) with an initramfs holding busybox, the IPVS,
// SCTP, dummy and veth modules, a static sluice binary and the guest test
// binary (package vmtest/guest, build tag vmguest), runs the guest tests
// there, and passes or fails on the result marker the guest prints. The
// host's kernel has neither IPVS nor SCTP; the VM has both, and its network
// is its own: qemu runs with no NIC, or (BootWith, for the IPVS parity test
// in cmd/sluice) with one on qemu's restricted user network that reaches a
// single forwarded address on the host's loopback and nothing else.
package vmtest
