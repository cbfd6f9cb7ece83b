package iptables

import (
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"

	"github.com/sluice-proxy/sluice/lb"
)

// Proxier programs one family's iptables from snapshots: every Sync is a
// full render applied in one iptables-restore, then the jump rules and
// canaries are ensured. It is not safe for concurrent use; the caller's
// sync loop owns it.
type Proxier struct {
	Runner  Runner
	Options Options
	Log     *slog.Logger
}

// Sync makes the kernel's rules match snap.
func (p *Proxier) Sync(snap *lb.Snapshot) error {
	o := p.Options
	chains, err := p.Runner.Chains("nat")
	if err != nil {
		return fmt.Errorf("list nat chains: %w", err)
	}
	o.ExistingNATChains = chains
	data := Render(snap, o)
	if err := p.Runner.Restore(data); err != nil {
		return fmt.Errorf("apply rules: %w", err)
	}
	if p.Log != nil {
		p.Log.Debug("iptables rules applied", "ipv6", o.IPv6, "bytes", len(data))
	}
	for _, j := range Jumps(o) {
		if err := p.Runner.EnsureRule(j.Table, j.Chain, j.Args...); err != nil {
			return fmt.Errorf("hook %s into %s/%s: %w", target(j.Args), j.Table, j.Chain, err)
		}
	}
	for _, t := range CanaryTables {
		if err := p.Runner.EnsureChain(t, ChainCanary); err != nil {
			return fmt.Errorf("canary in %s: %w", t, err)
		}
	}
	return nil
}

// CanaryGone reports whether a KUBE-PROXY-CANARY chain has disappeared,
// which means someone flushed the tables and a full sync is due.
func (p *Proxier) CanaryGone() bool {
	for _, t := range CanaryTables {
		chains, err := p.Runner.Chains(t)
		if err != nil || !slices.Contains(chains, ChainCanary) {
			return true
		}
	}
	return false
}

// Cleanup removes every jump rule and chain the iptables mode installs,
// in every table, and nothing else. It is idempotent.
func Cleanup(r Runner, o Options) error {
	var errs []error
	o.LocalhostNodePorts = true // remove the KUBE-FIREWALL hooks too, if any
	have := map[string][]string{}
	for _, table := range []string{"filter", "nat", "mangle"} {
		chains, err := r.Chains(table)
		if err != nil {
			errs = append(errs, err)
		}
		have[table] = chains
	}
	for _, j := range Jumps(o) {
		// A jump to a chain that does not exist cannot exist either; not
		// asking keeps an unused legacy table from being loaded.
		if !slices.Contains(have[j.Table], target(j.Args)) {
			continue
		}
		if err := r.DeleteRule(j.Table, j.Chain, j.Args...); err != nil {
			errs = append(errs, err)
		}
	}
	ours := map[string][]string{
		"nat":    {ChainServices, ChainNodePorts, ChainPostrouting, ChainMarkMasq, ChainCanary},
		"filter": {ChainServices, ChainExternalServices, ChainForward, ChainNodePorts, ChainProxyFirewall, ChainCanary, ChainFirewall},
		"mangle": {ChainCanary},
	}
	for _, table := range []string{"filter", "nat", "mangle"} {
		existing := have[table]
		var del []string
		for _, c := range existing {
			if slices.Contains(ours[table], c) || (table == "nat" && IsServiceChain(c)) {
				del = append(del, c)
			}
		}
		if len(del) == 0 {
			continue
		}
		var b strings.Builder
		b.WriteString("*" + table + "\n")
		for _, c := range del {
			b.WriteString(":" + c + " - [0:0]\n")
		}
		for _, c := range del {
			b.WriteString("-X " + c + "\n")
		}
		b.WriteString("COMMIT\n")
		if err := r.Restore([]byte(b.String())); err != nil {
			errs = append(errs, fmt.Errorf("remove %s chains: %w", table, err))
		}
	}
	return errors.Join(errs...)
}
