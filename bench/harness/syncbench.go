package harness

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/sluice-proxy/sluice/kernel/iptables"
	"github.com/sluice-proxy/sluice/kernel/localtraffic"
	"github.com/sluice-proxy/sluice/lb"
)

// The iptables sync benchmark: how long the iptables mode takes to render
// and apply (one real iptables-restore) its rules for N services with 10
// endpoints each, for a full sync onto empty tables, a partial sync after
// one service's endpoints changed, and a full resync of an unchanged
// state (the hourly one). It programs real iptables, so the caller runs it
// in a private network namespace (sluice-bench sync re-executes itself
// with CLONE_NEWNET); nothing here touches the root namespace by itself.

// SyncResult is one measured sync.
type SyncResult struct {
	Backend  string  `json:"backend"`
	Services int     `json:"services"`
	Kind     string  `json:"kind"` // full, partial, full-resync
	RenderMS float64 `json:"renderMs"`
	ApplyMS  float64 `json:"applyMs"` // iptables-restore, jump rules and canaries
	TotalMS  float64 `json:"totalMs"`
	Bytes    int     `json:"bytes"`
	Lines    int     `json:"lines"`
	// Failed says why the sync did not complete (e.g. it outlived the
	// per-restore limit); the times are then not meaningful.
	Failed string `json:"failed,omitempty"`
}

// SyncSnapshot is n services with 10 ready endpoints each, a NodePort and
// an external IP.
func SyncSnapshot(n int) *lb.Snapshot {
	ports := map[lb.ServicePortName]*lb.ServicePort{}
	for i := 0; i < n; i++ {
		sp := &lb.ServicePort{Name: lb.ServicePortName{Namespace: "bench", Name: fmt.Sprintf("svc-%d", i), Port: "p", Protocol: lb.TCP},
			ClusterIPs: []netip.Addr{netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)})}, Port: 80, NodePort: uint16(30000 + i%2768)}
		for j := 0; j < 10; j++ {
			sp.Endpoints = append(sp.Endpoints, lb.Endpoint{Addr: lb.EndpointAddrFrom(netip.AddrFrom4([4]byte{10, byte(128 + i>>12), byte(i >> 4), byte(j + 16*(i&15))}), 8080), Ready: true, Serving: true})
		}
		ports[sp.Name] = sp
	}
	return lb.NewSnapshot(ports)
}

// timedRunner measures the time spent in the real runner.
type timedRunner struct {
	iptables.Runner
	spent time.Duration
}

// Legacy passes on what the real runner says of its backend, which
// decides how the proxier writes a first sync (iptables.Backend).
func (t *timedRunner) Legacy() bool {
	b, ok := t.Runner.(iptables.Backend)
	return !ok || b.Legacy()
}

func (t *timedRunner) Restore(data []byte) error {
	start := time.Now()
	err := t.Runner.Restore(data)
	t.spent += time.Since(start)
	return err
}

func (t *timedRunner) EnsureRule(table, chain string, args ...string) error {
	start := time.Now()
	err := t.Runner.EnsureRule(table, chain, args...)
	t.spent += time.Since(start)
	return err
}

func (t *timedRunner) EnsureChain(table, chain string) error {
	start := time.Now()
	err := t.Runner.EnsureChain(table, chain)
	t.spent += time.Since(start)
	return err
}

func (t *timedRunner) Save(table string) ([]byte, error) {
	start := time.Now()
	out, err := t.Runner.Save(table)
	t.spent += time.Since(start)
	return out, err
}

func (t *timedRunner) Chains(table string) ([]string, error) {
	start := time.Now()
	c, err := t.Runner.Chains(table)
	t.spent += time.Since(start)
	return c, err
}

// RunSyncBench measures each backend and size, rounds times each, and
// leaves the tables clean after each size. A sync that fails or outlives
// limit (per iptables-restore) is recorded as failed, and the rest of that
// backend and size is skipped.
func RunSyncBench(backends []string, sizes []int, rounds int, limit time.Duration, logf func(string, ...any)) ([]SyncResult, error) {
	var out []SyncResult
	o := iptables.Options{MasqueradeBit: 14, Local: localtraffic.ByCIDR(netip.MustParsePrefix("10.128.0.0/9"))}
	for _, be := range backends {
		for _, n := range sizes {
			base := SyncSnapshot(n)
			changed := SyncSnapshot(n)
			one := changed.Sorted()[n/2]
			one.Endpoints = one.Endpoints[1:]
			r := &timedRunner{Runner: &iptables.Exec{Command: "iptables-" + be, Timeout: limit, RestoreTimeout: limit}}
			measure := func(kind string, p *iptables.Proxier, snap *lb.Snapshot, prev iptables.Bodies) error {
				rs := time.Now()
				data, _, _ := iptables.RenderPartial(snap, p.Options, prev)
				render := time.Since(rs)
				r.spent = 0
				start := time.Now()
				st, err := p.SyncStats(snap)
				total := time.Since(start)
				if err != nil {
					why := err.Error()
					if total >= limit {
						why = fmt.Sprintf("did not finish within %s", limit)
					}
					logf("%-6s %6d services  %-11s FAILED: %s", be, n, kind, why)
					out = append(out, SyncResult{Backend: be, Services: n, Kind: kind, TotalMS: ms(total), Bytes: len(data), Lines: strings.Count(string(data), "\n"), Failed: why})
					return errSkip
				}
				if want := kind == "partial"; st.Full == want {
					return fmt.Errorf("%s %d services: %s sync came out full=%v", be, n, kind, st.Full)
				}
				res := SyncResult{Backend: be, Services: n, Kind: kind, RenderMS: ms(render), ApplyMS: ms(r.spent), TotalMS: ms(total),
					Bytes: len(data), Lines: strings.Count(string(data), "\n")}
				logf("%-6s %6d services  %-11s render %8.1f ms  apply %9.1f ms  total %9.1f ms  %d lines", be, n, kind, res.RenderMS, res.ApplyMS, res.TotalMS, res.Lines)
				out = append(out, res)
				return nil
			}
		rounds:
			for round := 0; round < rounds; round++ {
				if err := iptables.Cleanup(r, o); err != nil {
					return out, fmt.Errorf("%s: cleanup before %d services: %w", be, n, err)
				}
				p := &iptables.Proxier{Runner: r, Options: o}
				_, applied, _ := iptables.RenderPartial(base, o, nil)
				for _, step := range []struct {
					kind string
					snap *lb.Snapshot
					prev iptables.Bodies
				}{{"full", base, nil}, {"partial", changed, applied}, {"full-resync", changed, nil}} {
					if step.kind == "full-resync" {
						p.Invalidate()
					}
					if err := measure(step.kind, p, step.snap, step.prev); err != nil {
						break rounds
					}
				}
			}
			if err := iptables.Cleanup(r, o); err != nil {
				return out, fmt.Errorf("%s: cleanup after %d services: %w", be, n, err)
			}
		}
	}
	return out, nil
}

var errSkip = errors.New("skip")

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// WriteSyncResults writes results.md (medians per backend, size and kind,
// with the partial/full ratio), results.json and machine.txt into dir.
func WriteSyncResults(dir string, res []SyncResult, machine string) (string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	type key struct {
		be   string
		n    int
		kind string
	}
	groups := map[key][]SyncResult{}
	var keys []key
	for _, r := range res {
		k := key{r.Backend, r.Services, r.Kind}
		if _, ok := groups[k]; !ok {
			keys = append(keys, k)
		}
		groups[k] = append(groups[k], r)
	}
	med := func(rs []SyncResult, f func(SyncResult) float64) float64 {
		v := make([]float64, len(rs))
		for i, r := range rs {
			v[i] = f(r)
		}
		slices.Sort(v)
		return sortedMedian(v)
	}
	var b strings.Builder
	b.WriteString("# iptables sync benchmark\n\n")
	b.WriteString("Real `iptables-restore --noflush` in a private network namespace; N services x 10 endpoints, each with a NodePort. ")
	b.WriteString("full: onto empty tables; partial: after one service's endpoints changed; full-resync: the same state rewritten whole (the hourly sync). Medians of the rounds.\n\n")
	b.WriteString("| backend | services | sync | render ms | apply ms | total ms | restore lines | vs full |\n|---|---:|---|---:|---:|---:|---:|---:|\n")
	for _, k := range keys {
		rs := groups[k]
		if rs[0].Failed != "" {
			fmt.Fprintf(&b, "| %s | %d | %s | | | failed: %s | %d | |\n", k.be, k.n, k.kind, rs[0].Failed, rs[0].Lines)
			continue
		}
		total := med(rs, func(r SyncResult) float64 { return r.TotalMS })
		vs := ""
		if full, ok := groups[key{k.be, k.n, "full-resync"}]; ok && k.kind == "partial" {
			vs = fmt.Sprintf("%.2fx", total/med(full, func(r SyncResult) float64 { return r.TotalMS }))
		}
		fmt.Fprintf(&b, "| %s | %d | %s | %.1f | %.1f | %.1f | %d | %s |\n", k.be, k.n, k.kind,
			med(rs, func(r SyncResult) float64 { return r.RenderMS }), med(rs, func(r SyncResult) float64 { return r.ApplyMS }), total, rs[0].Lines, vs)
	}
	if err := os.WriteFile(filepath.Join(dir, "results.md"), []byte(b.String()), 0o644); err != nil {
		return "", err
	}
	js, _ := json.MarshalIndent(res, "", "  ")
	if err := os.WriteFile(filepath.Join(dir, "results.json"), js, 0o644); err != nil {
		return "", err
	}
	return b.String(), os.WriteFile(filepath.Join(dir, "machine.txt"), []byte(machine), 0o644)
}
