package main

import (
	"context"
	"errors"
	"os/exec"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sluice-proxy/sluice/controlplane/kube/kubetest"
)

// --detect-local-mode=NodeCIDR against a real API server, as kube-proxy
// behaves: sluice waits for the Node's pod CIDRs before it programs
// anything, writes its rules from them, and when they change drains and
// exits with code 1, for its supervisor to start it again.
func TestNodeCIDRModeWaitsForAndFollowsThePodCIDRs(t *testing.T) {
	if !inPrivateNetns() {
		kubetest.Require(t, errors.New("the Kubernetes API tests need a private network namespace, which needs root"))
	}
	if _, err := exec.LookPath("nft"); err != nil {
		kubetest.Require(t, err)
	}
	c := startCluster(t)
	ctx := context.Background()
	node, err := c.Client.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: kubeNode}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	node.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "127.0.0.1"}}
	if node, err = c.Client.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { exec.Command(sluiceBin, "--cleanup").Run() })
	p := start(t, "--kubeconfig", c.Kubeconfig, "--hostname-override", kubeNode, "--proxy-mode=nftables", "--mode-fallback=false",
		"--detect-local-mode=NodeCIDR", "--nodeport-addresses=127.0.0.0/8", "--healthz-bind-address=", "--metrics-bind-address=", "--v=1")
	// Not before the Node has pod CIDRs: nothing is programmed meanwhile.
	p.waitLog("proxy mode", "nftables")
	if out, _ := exec.Command("nft", "list", "tables").CombinedOutput(); strings.Contains(string(out), "kube-proxy") {
		t.Fatalf("rules programmed before the Node had pod CIDRs:\n%s", out)
	}
	node.Spec.PodCIDR, node.Spec.PodCIDRs = "10.244.7.0/24", []string{"10.244.7.0/24"}
	if _, err := c.Client.CoreV1().Nodes().Update(ctx, node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	p.waitLog("detect-local-mode NodeCIDR", "10.244.7.0/24")
	e := &kubeEnv{t: t, cluster: c, client: c.Client}
	e.createService(webService("web"))
	e.setSlice("web", "web-1", "http", readyEP("10.244.7.5"))
	e.eventually("the cluster IP's masquerade from outside the node's pod CIDR", func() (bool, string) {
		out, _ := exec.Command("nft", "list", "table", "ip", "kube-proxy").CombinedOutput()
		return strings.Contains(string(out), "saddr != 10.244.7.0/24"), string(out)
	})
	// A new allocation (the API allows one only to a new Node: the node
	// registered again) ends it, as it ends kube-proxy.
	if err := c.Client.CoreV1().Nodes().Delete(ctx, kubeNode, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	again := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: kubeNode}, Spec: corev1.NodeSpec{PodCIDR: "10.244.8.0/24", PodCIDRs: []string{"10.244.8.0/24"}}}
	if _, err := c.Client.CoreV1().Nodes().Create(ctx, again, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	p.waitLog("spec.podCIDRs changed")
	if code := p.exitCode(); code != 1 {
		t.Fatalf("exit code %d, want 1", code)
	}
}
