package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/config"
	"github.com/sluice-proxy/sluice/controlplane/kube/kubetest"
)

// The file sluice's --write-config-to writes (KubeProxyConfiguration, then
// a SluiceConfiguration) is one upstream kube-proxy v1.34.2 reads, so a
// ConfigMap carrying sluice's settings still serves a rollback to
// kube-proxy; and kube-proxy's own rewrite of it loads back into sluice
// with the same kube-proxy settings.
func TestKubeProxyReadsTheConfigSluiceWrites(t *testing.T) {
	kubeProxy, err := kubetest.KubeProxyBinary()
	kubetest.Require(t, err)
	dir := t.TempDir()
	ours, theirs := filepath.Join(dir, "sluice.yaml"), filepath.Join(dir, "kube-proxy.yaml")
	args := []string{"--proxy-mode=nftables", "--cluster-cidr=10.244.0.0/16", "--nodeport-addresses=192.168.0.0/16",
		"--iptables-min-sync-period=2s", "--engine=goroutine", "--eject-after=5", "--logging-format=json"}
	var stdout, stderr bytes.Buffer
	if code := run(context.Background(), append(args, "--write-config-to", ours), &stdout, &stderr); code != 0 {
		t.Fatalf("sluice --write-config-to: exit %d: %s", code, stderr.String())
	}
	if data, _ := os.ReadFile(ours); !bytes.Contains(data, []byte("kind: SluiceConfiguration")) || !bytes.Contains(data, []byte("after: 5")) {
		t.Fatalf("sluice's settings are not in the file:\n%s", data)
	}
	out, err := exec.Command(kubeProxy, "--config", ours, "--write-config-to", theirs).CombinedOutput()
	if err != nil {
		t.Fatalf("kube-proxy refused the file sluice wrote: %v\n%s", err, out)
	}
	want, _, err := config.Parse(append(args, "--config", ours))
	if err != nil {
		t.Fatal(err)
	}
	got, _, err := config.Parse([]string{"--config", theirs})
	if err != nil {
		t.Fatalf("kube-proxy's rewrite does not load into sluice: %v", err)
	}
	for _, w := range got.ConfigWarnings {
		if !strings.Contains(w, "lenient") {
			t.Fatalf("unexpected warning: %s", w)
		}
	}
	// In nftables mode kube-proxy keeps only the nftables section's periods
	// (--iptables-min-sync-period sets them): sluice must have put 2s there.
	gotSync, gotMin := got.SyncPeriods()
	wantSync, wantMin := want.SyncPeriods()
	if got.Mode() != "nftables" || got.KubeProxy.ClusterCIDR != want.KubeProxy.ClusterCIDR ||
		strings.Join(got.KubeProxy.NodePortAddresses, ",") != "192.168.0.0/16" ||
		gotMin != 2*time.Second || gotMin != wantMin || gotSync != wantSync || got.LogFormat != "json" {
		t.Fatalf("kube-proxy's reading differs: mode %s cidr %s nodeports %v sync %s/%s (want %s/%s) log %s",
			got.Mode(), got.KubeProxy.ClusterCIDR, got.KubeProxy.NodePortAddresses, gotSync, gotMin, wantSync, wantMin, got.LogFormat)
	}
}
