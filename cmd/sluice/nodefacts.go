package main

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sluice-proxy/sluice/config"
	"github.com/sluice-proxy/sluice/controlplane"
)

// nodeFacts is what kube-proxy's NodeManager learns from this node's Node
// object at start-up: its addresses, which --nodeport-addresses=primary
// stands for, and its pod CIDRs, which --detect-local-mode=NodeCIDR
// matches.
type nodeFacts struct {
	// ips are the Node's first address of each family (status.addresses,
	// InternalIP before ExternalIP), the primary family's first.
	ips []netip.Addr
	// podCIDRs are spec.podCIDRs.
	podCIDRs []string
}

// nodeFactsNeeded says what this configuration needs of the Node: its
// pod CIDRs in a kernel mode with --detect-local-mode=NodeCIDR, and its
// addresses where --nodeport-addresses is "primary". (kube-proxy always
// waits for the addresses, for metrics and warnings sluice does not have.)
func nodeFactsNeeded(cfg *config.Config, mode string) (podCIDRs, ips bool) {
	podCIDRs = mode != config.ModeUserspace && cfg.KubeProxy.DetectLocalMode == "NodeCIDR"
	return podCIDRs, slices.Contains(cfg.KubeProxy.NodePortAddresses, config.NodePortAddressesPrimary)
}

// nodeWait is how kube-proxy waits for its Node at start-up: a look every
// second, for at most 30 seconds for its addresses (then on without
// them), and in NodeCIDR mode 5 more minutes for its pod CIDRs (then a
// start-up error).
type nodeWait struct {
	every, ips, podCIDRs time.Duration
	after                func(time.Duration) <-chan time.Time // time.After; tests pass their own
}

func kubeProxyNodeWait() nodeWait {
	return nodeWait{every: time.Second, ips: 30 * time.Second, podCIDRs: 5 * time.Minute, after: time.After}
}

// learn gets the Node (get; a NotFound is a Node not there yet) until it
// has what is needed, as kube-proxy's NewNodeManager: its addresses
// within w.ips, and when needPodCIDRs its pod CIDRs within w.ips +
// w.podCIDRs, else an error naming the node and what is missing.
func (w nodeWait) learn(ctx context.Context, name string, get func(context.Context) (*corev1.Node, error), needPodCIDRs bool) (nodeFacts, error) {
	var facts nodeFacts
	var node *corev1.Node
	look := func() error {
		n, err := get(ctx)
		switch {
		case apierrors.IsNotFound(err):
			return nil
		case err != nil:
			return err
		}
		node, facts = n, factsOf(n)
		return nil
	}
	var lastErr error
	waited := time.Duration(0)
	for {
		if err := look(); err != nil {
			lastErr = err
		}
		haveIPs := len(facts.ips) > 0
		havePods := len(facts.podCIDRs) > 0
		if (haveIPs || waited >= w.ips) && (!needPodCIDRs || havePods) {
			return facts, nil
		}
		if needPodCIDRs && waited >= w.ips+w.podCIDRs {
			what := fmt.Sprintf("timeout waiting for PodCIDR allocation on node %q (--detect-local-mode=NodeCIDR needs the Node's spec.podCIDRs)", name)
			if node == nil {
				what = fmt.Sprintf("timeout waiting for node %q to exist (--detect-local-mode=NodeCIDR needs its spec.podCIDRs)", name)
			}
			if lastErr != nil {
				return facts, fmt.Errorf("%s: %w", what, lastErr)
			}
			return facts, errors.New(what)
		}
		select {
		case <-ctx.Done():
			return facts, context.Cause(ctx)
		case <-w.after(w.every):
			waited += w.every
		}
	}
}

// factsOf reads a Node as kube-proxy does (GetNodeHostIPs: the
// InternalIPs, then the ExternalIPs, the first of each family).
func factsOf(n *corev1.Node) nodeFacts {
	var f nodeFacts
	var have4, have6 bool
	for _, kind := range []corev1.NodeAddressType{corev1.NodeInternalIP, corev1.NodeExternalIP} {
		for _, a := range n.Status.Addresses {
			if a.Type != kind {
				continue
			}
			ip, err := netip.ParseAddr(a.Address)
			if err != nil {
				continue
			}
			ip = ip.Unmap()
			if ip.Is4() && !have4 || ip.Is6() && !have6 {
				f.ips = append(f.ips, ip)
				have4, have6 = have4 || ip.Is4(), have6 || ip.Is6()
			}
		}
	}
	f.podCIDRs = controlplane.PodCIDRs(n)
	return f
}

// nodePortAddresses resolves --nodeport-addresses=primary as kube-proxy
// does: the node's address of each family as a /32 or /128, the primary
// family's taken from --bind-address when that names one, loopback ones
// left out. When none is known the list is empty, which lets NodePorts
// answer on every address, as kube-proxy's does (it assumes loopback and
// says to set --bind-address); warn says so. Any other list is kept.
func (f nodeFacts) nodePortAddresses(spec []string, bindAddress string, warn func(string)) []string {
	if !slices.Equal(spec, []string{config.NodePortAddressesPrimary}) {
		return spec
	}
	var v4, v6 netip.Addr
	for _, a := range f.ips {
		if a.Is4() && !v4.IsValid() {
			v4 = a
		}
		if a.Is6() && !v6.IsValid() {
			v6 = a
		}
	}
	if b, err := netip.ParseAddr(bindAddress); err == nil && !b.IsUnspecified() {
		if b = b.Unmap(); b.Is4() {
			v4 = b
		} else {
			v6 = b
		}
	}
	out := []string{}
	for _, a := range []netip.Addr{v4, v6} {
		if a.IsValid() && !a.IsLoopback() {
			out = append(out, netip.PrefixFrom(a, a.BitLen()).String())
		}
	}
	if len(out) == 0 {
		warn("--nodeport-addresses=primary: this node's address is not known (no Node object with addresses, no --bind-address): NodePorts answer on every address, as kube-proxy's do; set --bind-address to name it")
	}
	return out
}

// errPodCIDRsChanged ends sluice when the Node's pod CIDRs change in
// NodeCIDR mode, for its supervisor to start it again with the new ones,
// as kube-proxy exits.
var errPodCIDRsChanged = errors.New("the Node's spec.podCIDRs changed, which --detect-local-mode=NodeCIDR matches: exiting, to be started again with them, as kube-proxy does")

// learnNodeFacts learns what cfg needs of the Node (nodeFactsNeeded):
// with --manifests, from this node's Node object in them as they are at
// start-up (the first read of manifests, the source); else from the API,
// waiting for it as kube-proxy does.
func learnNodeFacts(ctx context.Context, cfg *config.Config, needPodCIDRs bool, w nodeWait, manifests *controlplane.ManifestSource) (nodeFacts, error) {
	if manifests != nil {
		return manifestNodeFacts(cfg, needPodCIDRs, manifests)
	}
	if !apiConfigured(cfg) {
		return nodeFacts{}, nil
	}
	client, _, err := newKubeClient(cfg)
	if err != nil {
		return nodeFacts{}, err
	}
	name := nodeName(cfg)
	return w.learn(ctx, name, func(ctx context.Context) (*corev1.Node, error) {
		return client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	}, needPodCIDRs)
}

// manifestNodeFacts is learnNodeFacts from the Node object named as this
// node in --manifests. There is nothing to wait for: a Node the files do
// not hold, or one without pod CIDRs in NodeCIDR mode, is an error.
func manifestNodeFacts(cfg *config.Config, needPodCIDRs bool, manifests *controlplane.ManifestSource) (nodeFacts, error) {
	name := nodeName(cfg)
	n, err := manifests.Prime()
	if err != nil {
		return nodeFacts{}, manifestsRejected{path: cfg.Manifests, err: err} // as Load would say it
	}
	var facts nodeFacts
	if n != nil {
		facts = factsOf(n)
	}
	switch {
	case !needPodCIDRs || len(facts.podCIDRs) > 0:
		return facts, nil
	case n == nil:
		return facts, fmt.Errorf("--detect-local-mode=NodeCIDR needs this node's Node object (its spec.podCIDRs): --manifests %s holds no Node named %q (--hostname-override, else the host name); add one, or use --detect-local-mode=ClusterCIDR with --cluster-cidr, or an interface mode", cfg.Manifests, name)
	default:
		return facts, fmt.Errorf("--detect-local-mode=NodeCIDR needs this node's spec.podCIDRs: the Node %q in --manifests %s has none", name, cfg.Manifests)
	}
}

// podCIDRsWatch is, in a kernel mode with NodeCIDR, what the API source
// tells the Node's pod CIDRs to: a change from those the rules were
// written with calls exit once (kube-proxy exits; its supervisor starts
// it again). nil otherwise.
func podCIDRsWatch(cfg *config.Config, mode string, started []string, exit func()) func([]string) {
	if need, _ := nodeFactsNeeded(cfg, mode); !need {
		return nil
	}
	var once sync.Once
	return func(now []string) {
		if !slices.Equal(now, started) {
			once.Do(exit)
		}
	}
}
