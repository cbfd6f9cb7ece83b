package iptables

import (
	"bytes"
	"fmt"
	"slices"
	"strings"
	"testing"
)

// builtinRules is a Fake's built-in chains' rules and its canaries, as
// text: where the jumps are.
func builtinRules(t *testing.T, r Runner) string {
	t.Helper()
	var b strings.Builder
	for _, table := range []string{"filter", "nat", "mangle"} {
		out, err := r.Save(table)
		if err != nil {
			t.Fatal(err)
		}
		st, err := parseSave(table, out)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&b, "*%s canary=%v\n", table, st.has(ChainCanary))
		for _, c := range builtinChains[table] {
			for _, r := range st.rules[c] {
				fmt.Fprintf(&b, "-A %s %s\n", c, strings.Join(r, " "))
			}
		}
	}
	return b.String()
}

// byCommands hooks the chains in as kube-proxy does, one command each
// (the way sluice did before its restore carried them): the reference.
func byCommands(t *testing.T, r Runner, o Options) {
	t.Helper()
	for _, j := range Jumps(o) {
		if err := r.EnsureChain(j.Table, target(j.Args)); err != nil {
			t.Fatal(err)
		}
		if err := r.EnsureRule(j.Table, j.Chain, j.Args...); err != nil {
			t.Fatal(err)
		}
	}
	for _, table := range CanaryTables {
		if err := r.EnsureChain(table, ChainCanary); err != nil {
			t.Fatal(err)
		}
	}
}

// recordingRunner keeps what a sync asked of its runner.
type recordingRunner struct {
	countingRunner
	restores [][]byte
}

func (r *recordingRunner) Restore(d []byte) error {
	r.restores = append(r.restores, bytes.Clone(d))
	return r.countingRunner.Restore(d)
}

// A full sync hooks sluice's chains in with its own restore: onto empty
// tables, the jumps and canaries the commands would have made, in the
// same order; on a restart with them in place, not a line of them; a
// jump or canary removed by hand comes back where EnsureRule puts it
// (issue 18: at 1k services on legacy these commands were 1.5 s of a
// restart's 2.4 s full sync).
func TestFullSyncHooksInWithItsRestore(t *testing.T) {
	o := opts()
	ref := NewFake()
	byCommands(t, ref, o)
	want := builtinRules(t, ref)

	f := NewFake()
	r := &recordingRunner{countingRunner: countingRunner{Runner: f}}
	if err := (&Proxier{Runner: r, Options: o}).Sync(freshState(3)); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(r.ran, ","); got != "save nat,save filter,save mangle,restore" {
		t.Fatalf("first sync ran %s; want the tables read and one restore", got)
	}
	if got := builtinRules(t, f); got != want {
		t.Fatalf("first sync's hooks:\n%s\nwant (the commands'):\n%s", got, want)
	}

	// A restart: everything in place, so nothing added.
	r.ran, r.restores = nil, nil
	if err := (&Proxier{Runner: r, Options: o}).Sync(freshState(3)); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(r.ran, ","); got != "save nat,save filter,save mangle,restore" {
		t.Fatalf("restart ran %s", got)
	}
	if d := r.restores[0]; bytes.Contains(d, []byte("\n-I ")) || bytes.Contains(d, []byte(ChainCanary)) || bytes.Contains(d, []byte("*mangle")) {
		t.Fatalf("restart's restore adds hooks that are in place:\n%s", d)
	}
	if got := builtinRules(t, f); got != want {
		t.Fatalf("after the restart:\n%s\nwant:\n%s", got, want)
	}

	// A middle jump and the mangle canary removed by hand; the reference
	// loses the same and the commands put them back.
	j := Jumps(o)[3]
	for _, x := range []Runner{f, ref} {
		if err := x.DeleteRule(j.Table, j.Chain, j.Args...); err != nil {
			t.Fatal(err)
		}
		if err := x.DeleteChain("mangle", ChainCanary); err != nil {
			t.Fatal(err)
		}
	}
	byCommands(t, ref, o)
	r.ran = nil
	if err := (&Proxier{Runner: r, Options: o}).Sync(freshState(3)); err != nil {
		t.Fatal(err)
	}
	if got, want := builtinRules(t, f), builtinRules(t, ref); got != want {
		t.Fatalf("after a jump and a canary were removed:\n%s\nwant:\n%s", got, want)
	}
	if slices.ContainsFunc(r.ran, func(s string) bool { return strings.HasPrefix(s, "-") }) {
		t.Fatalf("ran %v; the restore was enough", r.ran)
	}
}

// A built-in chain that holds another rule to the same chain (another
// version's jump, or one printed otherwise than sluice writes it) is left
// to EnsureRule, which compares as the kernel does: the restore never
// writes a jump twice.
func TestAnotherJumpToTheSameChainIsLeftToEnsureRule(t *testing.T) {
	o := opts()
	f := NewFake()
	if err := f.Restore([]byte("*nat\n:KUBE-SERVICES - [0:0]\n-A PREROUTING -m comment --comment \"older portals\" -j KUBE-SERVICES\nCOMMIT\n")); err != nil {
		t.Fatal(err)
	}
	r := &recordingRunner{countingRunner: countingRunner{Runner: f}}
	if err := (&Proxier{Runner: r, Options: o}).Sync(freshState(2)); err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(r.ran, "-C PREROUTING") {
		t.Fatalf("ran %v; want EnsureRule for PREROUTING", r.ran)
	}
	if bytes.Contains(r.restores[0], []byte("-I PREROUTING")) {
		t.Fatalf("the restore inserts the PREROUTING jump too:\n%s", r.restores[0])
	}
	out, _ := f.Save("nat")
	st, _ := parseSave("nat", out)
	if n := len(st.rules["PREROUTING"]); n != 2 {
		t.Fatalf("PREROUTING holds %d rules, want the older one and sluice's: %v", n, st.rules["PREROUTING"])
	}
}

// The render puts a plan's declarations after a block's header and its
// inserts before the block's COMMIT, quoting as a restore needs, and gives
// a table it does not write a block of its own; everything else is as
// without the plan.
func TestRenderWritesTheHookPlan(t *testing.T) {
	p := hookPlan{
		declares: map[string][]string{"filter": {ChainCanary}, "mangle": {ChainCanary}},
		inserts: map[string][]Jump{"nat": {
			{Table: "nat", Chain: "OUTPUT", Args: []string{"-m", "comment", "--comment", "kubernetes service portals", "-j", "KUBE-SERVICES"}},
			{Table: "nat", Chain: "PREROUTING", Args: []string{"-j", "KUBE-SERVICES"}},
		}},
	}
	snap := freshState(3)
	plain := string(renderPartial(snap, opts(), nil, nil, false, nil, hookPlan{}).data)
	got := string(renderPartial(snap, opts(), nil, nil, false, nil, p).data)
	inserts := "-I OUTPUT -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n-I PREROUTING -j KUBE-SERVICES\n"
	if !strings.HasPrefix(got, "*filter\n:KUBE-PROXY-CANARY - [0:0]\n") {
		t.Fatalf("the filter canary is not declared after the header:\n%s", got)
	}
	if !strings.HasSuffix(got, inserts+"COMMIT\n*mangle\n:KUBE-PROXY-CANARY - [0:0]\nCOMMIT\n") {
		t.Fatalf("the nat inserts do not end the nat block, or no mangle block:\n%s", got)
	}
	without := strings.Replace(got, ":KUBE-PROXY-CANARY - [0:0]\n", "", 1)
	without = strings.Replace(without, inserts, "", 1)
	without = strings.TrimSuffix(without, "*mangle\n:KUBE-PROXY-CANARY - [0:0]\nCOMMIT\n")
	if without != plain {
		t.Fatalf("the plan changed more than its lines:\n%s\nwithout it:\n%s", got, plain)
	}
	// A partial sync that leaves the filter table out still writes the
	// plan's filter lines, in a block of their own.
	var b bytes.Buffer
	p.block(&b, "filter")
	if b.String() != "*filter\n:KUBE-PROXY-CANARY - [0:0]\nCOMMIT\n" {
		t.Fatalf("filter block: %q", b.String())
	}
	b.Reset()
	p.block(&b, "raw")
	if b.Len() != 0 {
		t.Fatalf("a block for a table with no lines: %q", b.String())
	}
}
