package iptables

import (
	"bufio"
	"bytes"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
)

var builtinChains = map[string][]string{
	"filter": {"INPUT", "FORWARD", "OUTPUT"},
	"nat":    {"PREROUTING", "INPUT", "OUTPUT", "POSTROUTING"},
	"mangle": {"PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"},
	"raw":    {"PREROUTING", "OUTPUT"},
}

var builtinTargets = map[string]bool{"ACCEPT": true, "DROP": true, "REJECT": true, "RETURN": true, "MARK": true,
	"MASQUERADE": true, "DNAT": true, "SNAT": true, "REDIRECT": true}

// Fake is a stateful iptables for one family: it parses iptables-restore
// input, keeps the tables, and refuses what the kernel would refuse (a rule
// in a missing chain, a jump to a missing chain, deleting a chain that is
// still referenced or built in), leaving a table untouched when its
// transaction fails. Trace follows a packet through the nat rules.
type Fake struct {
	mu     sync.Mutex
	tables map[string]map[string][][]string // table -> chain -> rules (args)
}

// NewFake returns a Fake with the built-in chains of each table.
func NewFake() *Fake {
	f := &Fake{tables: map[string]map[string][][]string{}}
	for t, cs := range builtinChains {
		f.tables[t] = map[string][][]string{}
		for _, c := range cs {
			f.tables[t][c] = nil
		}
	}
	return f
}

// split splits a rule line as a shell would, honouring double quotes.
func split(line string) ([]string, error) {
	var out []string
	var cur strings.Builder
	inQuote, have := false, false
	for i := 0; i < len(line); i++ {
		c := line[i]
		switch {
		case c == '\\' && inQuote && i+1 < len(line):
			i++
			cur.WriteByte(line[i])
		case c == '"':
			inQuote, have = !inQuote, true
		case c == ' ' && !inQuote:
			if have {
				out = append(out, cur.String())
				cur.Reset()
				have = false
			}
		default:
			cur.WriteByte(c)
			have = true
		}
	}
	if inQuote {
		return nil, fmt.Errorf("unterminated quote")
	}
	if have {
		out = append(out, cur.String())
	}
	return out, nil
}

func cloneTable(t map[string][][]string) map[string][][]string {
	out := make(map[string][][]string, len(t))
	for c, rules := range t {
		out[c] = slices.Clone(rules)
	}
	return out
}

func isBuiltin(table, chain string) bool { return slices.Contains(builtinChains[table], chain) }

func target(args []string) string {
	for i, a := range args {
		if (a == "-j" || a == "-g") && i+1 < len(args) {
			return args[i+1]
		}
	}
	return ""
}

// natToPort reports whether a rule's NAT target names a port, which the
// kernel accepts only with a protocol match.
func natToPort(tg string, r []string) bool {
	switch tg {
	case "REDIRECT":
		return slices.Contains(r, "--to-ports")
	case "DNAT":
		to := argAfter(r, "--to-destination")
		if strings.HasPrefix(to, "[") {
			return strings.Contains(to, "]:")
		}
		return strings.Count(to, ":") == 1
	}
	return false
}

// validate checks every jump of a table after a transaction.
func validate(table string, t map[string][][]string) error {
	for c, rules := range t {
		for _, r := range rules {
			tg := target(r)
			if (tg == "DNAT" || tg == "REDIRECT" || tg == "MASQUERADE" || tg == "SNAT") && table != "nat" {
				return fmt.Errorf("table %s: chain %s: target %s is only valid in the nat table", table, c, tg)
			}
			if natToPort(tg, r) && !slices.Contains(r, "-p") {
				return fmt.Errorf("table %s: chain %s: %s to a port needs -p tcp, udp or sctp", table, c, tg)
			}
			if tg == "" || builtinTargets[tg] {
				continue
			}
			if _, ok := t[tg]; !ok {
				return fmt.Errorf("table %s: chain %s: jump to missing chain %s", table, c, tg)
			}
		}
	}
	return nil
}

// Restore applies iptables-restore --noflush input, one table transaction
// at a time, as the kernel does.
func (f *Fake) Restore(data []byte) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	var table string
	var work map[string][][]string
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 1<<20), 1<<26)
	n := 0
	for sc.Scan() {
		n++
		line := strings.TrimSpace(sc.Text())
		fail := func(format string, a ...any) error {
			return fmt.Errorf("iptables-restore: line %d (%q): %s", n, line, fmt.Sprintf(format, a...))
		}
		switch {
		case line == "" || strings.HasPrefix(line, "#"):
		case strings.HasPrefix(line, "*"):
			if work != nil {
				return fail("table %s not committed", table)
			}
			table = line[1:]
			t, ok := f.tables[table]
			if !ok {
				return fail("unknown table %s", table)
			}
			work = cloneTable(t)
		case line == "COMMIT":
			if work == nil {
				return fail("COMMIT outside a table")
			}
			if err := validate(table, work); err != nil {
				return fail("%v", err)
			}
			f.tables[table] = work
			work = nil
		case work == nil:
			return fail("rule outside a table")
		case strings.HasPrefix(line, ":"):
			name := strings.Fields(line[1:])[0]
			if len(name) > 28 {
				return fail("chain name %s longer than 28 characters", name)
			}
			work[name] = nil // created, or flushed (--noflush flushes only declared chains)
		default:
			args, err := split(line)
			if err != nil {
				return fail("%v", err)
			}
			if len(args) < 2 {
				return fail("bad rule")
			}
			switch args[0] {
			case "-A":
				if _, ok := work[args[1]]; !ok {
					return fail("chain %s does not exist", args[1])
				}
				work[args[1]] = append(work[args[1]], args[2:])
			case "-I":
				if _, ok := work[args[1]]; !ok {
					return fail("chain %s does not exist", args[1])
				}
				work[args[1]] = append([][]string{args[2:]}, work[args[1]]...)
			case "-X":
				if isBuiltin(table, args[1]) {
					return fail("cannot delete built-in chain %s", args[1])
				}
				if _, ok := work[args[1]]; !ok {
					return fail("chain %s does not exist", args[1])
				}
				if len(work[args[1]]) > 0 {
					return fail("chain %s is not empty", args[1])
				}
				for c, rules := range work {
					for _, r := range rules {
						if target(r) == args[1] {
							return fail("chain %s is still referenced from %s", args[1], c)
						}
					}
				}
				delete(work, args[1])
			default:
				return fail("unsupported command %s", args[0])
			}
		}
	}
	if work != nil {
		return fmt.Errorf("iptables-restore: table %s not committed", table)
	}
	return nil
}

// Chains lists a table's chains, sorted.
func (f *Fake) Chains(table string) ([]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for c := range f.tables[table] {
		out = append(out, c)
	}
	slices.Sort(out)
	return out, nil
}

// Save prints a table as iptables-save does: its chains (built-in ones
// with a policy), then its rules, arguments quoted where they need it.
func (f *Fake) Save(table string) ([]byte, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	t, ok := f.tables[table]
	if !ok {
		return nil, fmt.Errorf("table %s: %w", table, ErrNotFound)
	}
	chains := make([]string, 0, len(t))
	for c := range t {
		chains = append(chains, c)
	}
	slices.Sort(chains)
	var b strings.Builder
	fmt.Fprintf(&b, "*%s\n", table)
	for _, c := range chains {
		policy := "-"
		if isBuiltin(table, c) {
			policy = "ACCEPT"
		}
		fmt.Fprintf(&b, ":%s %s [0:0]\n", c, policy)
	}
	for _, c := range chains {
		for _, r := range t[c] {
			b.WriteString("-A " + c)
			for _, a := range r {
				b.WriteString(" " + restoreArg(a))
			}
			b.WriteByte('\n')
		}
	}
	b.WriteString("COMMIT\n")
	return []byte(b.String()), nil
}

// EnsureChain creates a chain if missing.
func (f *Fake) EnsureChain(table, chain string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.tables[table][chain]; !ok {
		f.tables[table][chain] = nil
	}
	return nil
}

// EnsureRule inserts a rule at the top of a chain unless it is there.
func (f *Fake) EnsureRule(table, chain string, args ...string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	rules, ok := f.tables[table][chain]
	if !ok {
		return fmt.Errorf("chain %s in table %s: %w", chain, table, ErrNotFound)
	}
	if tg := target(args); tg != "" && !builtinTargets[tg] {
		if _, ok := f.tables[table][tg]; !ok {
			return fmt.Errorf("jump to missing chain %s: %w", tg, ErrNotFound)
		}
	}
	for _, r := range rules {
		if slices.Equal(r, args) {
			return nil
		}
	}
	f.tables[table][chain] = append([][]string{slices.Clone(args)}, rules...)
	return nil
}

// DeleteRule deletes the first equal rule; a missing one is fine.
func (f *Fake) DeleteRule(table, chain string, args ...string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	rules := f.tables[table][chain]
	for i, r := range rules {
		if slices.Equal(r, args) {
			f.tables[table][chain] = slices.Delete(slices.Clone(rules), i, i+1)
			return nil
		}
	}
	return nil
}

// DeleteChain flushes and deletes a chain, refusing a built-in or still
// referenced one; a missing chain is fine.
func (f *Fake) DeleteChain(table, chain string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if isBuiltin(table, chain) {
		return fmt.Errorf("cannot delete built-in chain %s", chain)
	}
	if _, ok := f.tables[table][chain]; !ok {
		return nil
	}
	for c, rules := range f.tables[table] {
		if c == chain {
			continue
		}
		for _, r := range rules {
			if target(r) == chain {
				return fmt.Errorf("chain %s is still referenced from %s", chain, c)
			}
		}
	}
	delete(f.tables[table], chain)
	return nil
}

// Flush empties every chain of a table and deletes the user-defined ones,
// as a firewall reload does (`iptables -t T -F; iptables -t T -X`).
func (f *Fake) Flush(table string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	t := map[string][][]string{}
	for _, c := range builtinChains[table] {
		t[c] = nil
	}
	f.tables[table] = t
}

// Dump is the whole state, for comparing states in tests.
func (f *Fake) Dump() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var b strings.Builder
	for _, t := range []string{"filter", "mangle", "nat", "raw"} {
		fmt.Fprintf(&b, "*%s\n", t)
		var chains []string
		for c := range f.tables[t] {
			chains = append(chains, c)
		}
		slices.Sort(chains)
		for _, c := range chains {
			fmt.Fprintf(&b, ":%s\n", c)
			for _, r := range f.tables[t][c] {
				fmt.Fprintf(&b, "-A %s %s\n", c, strings.Join(r, " "))
			}
		}
	}
	return b.String()
}

// Packet is what Trace matches on.
type Packet struct {
	Src, Dst netip.Addr
	Proto    string // tcp, udp, sctp
	DPort    uint16
	// Local reports whether an address belongs to the node (addrtype LOCAL).
	Local func(netip.Addr) bool
}

// Outcome is one way a packet can leave the rules: DNATed to an endpoint
// (with or without the masquerade mark), or rejected, dropped, or
// untouched (Verdict "" and no DNAT).
type Outcome struct {
	Verdict string // "REJECT", "DROP", or "" when the packet goes on
	DNAT    netip.AddrPort
	// Redirect is the port a REDIRECT sent the packet to, on this host.
	Redirect uint16
	Masq     bool
}

// Trace follows a packet as the kernel does: through the nat table from a
// built-in chain ("PREROUTING" or "OUTPUT"), then, with the destination the
// nat table gave it, through the filter table's chains on the same path
// (INPUT and FORWARD for PREROUTING, OUTPUT for OUTPUT), whose REJECT or
// DROP wins. Where a rule matches at random (statistic) or by history
// (recent), both branches are followed, so the result is the set of
// possible outcomes, sorted and without duplicates.
func (f *Fake) Trace(hook string, p Packet) []Outcome {
	f.mu.Lock()
	defer f.mu.Unlock()
	if p.Local == nil {
		p.Local = func(netip.Addr) bool { return false }
	}
	filterChains := map[string][]string{"PREROUTING": {"INPUT", "FORWARD"}, "OUTPUT": {"OUTPUT"}}[hook]
	var out []Outcome
	for _, o := range f.walk("nat", hook, p, state{}, 0) {
		after := p
		if o.DNAT.IsValid() {
			after.Dst, after.DPort = o.DNAT.Addr(), o.DNAT.Port()
		}
		verdict := ""
		for _, fc := range filterChains {
			for _, fo := range f.walk("filter", fc, after, state{}, 0) {
				if fo.Verdict != "" && verdict == "" {
					verdict = fo.Verdict
				}
			}
		}
		if verdict != "" {
			o = Outcome{Verdict: verdict}
		}
		out = append(out, o)
	}
	slices.SortFunc(out, func(a, b Outcome) int {
		return strings.Compare(fmt.Sprint(a), fmt.Sprint(b))
	})
	return slices.Compact(out)
}

type state struct{ masq bool }

// walk evaluates one chain and returns the possible outcomes; an outcome
// with returned set means the chain fell through (or RETURNed).
func (f *Fake) walk(table, chain string, p Packet, st state, depth int) []Outcome {
	if depth > 32 {
		return []Outcome{{Verdict: "LOOP"}}
	}
	var results []Outcome
	type branch struct {
		st  state
		idx int
	}
	queue := []branch{{st, 0}}
	for len(queue) > 0 {
		br := queue[0]
		queue = queue[1:]
		rules := f.tables[table][chain]
		done := false
		for i := br.idx; i < len(rules) && !done; i++ {
			m, maybe := match(rules[i], p, br.st)
			if !m {
				continue
			}
			if maybe {
				queue = append(queue, branch{br.st, i + 1}) // the branch where it did not match
			}
			tg := target(rules[i])
			switch tg {
			case "":
			case "RETURN":
				results = append(results, Outcome{Masq: br.st.masq, Verdict: "fallthrough"})
				done = true
			case "REJECT", "DROP", "ACCEPT":
				v := tg
				if tg == "ACCEPT" {
					v = ""
				}
				results = append(results, Outcome{Verdict: v, Masq: br.st.masq})
				done = true
			case "MARK":
				if table == "nat" && chain == ChainMarkMasq {
					br.st.masq = true
				}
			case "DNAT":
				to := argAfter(rules[i], "--to-destination")
				ap, err := netip.ParseAddrPort(to)
				if err != nil {
					results = append(results, Outcome{Verdict: "BAD-DNAT " + to})
				} else {
					results = append(results, Outcome{DNAT: ap, Masq: br.st.masq})
				}
				done = true
			case "REDIRECT":
				port, _ := strconv.ParseUint(argAfter(rules[i], "--to-ports"), 10, 16)
				results = append(results, Outcome{Redirect: uint16(port), Masq: br.st.masq})
				done = true
			case "MASQUERADE", "SNAT":
				done = true
			default:
				sub := f.walk(table, tg, p, br.st, depth+1)
				var fell []Outcome
				for _, o := range sub {
					if o.Verdict == "fallthrough" {
						fell = append(fell, o)
					} else {
						results = append(results, o)
					}
				}
				if len(fell) == 0 {
					done = true
					break
				}
				// Continue after the jump for each way the callee fell through.
				for _, o := range fell[1:] {
					queue = append(queue, branch{state{masq: o.Masq}, i + 1})
				}
				br.st.masq = fell[0].Masq
			}
		}
		if !done {
			results = append(results, Outcome{Masq: br.st.masq, Verdict: "fallthrough"})
		}
	}
	if isBuiltin(table, chain) {
		for i, o := range results {
			if o.Verdict == "fallthrough" {
				results[i].Verdict = ""
			}
		}
	}
	return results
}

func argAfter(args []string, flag string) string {
	for i, a := range args {
		if a == flag && i+1 < len(args) {
			return args[i+1]
		}
	}
	return ""
}

func addrMatch(spec string, a netip.Addr) bool {
	if pfx, err := netip.ParsePrefix(spec); err == nil {
		return pfx.Contains(a)
	}
	b, err := netip.ParseAddr(spec)
	return err == nil && b == a
}

// match reports whether a rule matches p; maybe is set when it matches
// only sometimes (statistic, recent), so the caller follows both ways.
func match(args []string, p Packet, st state) (ok, maybe bool) {
	neg := false
	for i := 0; i < len(args); i++ {
		a := args[i]
		next := func() string {
			i++
			if i < len(args) {
				return args[i]
			}
			return ""
		}
		res := true
		checked := true
		switch a {
		case "!":
			neg = true
			continue
		case "-j", "-g":
			return true, maybe
		case "-m":
			next()
			checked = false
		case "--comment", "--name", "--seconds", "--mode":
			next()
			checked = false
		case "--ctstate": // a traced packet is always a new connection
			res = strings.Contains(next(), "NEW")
		case "--reap", "--set":
			checked = false
		case "--rcheck", "--probability":
			if a == "--probability" {
				next()
			}
			maybe = true
			checked = false
		case "-p":
			res = next() == p.Proto
		case "-d":
			res = addrMatch(next(), p.Dst)
		case "-s":
			res = addrMatch(next(), p.Src)
		case "--dport":
			res = next() == fmt.Sprint(p.DPort)
		case "--dst-type":
			res = next() == "LOCAL" && p.Local(p.Dst)
		case "--src-type":
			res = next() == "LOCAL" && p.Local(p.Src)
		case "--mark":
			next()
			res = st.masq
		default:
			checked = false
		}
		if checked && res == neg {
			return false, false
		}
		neg = false
	}
	return true, maybe
}
