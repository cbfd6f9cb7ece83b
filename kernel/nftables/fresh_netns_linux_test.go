package nftables

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/knftables"

	"github.com/sluice-proxy/sluice/kernel/netnstest"
)

// tableLines is `nft -j list table ip kube-proxy` as sorted lines, one
// per object, without handles, with elements sorted and each rule keeping
// its place in its chain.
func tableLines() ([]string, error) {
	out, err := exec.Command("nft", "-j", "list", "table", "ip", Table).Output()
	if err != nil {
		return nil, fmt.Errorf("nft list table: %w", err)
	}
	var doc struct {
		Nftables []map[string]map[string]any `json:"nftables"`
	}
	if err := json.Unmarshal(out, &doc); err != nil {
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

// On the real kernel, through nft: a first sync written in batches makes
// the table one transaction makes, and a partial sync goes on from it.
// The kernel refuses what the fake may not (a goto to a chain of another
// transaction, an element added to a map before its chain exists).
func TestFreshBatchesOnRealNFTables(t *testing.T) {
	netnstest.Need(t, "nft")
	netnstest.Run(t, func() error {
		ctx := context.Background()
		nft, err := knftables.New(knftables.IPv4Family, Table)
		if err != nil {
			return err
		}
		snap := freshPorts(25)
		var want []string
		for _, batch := range []int{-1, 4} {
			if err := Cleanup(ctx, nft); err != nil {
				return err
			}
			p := &Proxier{NFT: nft, Options: opts(), FreshBatch: batch}
			if err := p.Sync(ctx, snap); err != nil {
				return fmt.Errorf("FreshBatch %d: %w", batch, err)
			}
			got, err := tableLines()
			if err != nil {
				return err
			}
			if batch < 0 {
				want = got
				continue
			}
			if !slices.Equal(got, want) {
				return fmt.Errorf("batched table differs from one transaction's:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
			}
			next := freshPorts(24) // one port gone, its chains deleted
			if st, err := p.SyncStats(ctx, next); err != nil || st.Full {
				return fmt.Errorf("partial sync after the batched one: %+v %v", st, err)
			}
		}
		return Cleanup(ctx, nft)
	})
}
