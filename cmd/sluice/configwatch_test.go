package main

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// A --config file rewritten into another valid configuration ends sluice,
// drained, with exit code 1 and kube-proxy's message, as it ends
// kube-proxy, so that its supervisor starts it again with the new file;
// one rewritten with the same configuration, or into one that is not
// valid, does not: the running sluice goes on serving.
func TestARewrittenConfigFileEndsSluiceAsItEndsKubeProxy(t *testing.T) {
	dir := t.TempDir()
	manifests := filepath.Join(dir, "m")
	os.Mkdir(manifests, 0o755)
	np, unp := freePort(t, "tcp"), freePort(t, "udp")
	writeFile(t, filepath.Join(manifests, "svc.yaml"), manifest(np, unp, 9, 9, "127.0.0.1"))
	cfgFile := filepath.Join(dir, "kube-proxy.yaml")
	kp := func(metrics int) string {
		return fmt.Sprintf("apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nbindAddress: 127.0.0.1\nhealthzBindAddress: \"\"\nmetricsBindAddress: 127.0.0.1:%d\n", metrics)
	}
	mp := freePort(t, "tcp")
	writeFile(t, cfgFile, kp(mp))
	p := start(t, "--config", cfgFile, "--manifests", manifests, "--v=1")
	p.waitLog("state applied")

	inPlace := func(content string) {
		t.Helper()
		if err := os.WriteFile(cfgFile, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	inPlace(kp(mp)) // the same
	p.waitLog("rewritten with the same configuration")
	inPlace(kp(mp) + "mode: nosuchmode\n")
	p.waitLog("the --config file changed and is not valid", "nosuchmode")

	// An editor's save: a new file renamed over the old one.
	tmp := filepath.Join(dir, ".kube-proxy.yaml.swp")
	writeFile(t, tmp, kp(freePort(t, "tcp")))
	if err := os.Rename(tmp, cfgFile); err != nil {
		t.Fatal(err)
	}
	p.waitLog("the --config file changed: exiting")
	p.waitLog("shutting down", "the --config file changed")
	p.waitLog("content of the proxy server's configuration file was updated")
	if code := p.exitCode(); code != 1 {
		t.Fatalf("exit code %d, want 1", code)
	}
}
