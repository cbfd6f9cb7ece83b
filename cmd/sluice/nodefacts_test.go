package main

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/sluice-proxy/sluice/config"
	"github.com/sluice-proxy/sluice/controlplane"
	"github.com/sluice-proxy/sluice/kernel/localtraffic"
)

// instant is a nodeWait whose every wait ends at once: the tests count
// looks, not seconds.
func instant() nodeWait {
	return nodeWait{every: time.Second, ips: 30 * time.Second, podCIDRs: 5 * time.Minute, after: func(time.Duration) <-chan time.Time {
		c := make(chan time.Time, 1)
		c <- time.Time{}
		return c
	}}
}

func nodeWith(podCIDRs []string, addrs ...corev1.NodeAddress) *corev1.Node {
	n := &corev1.Node{}
	n.Spec.PodCIDRs = podCIDRs
	n.Status.Addresses = addrs
	return n
}

// The Node is waited for as kube-proxy's NodeManager waits: its addresses
// for 30 looks (then on without them), its pod CIDRs in NodeCIDR mode for
// 300 more (then an error naming the node and what is missing).
func TestNodeFactsAreWaitedForAsKubeProxyWaits(t *testing.T) {
	notFound := apierrors.NewNotFound(schema.GroupResource{Resource: "nodes"}, "node-a")
	internal := corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: "192.168.1.5"}
	for _, tc := range []struct {
		name         string
		nodes        []*corev1.Node // one per look; nil: not found yet; the last repeats
		needPodCIDRs bool
		looks        int
		err          string
		ips          []netip.Addr
		podCIDRs     []string
	}{
		{name: "there at once", nodes: []*corev1.Node{nodeWith([]string{"10.244.1.0/24"}, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: "192.168.1.5"})},
			looks: 1, ips: []netip.Addr{netip.MustParseAddr("192.168.1.5")}, podCIDRs: []string{"10.244.1.0/24"}},
		{name: "late", nodes: []*corev1.Node{nil, nil, nodeWith(nil, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: "192.168.1.5"})},
			looks: 3, ips: []netip.Addr{netip.MustParseAddr("192.168.1.5")}},
		{name: "never, addresses only", nodes: []*corev1.Node{nil}, looks: 31},
		{name: "never, NodeCIDR", nodes: []*corev1.Node{nil}, needPodCIDRs: true, looks: 331, err: `timeout waiting for node "node-a" to exist`},
		{name: "no pod CIDRs", nodes: []*corev1.Node{nodeWith(nil, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: "192.168.1.5"})},
			needPodCIDRs: true, looks: 331, err: `timeout waiting for PodCIDR allocation on node "node-a"`, ips: []netip.Addr{netip.MustParseAddr("192.168.1.5")}},
		{name: "pod CIDRs later", nodes: []*corev1.Node{nodeWith(nil, internal), nodeWith([]string{"10.244.1.0/24", "fd00:1::/64"}, internal)},
			needPodCIDRs: true, looks: 2, ips: []netip.Addr{netip.MustParseAddr("192.168.1.5")}, podCIDRs: []string{"10.244.1.0/24", "fd00:1::/64"}},
		// As kube-proxy: the addresses are waited for first, pod CIDRs or not.
		{name: "pod CIDRs and no addresses", nodes: []*corev1.Node{nodeWith([]string{"10.244.1.0/24"})},
			needPodCIDRs: true, looks: 31, podCIDRs: []string{"10.244.1.0/24"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			looks := 0
			get := func(context.Context) (*corev1.Node, error) {
				n := tc.nodes[min(looks, len(tc.nodes)-1)]
				looks++
				if n == nil {
					return nil, notFound
				}
				return n, nil
			}
			facts, err := instant().learn(context.Background(), "node-a", get, tc.needPodCIDRs)
			if tc.err == "" && err != nil || tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)) {
				t.Fatalf("error %v, want %q", err, tc.err)
			}
			if looks != tc.looks || !slices.Equal(facts.ips, tc.ips) || !slices.Equal(facts.podCIDRs, tc.podCIDRs) {
				t.Fatalf("%d looks, ips %v, pod CIDRs %v; want %d, %v, %v", looks, facts.ips, facts.podCIDRs, tc.looks, tc.ips, tc.podCIDRs)
			}
		})
	}
	// Another API error is kept for the timeout's message.
	_, err := instant().learn(context.Background(), "node-a", func(context.Context) (*corev1.Node, error) { return nil, errors.New("forbidden") }, true)
	if err == nil || !strings.Contains(err.Error(), "forbidden") {
		t.Fatalf("error %v, want the API's", err)
	}
}

// "primary" is kube-proxy's: the Node's address of each family as a /32
// or /128 (InternalIP before ExternalIP), --bind-address for its family
// when it names one, loopback left out; nothing known, every address.
func TestPrimaryNodePortAddressesAreKubeProxys(t *testing.T) {
	node := factsOf(nodeWith(nil,
		corev1.NodeAddress{Type: corev1.NodeExternalIP, Address: "203.0.113.5"},
		corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: "192.168.1.5"},
		corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: "192.168.1.6"},
		corev1.NodeAddress{Type: corev1.NodeExternalIP, Address: "2001:db8::5"}))
	for _, tc := range []struct {
		facts nodeFacts
		spec  []string
		bind  string
		want  []string
		warns bool
	}{
		{node, []string{"primary"}, "0.0.0.0", []string{"192.168.1.5/32", "2001:db8::5/128"}, false},
		{node, []string{"primary"}, "10.0.0.9", []string{"10.0.0.9/32", "2001:db8::5/128"}, false},
		{nodeFacts{}, []string{"primary"}, "0.0.0.0", []string{}, true},
		{nodeFacts{}, []string{"primary"}, "127.0.0.1", []string{}, true},
		{nodeFacts{}, []string{"primary"}, "fd00::7", []string{"fd00::7/128"}, false},
		{node, []string{"10.0.0.0/8"}, "0.0.0.0", []string{"10.0.0.0/8"}, false},
		{node, nil, "0.0.0.0", nil, false},
	} {
		warned := false
		got := tc.facts.nodePortAddresses(tc.spec, tc.bind, func(string) { warned = true })
		if !slices.Equal(got, tc.want) || (got == nil) != (tc.want == nil) || warned != tc.warns {
			t.Errorf("%v %v bind %s: %q (warned %v), want %q (%v)", tc.facts.ips, tc.spec, tc.bind, got, warned, tc.want, tc.warns)
		}
	}
}

// --detect-local-mode gives kube-proxy's match per family.
func TestLocalMatchFollowsTheDetectLocalMode(t *testing.T) {
	pods := []string{"10.244.1.0/24", "fd00:1::/64"}
	for _, tc := range []struct {
		args   []string
		v4, v6 localtraffic.Match
	}{
		{[]string{"--cluster-cidr=10.244.0.1/16"}, localtraffic.ByCIDR(netip.MustParsePrefix("10.244.0.0/16")), localtraffic.Match{}},
		{[]string{"--cluster-cidr=10.244.0.0/16,fd00::/48"}, localtraffic.ByCIDR(netip.MustParsePrefix("10.244.0.0/16")), localtraffic.ByCIDR(netip.MustParsePrefix("fd00::/48"))},
		{nil, localtraffic.Match{}, localtraffic.Match{}},
		{[]string{"--detect-local-mode=NodeCIDR", "--cluster-cidr=10.244.0.0/16"}, localtraffic.ByCIDR(netip.MustParsePrefix("10.244.1.0/24")), localtraffic.ByCIDR(netip.MustParsePrefix("fd00:1::/64"))},
		{[]string{"--detect-local-mode=BridgeInterface", "--pod-bridge-interface=cbr0"}, localtraffic.ByInterface("cbr0"), localtraffic.ByInterface("cbr0")},
		{[]string{"--detect-local-mode=InterfaceNamePrefix", "--pod-interface-name-prefix=veth"}, localtraffic.ByInterfacePrefix("veth"), localtraffic.ByInterfacePrefix("veth")},
	} {
		cfg, _, err := config.Parse(append([]string{"--proxy-mode=iptables"}, tc.args...))
		if err != nil {
			t.Fatal(err)
		}
		if v4, v6 := localMatch(cfg, false, pods), localMatch(cfg, true, pods); v4 != tc.v4 || v6 != tc.v6 {
			t.Errorf("%v: %v / %v, want %v / %v", tc.args, v4, v6, tc.v4, tc.v6)
		}
	}
}

// In NodeCIDR mode a change of the Node's pod CIDRs ends sluice once, as
// it ends kube-proxy; the same ones, or another mode, never.
func TestPodCIDRsChangeEndsSluiceInNodeCIDRMode(t *testing.T) {
	start := []string{"10.244.1.0/24"}
	nodeCIDR, _, _ := config.Parse([]string{"--proxy-mode=nftables", "--detect-local-mode=NodeCIDR"})
	clusterCIDR, _, _ := config.Parse([]string{"--proxy-mode=nftables"})
	if podCIDRsWatch(clusterCIDR, config.ModeNFTables, start, func() {}) != nil || podCIDRsWatch(nodeCIDR, config.ModeUserspace, start, func() {}) != nil {
		t.Fatal("a watch outside a kernel mode in NodeCIDR mode")
	}
	exits := 0
	watch := podCIDRsWatch(nodeCIDR, config.ModeNFTables, start, func() { exits++ })
	watch([]string{"10.244.1.0/24"})
	if exits != 0 {
		t.Fatal("the same pod CIDRs ended it")
	}
	watch([]string{"10.244.2.0/24"})
	watch(nil)
	if exits != 1 {
		t.Fatalf("%d exits, want 1", exits)
	}
}

// With --manifests, the Node is this node's Node object in them, read once
// at start-up: its addresses for --nodeport-addresses=primary, its pod CIDRs
// for NodeCIDR mode (none, or no Node, is an error naming what is missing),
// never another node's.
func TestNodeFactsFromTheManifests(t *testing.T) {
	node := func(name string, spec string) string {
		return "apiVersion: v1\nkind: Node\nmetadata: {name: " + name + "}\n" + spec +
			"status: {addresses: [{type: ExternalIP, address: 203.0.113.9}, {type: InternalIP, address: 192.168.1.5}]}\n"
	}
	for _, tc := range []struct {
		name, text   string
		needPodCIDRs bool
		err          string
		ips          []netip.Addr
		podCIDRs     []string
	}{
		{name: "there", text: node("node-a", "spec: {podCIDRs: [10.244.1.0/24, fd00:1::/64]}\n"), needPodCIDRs: true,
			ips: []netip.Addr{netip.MustParseAddr("192.168.1.5")}, podCIDRs: []string{"10.244.1.0/24", "fd00:1::/64"}},
		{name: "podCIDR alone", text: node("node-a", "spec: {podCIDR: 10.244.1.0/24}\n"), needPodCIDRs: true,
			ips: []netip.Addr{netip.MustParseAddr("192.168.1.5")}, podCIDRs: []string{"10.244.1.0/24"}},
		{name: "addresses only", text: node("node-a", ""), ips: []netip.Addr{netip.MustParseAddr("192.168.1.5")}},
		{name: "no pod CIDRs", text: node("node-a", ""), needPodCIDRs: true, err: `the Node "node-a" in --manifests`},
		{name: "another node's", text: node("node-b", "spec: {podCIDRs: [10.244.1.0/24]}\n")},
		{name: "another node's, NodeCIDR", text: node("node-b", "spec: {podCIDRs: [10.244.1.0/24]}\n"), needPodCIDRs: true, err: `holds no Node named "node-a"`},
		{name: "a bad file", text: node("node-a", "spec: {podCIDRz: [10.244.1.0/24]}\n"), err: "spec.podCIDRz"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			writeFile(t, dir+"/node.yaml", tc.text)
			cfg, _, err := config.Parse([]string{"--manifests", dir, "--hostname-override", "node-a"})
			if err != nil {
				t.Fatal(err)
			}
			src := &controlplane.ManifestSource{Path: dir, NodeName: nodeName(cfg), MaxBytes: manifestMaxBytes(cfg)}
			facts, err := learnNodeFacts(context.Background(), cfg, tc.needPodCIDRs, instant(), src)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want one saying %q", err, tc.err)
				}
				// A file Load would refuse is refused in Load's words.
				var rej manifestsRejected
				if bad := tc.name == "a bad file"; bad != errors.As(err, &rej) {
					t.Fatalf("error %v: a manifestsRejected %v, want %v", err, !bad, bad)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(facts.ips, tc.ips) || !slices.Equal(facts.podCIDRs, tc.podCIDRs) {
				t.Fatalf("addresses %v and pod CIDRs %v, want %v and %v", facts.ips, facts.podCIDRs, tc.ips, tc.podCIDRs)
			}
		})
	}
}
