package iptables

import (
	"bufio"
	"bytes"
	"fmt"
	"slices"
	"strings"
)

// savedTable is what a full sync reads of one table from iptables-save:
// its chains, and the rules of its built-in chains (where the jumps are).
type savedTable struct {
	chains []string
	rules  map[string][][]string // built-in chain -> its rules' arguments
}

func (t *savedTable) has(chain string) bool { return slices.Contains(t.chains, chain) }

// parseSave reads one table of iptables-save's output. Only the built-in
// chains' rules are split into arguments: the service chains, most of a
// large nat table, are only counted as chains.
func parseSave(table string, out []byte) (*savedTable, error) {
	t := &savedTable{rules: map[string][][]string{}}
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 64<<10), 1<<24)
	for sc.Scan() {
		l := sc.Text()
		switch {
		case strings.HasPrefix(l, ":"):
			if f := strings.Fields(l[1:]); len(f) > 0 {
				t.chains = append(t.chains, f[0])
			}
		case strings.HasPrefix(l, "-A "):
			chain, rest, _ := strings.Cut(l[3:], " ")
			if !isBuiltin(table, chain) {
				continue
			}
			args, err := split(rest)
			if err != nil {
				return nil, fmt.Errorf("%s table, chain %s: %q: %w", table, chain, l, err)
			}
			t.rules[chain] = append(t.rules[chain], args)
		}
	}
	return t, sc.Err()
}

// hookPlan is what a full sync adds to its restore so that the built-in
// chains jump to sluice's, and the canaries exist, decided from the tables
// as iptables-save showed them just before: the jumps and canaries
// kube-proxy ensures with one iptables command each (-N, -C, -I) on every
// full sync. On the legacy backend each of those commands reads and
// writes the whole table: at 1,000 services a restart's full sync spent
// 1.5 s of its 2.4 s in them (bench sync, full-resync), where the restore
// alone took 0.9 s. Here they cost nothing when in place, and are lines of
// the sync's own restore when missing.
type hookPlan struct {
	// declares are the canary chains missing from each table.
	declares map[string][]string
	// inserts are the jumps missing from each table, in Jumps' order: each
	// inserted at the top of its chain, as EnsureRule does, so the last
	// one ends first.
	inserts map[string][]Jump
	// ensure are the jumps the saved table cannot settle: their chain
	// holds another rule to the same target (another version's jump, or a
	// rule iptables-save prints otherwise than sluice writes it). EnsureRule
	// decides, with the kernel's own comparison.
	ensure []Jump
}

// planHooks compares Jumps(o) and the canaries with the saved tables.
func planHooks(o Options, tables map[string]*savedTable) hookPlan {
	p := hookPlan{declares: map[string][]string{}, inserts: map[string][]Jump{}}
	for _, j := range Jumps(o) {
		t := tables[j.Table]
		if t == nil {
			t = &savedTable{}
		}
		rules := t.rules[j.Chain]
		switch {
		case slices.ContainsFunc(rules, func(r []string) bool { return slices.Equal(r, j.Args) }):
		case slices.ContainsFunc(rules, func(r []string) bool { return target(r) == target(j.Args) }):
			p.ensure = append(p.ensure, j)
		default:
			p.inserts[j.Table] = append(p.inserts[j.Table], j)
		}
	}
	for _, table := range CanaryTables {
		if t := tables[table]; t == nil || !t.has(ChainCanary) {
			p.declares[table] = append(p.declares[table], ChainCanary)
		}
	}
	return p
}

// restoreArg is one argument as a restore line writes it.
func restoreArg(a string) string {
	if a == "" || strings.ContainsAny(a, " \t\"\\'") {
		return quote(a)
	}
	return a
}

// The render writes a plan's lines where they go, in the restore it
// builds (no copy of it: at 10k services splicing them into the finished
// restore took 89 ms and 36 MB): in each table's block the declarations
// after its header and the inserts before its COMMIT, and a block of
// their own for a table the restore does not write (mangle, for its
// canary).

// declare writes the chain declarations of table.
func (p hookPlan) declare(b *bytes.Buffer, table string) {
	for _, c := range p.declares[table] {
		b.WriteString(":" + c + " - [0:0]\n")
	}
}

// insert writes the jumps to insert into table.
func (p hookPlan) insert(b *bytes.Buffer, table string) {
	for _, j := range p.inserts[table] {
		b.WriteString("-I " + j.Chain)
		for _, a := range j.Args {
			b.WriteString(" " + restoreArg(a))
		}
		b.WriteByte('\n')
	}
}

// block writes a block of table's lines alone, if it has any.
func (p hookPlan) block(b *bytes.Buffer, table string) {
	if len(p.declares[table]) == 0 && len(p.inserts[table]) == 0 {
		return
	}
	b.WriteString("*" + table + "\n")
	p.declare(b, table)
	p.insert(b, table)
	b.WriteString("COMMIT\n")
}

// readTables reads the tables the jumps and canaries live in, one
// iptables-save each.
func (p *Proxier) readTables() (map[string]*savedTable, error) {
	tables := map[string]*savedTable{}
	for _, table := range []string{"nat", "filter", "mangle"} {
		out, err := p.Runner.Save(table)
		if err != nil {
			return nil, fmt.Errorf("list the %s table: %w", table, err)
		}
		t, err := parseSave(table, out)
		if err != nil {
			return nil, fmt.Errorf("read the %s table: %w", table, err)
		}
		tables[table] = t
	}
	return tables, nil
}

// ensureRules runs EnsureRule for the jumps the plan could not settle.
func (p *Proxier) ensureRules(jumps []Jump) error {
	for _, j := range jumps {
		if err := p.Runner.EnsureRule(j.Table, j.Chain, j.Args...); err != nil {
			return fmt.Errorf("hook %s into %s/%s: %w", target(j.Args), j.Table, j.Chain, err)
		}
	}
	return nil
}
