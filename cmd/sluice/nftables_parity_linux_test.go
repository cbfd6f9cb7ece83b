package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/sluice-proxy/sluice/controlplane/kube/kubetest"
)

// Live parity with upstream kube-proxy v1.34.2 in nftables mode (issue
// 13): the same API objects, the same flags, the same node; kube-proxy
// programs its table, the test dumps it (nft -j), cleans up, and sluice
// programs the same node from the same API server. Both dumps, stripped of
// handles and counters and with set elements sorted, must be equal but for
// the differences listed in knownNFTablesDifferences, each a gap this test
// keeps honest: a new difference fails it, and so does a listed one that
// went away.

// knownNFTablesDifferences are the canonical lines only one side has,
// prefixed "kube-proxy only: " or "sluice only: ".
var knownNFTablesDifferences = []string{}

func TestNFTablesParityWithKubeProxy(t *testing.T) {
	if !inPrivateNetns() {
		kubetest.Require(t, errors.New("the parity test needs a private network namespace, which needs root"))
	}
	kubeProxy, err := kubetest.KubeProxyBinary()
	kubetest.Require(t, err)
	if _, err := exec.LookPath("nft"); err != nil {
		kubetest.Require(t, fmt.Errorf("nft: %w", err))
	}
	c := kubetest.Start(t)
	ctx := context.Background()
	e := &kubeEnv{t: t, cluster: c, client: c.Client}

	// The node: an uplink that leads nowhere, with the node's IP.
	ipCmd := func(args ...string) error {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
		return nil
	}
	if err := ipCmd("link", "add", "parity0", "type", "veth", "peer", "name", "parity1"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ipCmd("link", "del", "parity0") })
	if err := errors.Join(ipCmd("link", "set", "parity0", "up"), ipCmd("link", "set", "parity1", "up"),
		ipCmd("addr", "add", "192.168.10.1/24", "dev", "parity0")); err != nil {
		t.Fatal(err)
	}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: kubeNode}}
	node, err = c.Client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	node.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "192.168.10.1"}}
	if _, err := c.Client.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}

	// Services covering the layout: load balancing, affinity, NodePorts,
	// no endpoints, externalIPs, a LoadBalancer with source ranges and
	// externalTrafficPolicy Local (health-check node port), UDP.
	local, remote := readyEP("10.244.0.5"), kubeEP{ip: "10.244.1.6", node: "node-b", ready: true, serving: true}
	web := webService("web")
	e.createService(web)
	e.setSlice("web", "web-1", "http", local, remote)
	sticky := webService("sticky")
	sticky.Spec.Type = corev1.ServiceTypeClusterIP
	sticky.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
	e.createService(sticky)
	e.setSlice("sticky", "sticky-1", "http", local, remote)
	empty := webService("empty")
	e.createService(empty)
	ext := webService("ext")
	ext.Spec.Type = corev1.ServiceTypeClusterIP
	ext.Spec.ExternalIPs = []string{"203.0.113.10"}
	e.createService(ext)
	e.setSlice("ext", "ext-1", "http", remote)
	lb := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "guarded"},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, ExternalTrafficPolicy: corev1.ServiceExternalTrafficPolicyLocal,
			LoadBalancerSourceRanges: []string{"192.168.10.0/24"},
			Ports:                    []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080), Protocol: corev1.ProtocolTCP}}},
	}
	lb = e.createService(lb)
	lb.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "203.0.113.20"}}
	if _, err := c.Client.CoreV1().Services("default").UpdateStatus(ctx, lb, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.setSlice("guarded", "guarded-1", "http", local, remote)

	flags := []string{"--kubeconfig=" + c.Kubeconfig, "--hostname-override=" + kubeNode, "--proxy-mode=nftables",
		"--cluster-cidr=10.244.0.0/16", "--nodeport-addresses=192.168.10.0/24",
		"--conntrack-max-per-core=0", "--conntrack-tcp-timeout-established=0", "--conntrack-tcp-timeout-close-wait=0"}
	want := []string{"service-", "web/tcp/http", "sticky/tcp/http", "ext/tcp/http", "guarded/tcp/http", "203.0.113.20"}

	hz, mp := freePort(t, "tcp"), freePort(t, "tcp")
	flags = append(flags, fmt.Sprintf("--healthz-bind-address=127.0.0.1:%d", hz), fmt.Sprintf("--metrics-bind-address=127.0.0.1:%d", mp))
	kp := startCmd(t, exec.Command(kubeProxy, append(flags, "--v=2")...))
	upstream := waitForTable(t, e, want, kp)
	kp.cmd.Process.Signal(os.Interrupt)
	kp.exitCode()
	if out, err := exec.Command(kubeProxy, "--cleanup", "--proxy-mode=nftables").CombinedOutput(); err != nil {
		t.Fatalf("kube-proxy --cleanup: %v\n%s", err, out)
	}
	if out, _ := exec.Command("nft", "list", "tables").CombinedOutput(); strings.Contains(string(out), "kube-proxy") {
		t.Fatalf("kube-proxy --cleanup left: %s", out)
	}

	sl := start(t, append(flags, "--mode-fallback=false")...)
	ours := waitForTable(t, e, want, sl)

	var diffs []string
	for _, l := range upstream {
		if !slices.Contains(ours, l) {
			diffs = append(diffs, "kube-proxy only: "+l)
		}
	}
	for _, l := range ours {
		if !slices.Contains(upstream, l) {
			diffs = append(diffs, "sluice only: "+l)
		}
	}
	for _, d := range diffs {
		if !slices.Contains(knownNFTablesDifferences, d) {
			t.Errorf("%s", d)
		}
	}
	for _, k := range knownNFTablesDifferences {
		if !slices.Contains(diffs, k) {
			t.Errorf("a known difference is gone (take it off the list): %s", k)
		}
	}
	t.Logf("compared %d canonical lines from kube-proxy with %d from sluice; %d known differences", len(upstream), len(ours), len(knownNFTablesDifferences))

	// A ServiceCIDR added later widens the drop of unallocated ClusterIPs.
	extra := &networkingv1.ServiceCIDR{ObjectMeta: metav1.ObjectMeta{Name: "extra"}, Spec: networkingv1.ServiceCIDRSpec{CIDRs: []string{"10.100.0.0/16"}}}
	if _, err := c.Client.NetworkingV1().ServiceCIDRs().Create(ctx, extra, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.eventually("a new ServiceCIDR in the drop rule", func() (bool, string) {
		out, err := exec.Command("nft", "list", "chain", "ip", "kube-proxy", "cluster-ips-check").CombinedOutput()
		return err == nil && strings.Contains(string(out), "10.96.0.0/16") && strings.Contains(string(out), "10.100.0.0/16"), string(out)
	})
}

// waitForTable waits until table ip kube-proxy holds every string in want
// and two dumps in a row agree (a sync is one transaction, but the first
// syncs follow each other), then returns its canonical lines.
func waitForTable(t *testing.T, e *kubeEnv, want []string, p *proc) []string {
	t.Helper()
	var last []string
	e.eventually("table ip kube-proxy complete and settled", func() (bool, string) {
		select {
		case err := <-p.done:
			p.done <- err
			var out []string
			for l := range p.lines {
				out = append(out, l)
			}
			t.Fatalf("the proxy exited: %v (%d lines)\n%s", err, len(out), strings.Join(out[max(0, len(out)-30):], "\n"))
		default:
		}
		out, err := exec.Command("nft", "-j", "list", "table", "ip", "kube-proxy").Output()
		if err != nil {
			return false, err.Error()
		}
		for _, w := range want {
			if !strings.Contains(string(out), w) {
				return false, "no " + w
			}
		}
		lines, err := canonicalNFT(out)
		if err != nil {
			t.Fatal(err)
		}
		settled := slices.Equal(lines, last)
		last = lines
		return settled, "changing"
	})
	return last
}

// canonicalNFT turns `nft -j list table` output into sorted lines, one per
// table, chain, set, map and rule, without handles or counter values, with
// set and map elements sorted and each rule keeping its place in its chain.
func canonicalNFT(data []byte) ([]string, error) {
	var doc struct {
		Nftables []map[string]map[string]any `json:"nftables"`
	}
	if err := json.Unmarshal(data, &doc); err != nil {
		return nil, err
	}
	pos := map[string]int{}
	var lines []string
	for _, obj := range doc.Nftables {
		for kind, v := range obj {
			if kind == "metainfo" {
				continue
			}
			delete(v, "handle")
			if elems, ok := v["elem"].([]any); ok {
				keys := make([]string, len(elems))
				for i, el := range elems {
					b, _ := json.Marshal(el)
					keys[i] = string(b)
				}
				slices.Sort(keys)
				v["elem"] = keys
			}
			if kind == "rule" {
				zeroCounters(v["expr"])
				chain := fmt.Sprint(v["chain"])
				v["position"] = pos[chain]
				pos[chain]++
			}
			b, err := json.Marshal(v)
			if err != nil {
				return nil, err
			}
			lines = append(lines, kind+" "+string(b))
		}
	}
	slices.Sort(lines)
	return lines, nil
}

func zeroCounters(v any) {
	switch x := v.(type) {
	case []any:
		for _, e := range x {
			zeroCounters(e)
		}
	case map[string]any:
		if c, ok := x["counter"].(map[string]any); ok {
			c["packets"], c["bytes"] = 0, 0
		}
		for _, e := range x {
			zeroCounters(e)
		}
	}
}
