// Package kernel owns the kernel rule programmers that sit beside the
// userspace data plane as alternative modes: iptables, IPVS and nftables,
// the userspace VIP capture (portals), conntrack and sysctls. Each renders
// its desired state from an lb.Snapshot as a pure function and applies it
// through a small interface with a stateful fake. None is built yet; each
// arrives with its own issue.
package kernel
