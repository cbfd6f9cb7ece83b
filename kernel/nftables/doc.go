// Package nftables owns nftables mode (Linux only): kube-proxy's nftables
// layout (table kube-proxy in the ip and ip6 families; the cluster-ips and
// nodeport-ips sets; the service-ips, service-nodeports, no-endpoint-* and
// firewall-ips verdict maps; per-service and per-endpoint chains with
// kube-proxy's names), rendered from a snapshot as a pure function into a
// knftables transaction and applied with sigs.k8s.io/knftables,
// kube-proxy's own library, one transaction per sync.
package nftables
