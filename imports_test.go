package sluice_test

import (
	"os/exec"
	"strings"
	"testing"
)

// The import rules of DESIGN.md: cmd -> config, controlplane, listeners,
// kernel, admin -> lb -> affinity. lb and affinity know nothing of sockets,
// Kubernetes or iptables; listeners and kernel never import each other.
func TestImportRules(t *testing.T) {
	const mod = "github.com/sluice-proxy/sluice/"
	forbidden := map[string][]string{
		"affinity":     {mod + "lb", mod + "config", mod + "controlplane", mod + "listeners", mod + "kernel", mod + "admin", "net", "k8s.io/", "golang.org/x/sys/"},
		"lb":           {mod + "config", mod + "controlplane", mod + "listeners", mod + "kernel", mod + "admin", "k8s.io/", "golang.org/x/sys/", "net", "net/http"},
		"listeners":    {mod + "kernel", mod + "config", mod + "controlplane", mod + "admin", "k8s.io/"},
		"kernel":       {mod + "listeners", mod + "controlplane", mod + "admin"},
		"controlplane": {mod + "listeners", mod + "kernel", mod + "admin", mod + "config"},
		"admin":        {mod + "listeners", mod + "kernel", mod + "controlplane", mod + "config"},
		"config":       {mod + "listeners", mod + "kernel", mod + "controlplane", mod + "admin"},
	}
	for pkg, bad := range forbidden {
		out, err := exec.Command("go", "list", "-deps", "./"+pkg).Output()
		if err != nil {
			t.Fatalf("go list %s: %v", pkg, err)
		}
		for _, dep := range strings.Fields(string(out)) {
			for _, b := range bad {
				// "x/" forbids a whole tree; anything else one package.
				if dep == b || (strings.HasSuffix(b, "/") && strings.HasPrefix(dep, b)) {
					t.Errorf("%s depends on %s, which the import rules forbid", pkg, dep)
				}
			}
		}
	}
}
