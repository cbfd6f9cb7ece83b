// Package sluice is a drop-in replacement for kube-proxy whose centrepiece
// is a userspace L4 load balancer. The packages below hold the pieces; see
// README.md and DESIGN.md. This root package holds only repository-wide
// tests, such as the import rules.
package sluice
