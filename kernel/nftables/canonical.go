//go:build linux

package nftables

import (
	"encoding/json"
	"fmt"
	"slices"
)

// CanonicalDump turns `nft -j list table` (or ruleset) output into sorted
// lines, one per table, chain, set, map and rule, without handles or
// counter values, with set and map elements sorted and each rule keeping
// its place in its chain: what two tables are compared on when the order
// they were written in carries no meaning (the parity tests against
// kube-proxy, a table written in batches against one transaction's).
func CanonicalDump(data []byte) ([]string, error) {
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
				chain := fmt.Sprint(v["family"], " ", v["table"], " ", v["chain"])
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
