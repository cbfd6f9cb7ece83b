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
	// declare are the canary chains missing from each table.
	declare map[string][]string
	// insert are the jumps missing from each table, in Jumps' order: each
	// inserted at the top of its chain, as EnsureRule does, so the last
	// one ends first.
	insert map[string][]Jump
	// ensure are the jumps the saved table cannot settle: their chain
	// holds another rule to the same target (another version's jump, or a
	// rule iptables-save prints otherwise than sluice writes it). EnsureRule
	// decides, with the kernel's own comparison.
	ensure []Jump
}

// planHooks compares Jumps(o) and the canaries with the saved tables.
func planHooks(o Options, tables map[string]*savedTable) hookPlan {
	p := hookPlan{declare: map[string][]string{}, insert: map[string][]Jump{}}
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
			p.insert[j.Table] = append(p.insert[j.Table], j)
		}
	}
	for _, table := range CanaryTables {
		if t := tables[table]; t == nil || !t.has(ChainCanary) {
			p.declare[table] = append(p.declare[table], ChainCanary)
		}
	}
	return p
}

// empty reports whether the plan adds nothing to the restore.
func (p hookPlan) empty() bool { return len(p.declare) == 0 && len(p.insert) == 0 }

// restoreArg is one argument as a restore line writes it.
func restoreArg(a string) string {
	if a == "" || strings.ContainsAny(a, " \t\"\\'") {
		return quote(a)
	}
	return a
}

// splice returns data with the plan's lines in it: in each table's block
// the declarations after its header and the inserts before its COMMIT,
// and a block of its own for a table data does not write (mangle, for
// its canary).
func (p hookPlan) splice(data []byte) []byte {
	if p.empty() {
		return data
	}
	var out bytes.Buffer
	out.Grow(len(data) + 4096)
	declare := func(table string) {
		for _, c := range p.declare[table] {
			out.WriteString(":" + c + " - [0:0]\n")
		}
	}
	insert := func(table string) {
		for _, j := range p.insert[table] {
			out.WriteString("-I " + j.Chain)
			for _, a := range j.Args {
				out.WriteString(" " + restoreArg(a))
			}
			out.WriteByte('\n')
		}
	}
	// A block runs from its "*table" line to its "COMMIT" line; no rule
	// line is "COMMIT", so the first after the header ends it. Copied in
	// bulk: at 10k services data is tens of megabytes.
	seen := map[string]bool{}
	for len(data) > 0 {
		if data[0] != '*' {
			out.Write(data) // not a block (a restore always is one)
			break
		}
		head, rest, _ := bytes.Cut(data, []byte{'\n'})
		table := string(head[1:])
		seen[table] = true
		out.Write(head)
		out.WriteByte('\n')
		declare(table)
		end := 0
		if !bytes.HasPrefix(rest, []byte("COMMIT\n")) {
			i := bytes.Index(rest, []byte("\nCOMMIT\n"))
			if i < 0 {
				out.Write(rest) // unterminated: the restore will say so
				break
			}
			end = i + 1
		}
		out.Write(rest[:end])
		insert(table)
		out.WriteString("COMMIT\n")
		data = rest[end+len("COMMIT\n"):]
	}
	for _, t := range []string{"filter", "nat", "mangle"} {
		if seen[t] || (len(p.declare[t]) == 0 && len(p.insert[t]) == 0) {
			continue
		}
		out.WriteString("*" + t + "\n")
		declare(t)
		insert(t)
		out.WriteString("COMMIT\n")
	}
	return out.Bytes()
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
