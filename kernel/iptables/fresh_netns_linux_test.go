package iptables

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/sluice-proxy/sluice/kernel/netnstest"
	"github.com/sluice-proxy/sluice/lb"
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
// and a restart's full sync written in batches leave the tables one
// restore leaves, and partial syncs go on from them. The real restore
// refuses what the fake may not.
func TestFullSyncBatchesOnRealIPTables(t *testing.T) {
	for _, cmd := range []string{"iptables-nft", "iptables-legacy"} {
		t.Run(cmd, func(t *testing.T) {
			netnstest.Need(t, cmd, cmd+"-restore", cmd+"-save")
			netnstest.Run(t, func() error {
				// /proc/net is the process's namespace; this thread's is
				// under /proc/thread-self.
				r := &Exec{Command: cmd, ReadFile: func(name string) ([]byte, error) {
					return os.ReadFile(strings.Replace(name, "/proc/net/", "/proc/thread-self/net/", 1))
				}}
				// The tables one restore of s leaves, from empty tables.
				oneRestore := func(s *lb.Snapshot) (string, error) {
					if err := Cleanup(r, opts()); err != nil {
						return "", err
					}
					if err := (&Proxier{Runner: r, Options: opts(), FullSyncBatch: -1}).Sync(s); err != nil {
						return "", fmt.Errorf("one restore: %w", err)
					}
					return savedTables(cmd)
				}
				first, restart := freshState(25), versionState(24, 1)
				wantFirst, err := oneRestore(first)
				if err != nil {
					return err
				}
				wantRestart, err := oneRestore(restart)
				if err != nil {
					return err
				}
				if err := Cleanup(r, opts()); err != nil {
					return err
				}
				// A first sync in batches, a partial sync, then a restart's
				// full sync in batches over the populated tables.
				p := &Proxier{Runner: r, Options: opts(), FullSyncBatch: 4}
				if err := p.Sync(first); err != nil {
					return fmt.Errorf("first sync in batches: %w", err)
				}
				if got, err := savedTables(cmd); err != nil || got != wantFirst {
					return fmt.Errorf("batched tables differ from one restore's (%v):\n%s\nwant:\n%s", err, got, wantFirst)
				}
				if st, err := p.SyncStats(freshState(24)); err != nil || st.Full {
					return fmt.Errorf("partial sync after the batched one: %+v %v", st, err)
				}
				if err := (&Proxier{Runner: r, Options: opts(), FullSyncBatch: 4}).Sync(restart); err != nil {
					return fmt.Errorf("a restart's full sync in batches: %w", err)
				}
				if got, err := savedTables(cmd); err != nil || got != wantRestart {
					return fmt.Errorf("after the restart, tables differ from one restore's (%v):\n%s\nwant:\n%s", err, got, wantRestart)
				}
				return Cleanup(r, opts())
			})
		})
	}
}

// On both real backends: the jumps and canaries a full sync's restore
// writes leave the tables the commands leave (kube-proxy's way, and
// sluice's before), and iptables-save prints them as sluice writes them,
// so a restart's full sync finds every one in place and runs no command
// but the saves and its restore.
func TestFullSyncHooksOnRealIPTables(t *testing.T) {
	for _, cmd := range []string{"iptables-nft", "iptables-legacy"} {
		t.Run(cmd, func(t *testing.T) {
			netnstest.Need(t, cmd, cmd+"-restore", cmd+"-save")
			netnstest.Run(t, func() error {
				var ran []string
				r := &Exec{Command: cmd,
					ReadFile: func(name string) ([]byte, error) {
						return os.ReadFile(strings.Replace(name, "/proc/net/", "/proc/thread-self/net/", 1))
					},
					Run: func(ctx context.Context, name string, args []string, stdin []byte) ([]byte, error) {
						ran = append(ran, name+" "+strings.Join(args, " "))
						return RunCommand(ctx, name, args, stdin)
					}}
				o := opts()
				canaries := func() error {
					for _, table := range CanaryTables {
						chains, err := r.Chains(table)
						if err != nil || !slices.Contains(chains, ChainCanary) {
							return fmt.Errorf("no canary in %s (%v)", table, err)
						}
					}
					return nil
				}
				// The reference: hooks by command, then a sync.
				if err := Cleanup(r, o); err != nil {
					return err
				}
				for _, j := range Jumps(o) {
					if err := r.EnsureChain(j.Table, target(j.Args)); err != nil {
						return err
					}
					if err := r.EnsureRule(j.Table, j.Chain, j.Args...); err != nil {
						return err
					}
				}
				if err := (&Proxier{Runner: r, Options: o}).Sync(freshState(5)); err != nil {
					return fmt.Errorf("sync after the commands: %w", err)
				}
				want, err := savedTables(cmd)
				if err != nil {
					return err
				}
				if err := Cleanup(r, o); err != nil {
					return err
				}
				if err := (&Proxier{Runner: r, Options: o}).Sync(freshState(5)); err != nil {
					return fmt.Errorf("first sync: %w", err)
				}
				if got, err := savedTables(cmd); err != nil || got != want {
					return fmt.Errorf("hooked in by the restore (%v):\n%s\nwant (by the commands):\n%s", err, got, want)
				}
				if err := canaries(); err != nil {
					return err
				}
				ran = nil
				if err := (&Proxier{Runner: r, Options: o}).Sync(freshState(5)); err != nil {
					return fmt.Errorf("restart's full sync: %w", err)
				}
				for _, c := range ran {
					if !strings.Contains(c, "-save ") && !strings.Contains(c, "-restore ") {
						return fmt.Errorf("the restart's full sync ran %q: iptables-save printed a jump otherwise than sluice writes it (all: %q)", c, ran)
					}
				}
				if got, err := savedTables(cmd); err != nil || got != want {
					return fmt.Errorf("after the restart (%v):\n%s\nwant:\n%s", err, got, want)
				}
				if err := canaries(); err != nil {
					return err
				}
				return Cleanup(r, o)
			})
		})
	}
}
