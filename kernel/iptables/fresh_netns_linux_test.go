package iptables

import (
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/sluice-proxy/sluice/kernel/netnstest"
)

// savedTables is iptables-save's filter and nat tables as the rules of
// each chain in order, chains sorted, without counters or comments on the
// save's own lines: what a test compares between two ways of writing the
// same rules.
func savedTables(cmd string) (string, error) {
	var chains []string
	rules := map[string][]string{}
	for _, table := range []string{"filter", "nat"} {
		out, err := exec.Command(cmd+"-save", "-t", table).Output()
		if err != nil {
			return "", fmt.Errorf("%s-save -t %s: %w", cmd, table, err)
		}
		for _, l := range strings.Split(string(out), "\n") {
			switch {
			case strings.HasPrefix(l, ":"):
				name := table + " " + strings.Fields(l[1:])[0]
				chains = append(chains, name)
				rules[name] = rules[name][:0:0]
			case strings.HasPrefix(l, "-A "):
				name := table + " " + strings.Fields(l)[1]
				rules[name] = append(rules[name], l)
			}
		}
	}
	slices.Sort(chains)
	var b strings.Builder
	for _, c := range chains {
		b.WriteString(":" + c + "\n")
		for _, r := range rules[c] {
			b.WriteString(r + "\n")
		}
	}
	return b.String(), nil
}

// On both real backends, in a private network namespace: a first sync
// written in batches leaves the tables one restore leaves, and partial
// syncs go on from it. The real restore refuses what the fake may not.
func TestFreshBatchesOnRealIPTables(t *testing.T) {
	for _, cmd := range []string{"iptables-nft", "iptables-legacy"} {
		t.Run(cmd, func(t *testing.T) {
			netnstest.Need(t, cmd, cmd+"-restore", cmd+"-save")
			netnstest.Run(t, func() error {
				r := &Exec{Command: cmd}
				s := freshState(25)
				var want string
				for _, batch := range []int{-1, 4} {
					if err := Cleanup(r, opts()); err != nil {
						return err
					}
					p := &Proxier{Runner: r, Options: opts(), FreshBatch: batch}
					if err := p.Sync(s); err != nil {
						return fmt.Errorf("FreshBatch %d: %w", batch, err)
					}
					got, err := savedTables(cmd)
					if err != nil {
						return err
					}
					if batch < 0 {
						want = got
						continue
					}
					if got != want {
						return fmt.Errorf("batched tables differ from one restore's:\n%s\nwant:\n%s", got, want)
					}
					if st, err := p.SyncStats(freshState(24)); err != nil || st.Full {
						return fmt.Errorf("partial sync after the batched one: %+v %v", st, err)
					}
				}
				return Cleanup(r, opts())
			})
		})
	}
}
