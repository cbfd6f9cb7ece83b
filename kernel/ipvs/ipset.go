package ipvs

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sluice-proxy/sluice/kernel/iptables"
)

// IPSetExec runs the ipset binary.
type IPSetExec struct {
	Command string           // default "ipset"
	Run     iptables.RunFunc // default iptables.RunCommand
}

func (e *IPSetExec) run(args []string, stdin []byte) ([]byte, error) {
	cmd, run := e.Command, e.Run
	if cmd == "" {
		cmd = "ipset"
	}
	if run == nil {
		run = iptables.RunCommand
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := run(ctx, cmd, args, stdin)
	if err != nil {
		return out, fmt.Errorf("%s %s: %v: %s", cmd, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return out, nil
}

// Restore runs ipset restore.
func (e *IPSetExec) Restore(data []byte) error {
	_, err := e.run([]string{"restore"}, data)
	return err
}

// List names every set.
func (e *IPSetExec) List() ([]string, error) {
	out, err := e.run([]string{"list", "-n"}, nil)
	if err != nil {
		return nil, err
	}
	return strings.Fields(string(out)), nil
}

// Destroy destroys a set.
func (e *IPSetExec) Destroy(name string) error {
	_, err := e.run([]string{"destroy", name}, nil)
	return err
}

// FakeIPSet keeps sets as the kernel does and refuses what ipset refuses:
// adding to or deleting from a missing set, adding an entry the set has
// or deleting one it lacks (without -exist), an entry that does not fit the set's type or
// family, creating an existing set of another type, swapping sets of
// different types, and destroying a missing set or one iptables still
// references (Referenced). Like ipset restore it stops at the first bad
// line, keeping what came before.
type FakeIPSet struct {
	Referenced func(name string) bool

	mu   sync.Mutex
	sets map[string]*fakeSet
}

type fakeSet struct {
	typ     string
	v6      bool
	entries map[string]bool
}

// NewFakeIPSet returns an empty set table.
func NewFakeIPSet() *FakeIPSet { return &FakeIPSet{sets: map[string]*fakeSet{}} }

func validEntry(s *fakeSet, e string) bool {
	ip := func(x string) bool {
		a, err := netip.ParseAddr(x)
		return err == nil && a.Is6() == s.v6
	}
	protoPort := func(x string) bool {
		p, port, ok := strings.Cut(x, ":")
		n, err := strconv.Atoi(port)
		return ok && (p == "tcp" || p == "udp" || p == "sctp") && err == nil && n >= 0 && n <= 65535
	}
	f := strings.Split(e, ",")
	switch s.typ {
	case "hash:ip":
		return len(f) == 1 && ip(f[0])
	case "hash:ip,port":
		return len(f) == 2 && ip(f[0]) && protoPort(f[1])
	case "hash:ip,port,ip":
		return len(f) == 3 && ip(f[0]) && protoPort(f[1]) && ip(f[2])
	case "hash:ip,port,net":
		pf, err := netip.ParsePrefix(f[len(f)-1])
		return len(f) == 3 && ip(f[0]) && protoPort(f[1]) && err == nil && pf.Addr().Is6() == s.v6
	case "bitmap:port":
		n, err := strconv.Atoi(e)
		return len(f) == 1 && err == nil && n >= 0 && n <= 65535
	}
	return false
}

// Restore applies restore input line by line.
func (f *FakeIPSet) Restore(data []byte) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	for i, line := range strings.Split(string(data), "\n") {
		w := strings.Fields(line)
		if len(w) == 0 {
			continue
		}
		bad := func(format string, a ...any) error {
			return fmt.Errorf("ipset restore: line %d (%q): %s", i+1, line, fmt.Sprintf(format, a...))
		}
		if len(w) < 2 {
			return bad("missing set name")
		}
		s := f.sets[w[1]]
		switch w[0] {
		case "create":
			if len(w) < 3 {
				return bad("missing type")
			}
			if !slices.Contains([]string{"hash:ip", "hash:ip,port", "hash:ip,port,ip", "hash:ip,port,net", "bitmap:port"}, w[2]) {
				return bad("unknown type %s", w[2])
			}
			if len(w[1]) > 31 {
				return bad("set name too long")
			}
			v6 := slices.Contains(w, "inet6")
			if s != nil {
				if !slices.Contains(w, "-exist") || s.typ != w[2] || s.v6 != v6 {
					return bad("set %s already exists", w[1])
				}
				continue
			}
			f.sets[w[1]] = &fakeSet{typ: w[2], v6: v6, entries: map[string]bool{}}
		case "add":
			if s == nil {
				return bad("set %s does not exist", w[1])
			}
			if len(w) < 3 || !validEntry(s, w[2]) {
				return bad("entry does not fit %s", s.typ)
			}
			if s.entries[w[2]] && !slices.Contains(w, "-exist") {
				return bad("element cannot be added to the set: it's already added")
			}
			s.entries[w[2]] = true
		case "del":
			if s == nil {
				return bad("set %s does not exist", w[1])
			}
			if len(w) < 3 || !validEntry(s, w[2]) {
				return bad("entry does not fit %s", s.typ)
			}
			if !s.entries[w[2]] && !slices.Contains(w, "-exist") {
				return bad("element cannot be deleted from the set: it's not added")
			}
			delete(s.entries, w[2])
		case "flush":
			if s == nil {
				return bad("set %s does not exist", w[1])
			}
			s.entries = map[string]bool{}
		case "swap":
			o := f.sets[w[len(w)-1]]
			if s == nil || o == nil || len(w) != 3 {
				return bad("both sets must exist")
			}
			if s.typ != o.typ || s.v6 != o.v6 {
				return bad("sets of different types cannot be swapped")
			}
			f.sets[w[1]], f.sets[w[2]] = o, s
		case "destroy":
			if err := f.destroy(w[1]); err != nil {
				return bad("%v", err)
			}
		default:
			return bad("unknown command %s", w[0])
		}
	}
	return nil
}

func (f *FakeIPSet) destroy(name string) error {
	if _, ok := f.sets[name]; !ok {
		return fmt.Errorf("set %s does not exist", name)
	}
	if f.Referenced != nil && f.Referenced(name) {
		return fmt.Errorf("set %s is in use by a kernel component", name)
	}
	delete(f.sets, name)
	return nil
}

// List names every set, sorted.
func (f *FakeIPSet) List() ([]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for n := range f.sets {
		out = append(out, n)
	}
	slices.Sort(out)
	return out, nil
}

// Destroy destroys one set.
func (f *FakeIPSet) Destroy(name string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.destroy(name)
}

// Entries lists a set's entries, sorted (nil for a missing set).
func (f *FakeIPSet) Entries(name string) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	s := f.sets[name]
	if s == nil {
		return nil
	}
	var out []string
	for e := range s.entries {
		out = append(out, e)
	}
	slices.Sort(out)
	return out
}
