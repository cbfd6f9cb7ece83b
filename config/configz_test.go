package config

import (
	"encoding/json"
	"strings"
	"testing"
)

// /configz's kube-proxy part takes the mode's own sync periods, splits
// --cluster-cidr as kube-proxy's internal configuration does, and names
// its fields as kube-proxy's does (Go's names); sluice's own settings are
// beside it. (cmd/sluice's parity tests compare the whole answer with
// upstream kube-proxy's, in iptables and nftables mode.)
func TestConfigzIsKubeProxysShape(t *testing.T) {
	c, _, err := Parse([]string{"--proxy-mode=ipvs", "--ipvs-sync-period=7s", "--ipvs-min-sync-period=2s", "--cluster-cidr=10.0.0.0/8,fd00::/48", "--engine=goroutine"})
	if err != nil {
		t.Fatal(err)
	}
	data, err := json.Marshal(c.Configz())
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]map[string]any
	json.Unmarshal(data, &got)
	kp := got[ConfigzGroup]
	if kp["SyncPeriod"] != "7s" || kp["MinSyncPeriod"] != "2s" || kp["Mode"] != "ipvs" {
		t.Fatalf("sync periods and mode: %v %v %v", kp["SyncPeriod"], kp["MinSyncPeriod"], kp["Mode"])
	}
	if cidrs := kp["DetectLocal"].(map[string]any)["ClusterCIDRs"].([]any); len(cidrs) != 2 || cidrs[1] != "fd00::/48" {
		t.Fatalf("DetectLocal.ClusterCIDRs = %v", cidrs)
	}
	if mc := kp["Linux"].(map[string]any)["Conntrack"].(map[string]any)["MaxPerCore"]; mc != 32768.0 {
		t.Fatalf("Linux.Conntrack.MaxPerCore = %v", mc)
	}
	if !strings.Contains(string(data), `"engine":"goroutine"`) || got[SluiceConfigzGroup] == nil {
		t.Fatalf("sluice's settings are not beside it: %s", data)
	}
}
