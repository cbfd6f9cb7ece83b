package ipvs

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"

	"github.com/sluice-proxy/sluice/lb"
)

// Fake is an IPVS table in memory that refuses what the kernel refuses: a
// second virtual server with the same address, port and protocol, a
// scheduler it does not know, a real server of a missing virtual server
// or twice the same one, a negative weight, and deleting what is not
// there. SetConns stands in for connections the kernel would count.
type Fake struct {
	mu    sync.Mutex
	svcs  map[Key]Service
	reals map[Key]map[netip.AddrPort]Real
}

// NewFake returns an empty table.
func NewFake() *Fake {
	return &Fake{svcs: map[Key]Service{}, reals: map[Key]map[netip.AddrPort]Real{}}
}

func (f *Fake) Services() ([]Service, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]Service, 0, len(f.svcs))
	for _, s := range f.svcs {
		out = append(out, s)
	}
	slices.SortFunc(out, func(a, b Service) int { return compareKeys(a.Key, b.Key) })
	return out, nil
}

func (f *Fake) check(s Service) error {
	if !slices.Contains(Schedulers, s.Scheduler) {
		return fmt.Errorf("%s: scheduler %q: no such file or directory", s.Key, s.Scheduler)
	}
	if s.Proto != lb.TCP && s.Proto != lb.UDP && s.Proto != lb.SCTP {
		return fmt.Errorf("%s: protocol not supported", s.Key)
	}
	return nil
}

func (f *Fake) AddService(s Service) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.check(s); err != nil {
		return err
	}
	if _, dup := f.svcs[s.Key]; dup {
		return fmt.Errorf("%s: file exists", s.Key)
	}
	f.svcs[s.Key] = s
	f.reals[s.Key] = map[netip.AddrPort]Real{}
	return nil
}

func (f *Fake) UpdateService(s Service) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.check(s); err != nil {
		return err
	}
	if _, ok := f.svcs[s.Key]; !ok {
		return fmt.Errorf("%s: no such process", s.Key)
	}
	f.svcs[s.Key] = s
	return nil
}

func (f *Fake) DeleteService(k Key) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.svcs[k]; !ok {
		return fmt.Errorf("%s: no such process", k)
	}
	delete(f.svcs, k)
	delete(f.reals, k)
	return nil
}

func (f *Fake) Reals(k Key) ([]Real, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	rs, ok := f.reals[k]
	if !ok {
		return nil, fmt.Errorf("%s: no such process", k)
	}
	out := make([]Real, 0, len(rs))
	for _, r := range rs {
		out = append(out, r)
	}
	slices.SortFunc(out, func(a, b Real) int { return a.Addr.Compare(b.Addr) })
	return out, nil
}

func (f *Fake) AddReal(k Key, r Real) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	rs, ok := f.reals[k]
	if !ok {
		return fmt.Errorf("%s: no such process", k)
	}
	if _, dup := rs[r.Addr]; dup {
		return fmt.Errorf("%s -> %s: file exists", k, r.Addr)
	}
	if r.Weight < 0 {
		return fmt.Errorf("%s -> %s: invalid argument (weight %d)", k, r.Addr, r.Weight)
	}
	rs[r.Addr] = Real{Addr: r.Addr, Weight: r.Weight}
	return nil
}

func (f *Fake) UpdateReal(k Key, r Real) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	rs, ok := f.reals[k]
	if !ok {
		return fmt.Errorf("%s: no such process", k)
	}
	cur, ok := rs[r.Addr]
	if !ok {
		return fmt.Errorf("%s -> %s: no such file or directory", k, r.Addr)
	}
	if r.Weight < 0 {
		return fmt.Errorf("%s -> %s: invalid argument (weight %d)", k, r.Addr, r.Weight)
	}
	cur.Weight = r.Weight
	rs[r.Addr] = cur
	return nil
}

func (f *Fake) DeleteReal(k Key, a netip.AddrPort) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	rs, ok := f.reals[k]
	if !ok {
		return fmt.Errorf("%s: no such process", k)
	}
	if _, ok := rs[a]; !ok {
		return fmt.Errorf("%s -> %s: no such file or directory", k, a)
	}
	delete(rs, a)
	return nil
}

// SetConns sets the connection counts of a real server.
func (f *Fake) SetConns(k Key, a netip.AddrPort, active, inactive int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if r, ok := f.reals[k][a]; ok {
		r.Active, r.Inactive = active, inactive
		f.reals[k][a] = r
	}
}

// Dump is the whole table as text, sorted, for comparing states.
func (f *Fake) Dump() string { return Dump(f) }

// Dump is a kernel's whole table as text, sorted, for comparing states.
func Dump(k Kernel) string {
	svcs, err := k.Services()
	if err != nil {
		return "error: " + err.Error()
	}
	slices.SortFunc(svcs, func(a, b Service) int { return compareKeys(a.Key, b.Key) })
	var out strings.Builder
	for _, s := range svcs {
		fmt.Fprintf(&out, "%s %s flags=%#x timeout=%d\n", s.Key, s.Scheduler, s.Flags, s.Timeout)
		rs, err := k.Reals(s.Key)
		if err != nil {
			fmt.Fprintf(&out, "  error: %v\n", err)
		}
		slices.SortFunc(rs, func(a, b Real) int { return a.Addr.Compare(b.Addr) })
		for _, r := range rs {
			fmt.Fprintf(&out, "  -> %s weight %d\n", r.Addr, r.Weight)
		}
	}
	return out.String()
}

// Unavailable is a Kernel with no IPVS as moby/ipvs sees it: every call
// succeeds and nothing is kept.
type Unavailable struct{}

func (Unavailable) Services() ([]Service, error)         { return nil, nil }
func (Unavailable) AddService(Service) error             { return nil }
func (Unavailable) UpdateService(Service) error          { return nil }
func (Unavailable) DeleteService(Key) error              { return nil }
func (Unavailable) Reals(Key) ([]Real, error)            { return nil, nil }
func (Unavailable) AddReal(Key, Real) error              { return nil }
func (Unavailable) UpdateReal(Key, Real) error           { return nil }
func (Unavailable) DeleteReal(Key, netip.AddrPort) error { return nil }
