package iptables

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"time"
)

// Runner is what sluice needs of iptables, for one family. Exec runs the
// real binaries; Fake keeps state and refuses what the kernel refuses.
type Runner interface {
	// Restore feeds iptables-restore --noflush --counters: chains declared
	// in data are flushed and rewritten, others are left alone.
	Restore(data []byte) error
	// Chains lists the chains of a table.
	Chains(table string) ([]string, error)
	// Save is the table as iptables-save prints it (chains, then rules);
	// a table that does not exist yet is empty, and not created by asking.
	Save(table string) ([]byte, error)
	// EnsureChain creates a chain if it is missing.
	EnsureChain(table, chain string) error
	// EnsureRule inserts a rule at the top of a chain if it is missing.
	EnsureRule(table, chain string, args ...string) error
	// DeleteRule deletes a rule; a missing rule or chain is not an error.
	DeleteRule(table, chain string, args ...string) error
	// DeleteChain flushes and deletes a chain; a missing one is not an error.
	DeleteChain(table, chain string) error
}

// ErrNotFound is what Exec and Fake return, wrapped, for a missing chain.
var ErrNotFound = errors.New("not found")

// RunFunc runs a command with stdin and returns its combined output.
type RunFunc func(ctx context.Context, name string, args []string, stdin []byte) ([]byte, error)

// RunCommand is the real RunFunc.
func RunCommand(ctx context.Context, name string, args []string, stdin []byte) ([]byte, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	return cmd.CombinedOutput()
}

// Exec runs iptables binaries. Command is the family's and backend's
// binary: iptables, ip6tables, iptables-nft, iptables-legacy,
// ip6tables-nft, ip6tables-legacy; its -restore and -save siblings are used.
type Exec struct {
	Command string
	Run     RunFunc // default RunCommand
	// Timeout bounds the one-rule commands (-C, -N, -I, -D, -X): default
	// one minute.
	Timeout time.Duration
	// RestoreTimeout bounds iptables-restore and iptables-save; 0, the
	// default, is none, as in kube-proxy. Their time grows with the
	// ruleset (a 5,000-Service restore on iptables-nft took 559 s here),
	// and a restore killed for being slow applies nothing, so every later
	// full sync was killed the same way and the node was left with no
	// rules at all (issue 18).
	RestoreTimeout time.Duration
	// ReadFile reads /proc/net/ip{,6}_tables_names for the legacy backend;
	// default os.ReadFile.
	ReadFile func(string) ([]byte, error)

	legacyOnce sync.Once
	legacy     bool

	versionOnce sync.Once
	version     [3]int
}

// Version is the binary's version (iptables v1.8.9 -> [1 8 9]); zero if
// it cannot be told.
func (e *Exec) Version() [3]int {
	e.versionOnce.Do(func() {
		out, err := e.run("", []string{"--version"}, nil)
		if err == nil {
			e.version = parseVersion(string(out))
		}
	})
	return e.version
}

// parseVersion reads "iptables v1.8.9 (nf_tables)".
func parseVersion(s string) [3]int {
	var v [3]int
	i := strings.Index(s, " v")
	if i < 0 {
		return v
	}
	fmt.Sscanf(s[i+2:], "%d.%d.%d", &v[0], &v[1], &v[2])
	return v
}

// HasRandomFully reports whether MASQUERADE takes --random-fully
// (iptables 1.6.2 and later), as kube-proxy checks before using it.
func (e *Exec) HasRandomFully() bool {
	v := e.Version()
	return v[0] > 1 || v[0] == 1 && (v[1] > 6 || v[1] == 6 && v[2] >= 2)
}

// Legacy reports whether Command drives the legacy (x_tables) backend,
// from its name or its --version ("iptables v1.8.9 (legacy)") (Backend).
func (e *Exec) Legacy() bool {
	e.legacyOnce.Do(func() {
		switch {
		case strings.HasSuffix(e.Command, "-legacy"):
			e.legacy = true
		case strings.HasSuffix(e.Command, "-nft"):
		default:
			out, err := e.run("", []string{"--version"}, nil)
			e.legacy = err == nil && strings.Contains(string(out), "legacy")
		}
	})
	return e.legacy
}

// legacyTableLoaded reports whether a legacy table exists in this network
// namespace. Listing it with iptables-legacy-save would load (create) it,
// which would change what iptables-save shows.
func (e *Exec) legacyTableLoaded(table string) bool {
	read := e.ReadFile
	if read == nil {
		read = os.ReadFile
	}
	file := "/proc/net/ip_tables_names"
	if strings.HasPrefix(e.Command, "ip6") {
		file = "/proc/net/ip6_tables_names"
	}
	b, err := read(file)
	if err != nil {
		return false // no table of this family has been loaded
	}
	return slices.Contains(strings.Fields(string(b)), table)
}

func (e *Exec) run(suffix string, args []string, stdin []byte) ([]byte, error) {
	run := e.Run
	if run == nil {
		run = RunCommand
	}
	ctx, cancel := context.Background(), context.CancelFunc(func() {})
	if suffix == "-restore" || suffix == "-save" {
		if e.RestoreTimeout > 0 {
			ctx, cancel = context.WithTimeout(ctx, e.RestoreTimeout)
		}
	} else {
		timeout := e.Timeout
		if timeout == 0 {
			timeout = time.Minute
		}
		ctx, cancel = context.WithTimeout(ctx, timeout)
	}
	defer cancel()
	name := e.Command + suffix
	out, err := run(ctx, name, args, stdin)
	if err != nil {
		if ee := new(exec.Error); errors.As(err, &ee) {
			return out, fmt.Errorf("%s: %w (install iptables, or pick another --proxy-mode)", name, err)
		}
		msg := strings.TrimSpace(string(out))
		if strings.Contains(msg, "No chain/target/match by that name") || strings.Contains(msg, "does not exist") ||
			strings.Contains(msg, "Bad rule (does a matching rule exist") || strings.Contains(msg, "doesn't exist") || strings.Contains(msg, "Couldn't load target") {
			return out, fmt.Errorf("%s %s: %s: %w", name, strings.Join(args, " "), msg, ErrNotFound)
		}
		return out, fmt.Errorf("%s %s: %v: %s", name, strings.Join(args, " "), err, msg)
	}
	return out, nil
}

// Restore runs iptables-restore --noflush --counters with the lock wait
// flags kube-proxy uses. On a parse error the message quotes the line.
func (e *Exec) Restore(data []byte) error {
	out, err := e.run("-restore", []string{"-w", "5", "-W", "100000", "--noflush", "--counters"}, data)
	if err != nil {
		return fmt.Errorf("%w%s", err, restoreContext(out, data))
	}
	return nil
}

// restoreContext quotes the lines around the one iptables-restore names.
func restoreContext(out, data []byte) string {
	var line int
	if _, err := fmt.Sscanf(lastMatch(string(out), "line "), "%d", &line); err != nil || line <= 0 {
		return ""
	}
	lines := strings.Split(string(data), "\n")
	var b strings.Builder
	for i := max(1, line-3); i <= min(len(lines), line+3); i++ {
		mark := "  "
		if i == line {
			mark = "> "
		}
		fmt.Fprintf(&b, "\n%s%d: %s", mark, i, lines[i-1])
	}
	return b.String()
}

func lastMatch(s, prefix string) string {
	i := strings.LastIndex(s, prefix)
	if i < 0 {
		return ""
	}
	return s[i+len(prefix):]
}

// Save runs iptables-save for one table. A legacy table that was never
// loaded is empty, and is not loaded by asking.
func (e *Exec) Save(table string) ([]byte, error) {
	if e.Legacy() && !e.legacyTableLoaded(table) {
		return nil, nil
	}
	return e.run("-save", []string{"-t", table}, nil)
}

// Chains lists a table's chains from iptables-save.
func (e *Exec) Chains(table string) ([]string, error) {
	out, err := e.Save(table)
	if err != nil {
		return nil, err
	}
	t, err := parseSave(table, out)
	if err != nil {
		return nil, err
	}
	return t.chains, nil
}

// EnsureChain runs -N, accepting "already exists".
func (e *Exec) EnsureChain(table, chain string) error {
	out, err := e.run("", []string{"-w", "5", "-t", table, "-N", chain}, nil)
	if err != nil && strings.Contains(string(out), "exists") {
		return nil
	}
	return err
}

// EnsureRule runs -C, then -I when the rule is missing.
func (e *Exec) EnsureRule(table, chain string, args ...string) error {
	if _, err := e.run("", append([]string{"-w", "5", "-t", table, "-C", chain}, args...), nil); err == nil {
		return nil
	}
	_, err := e.run("", append([]string{"-w", "5", "-t", table, "-I", chain}, args...), nil)
	return err
}

// DeleteRule runs -D; a missing rule or chain is fine.
func (e *Exec) DeleteRule(table, chain string, args ...string) error {
	_, err := e.run("", append([]string{"-w", "5", "-t", table, "-D", chain}, args...), nil)
	if errors.Is(err, ErrNotFound) {
		return nil
	}
	return err
}

// DeleteChain runs -F and -X; a missing chain is fine.
func (e *Exec) DeleteChain(table, chain string) error {
	if _, err := e.run("", []string{"-w", "5", "-t", table, "-F", chain}, nil); err != nil {
		if errors.Is(err, ErrNotFound) {
			return nil
		}
		return err
	}
	_, err := e.run("", []string{"-w", "5", "-t", table, "-X", chain}, nil)
	if errors.Is(err, ErrNotFound) {
		return nil
	}
	return err
}
