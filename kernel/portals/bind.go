package portals

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
)

// DefaultInterface is the dummy interface the bind method creates, like
// kube-proxy's kube-ipvs0 in IPVS mode.
const DefaultInterface = "sluice0"

// ErrExists is returned (wrapped) by AddrTable.Add for an address the
// interface already has; it is someone else's, and is left alone.
var ErrExists = errors.New("address already assigned")

// ErrWholeNeeded is returned by a change of some portals that a method
// cannot apply alone: sync every portal instead.
var ErrWholeNeeded = errors.New("the whole portal list is needed")

// ErrNoDummy is returned (wrapped) by AddrTable.EnsureDummy when the
// kernel has no dummy link type.
var ErrNoDummy = errors.New("the kernel has no dummy link type")

// AddrTable is what the bind method needs of the kernel's interfaces and
// addresses. Addresses it adds carry a mark (the address protocol), so
// Owned lists only sluice's and cleanup never removes another's address.
type AddrTable interface {
	// EnsureDummy creates (or finds) a dummy interface, up, and returns its
	// index.
	EnsureDummy(name string) (int, error)
	// LinkIndex finds an interface; a missing one is an error.
	LinkIndex(name string) (int, error)
	// DeleteLink removes an interface; a missing one is not an error.
	DeleteLink(name string) error
	// Owned lists the marked addresses of an interface.
	Owned(link int) ([]netip.Addr, error)
	// Addrs lists every address of an interface, marked or not.
	Addrs(link int) ([]netip.Addr, error)
	// Add assigns a host address (/32 or /128), marked.
	Add(link int, a netip.Addr) error
	// Del removes an address.
	Del(link int, a netip.Addr) error
}

// Binder keeps the service IPs assigned to a local interface, so
// listeners can bind them: a dummy interface where the kernel has one,
// else lo.
type Binder struct {
	Table     AddrTable
	Interface string // default DefaultInterface
	// DummyOnly refuses the lo fallback (IPVS mode needs kube-ipvs0).
	DummyOnly bool
	// Adopt takes every address on the interface but IPv6 link-local ones
	// as sluice's, marked or not: IPVS mode's kube-ipvs0, whose addresses
	// all belong to the node's proxy, as kube-proxy holds them. After a
	// swap from kube-proxy, its addresses are then kept, counted and
	// removed as sluice's own.
	Adopt bool
	link  int
	ready bool
	mine  map[netip.Addr]bool // sluice's addresses on the interface, as last seen
}

func (b *Binder) name() string {
	if b.Interface == "" {
		return DefaultInterface
	}
	return b.Interface
}

// Init picks the interface and says which one and why, for the log.
func (b *Binder) Init() (string, error) {
	idx, err := b.Table.EnsureDummy(b.name())
	if err == nil {
		b.link, b.ready = idx, true
		b.remember()
		return "dummy interface " + b.name(), nil
	}
	if !errors.Is(err, ErrNoDummy) || b.DummyOnly {
		return "", fmt.Errorf("create dummy interface %s: %w", b.name(), err)
	}
	idx, lerr := b.Table.LinkIndex("lo")
	if lerr != nil {
		return "", fmt.Errorf("no dummy interface (%v) and no lo: %w", err, lerr)
	}
	b.link, b.ready = idx, true
	b.remember()
	return "lo (" + err.Error() + ")", nil
}

// remember lists what an earlier run left assigned, for Has and Change.
func (b *Binder) remember() {
	b.mine = map[netip.Addr]bool{}
	if have, err := b.listMine(); err == nil {
		for _, a := range have {
			b.mine[a] = true
		}
	}
}

// Ensure assigns every address of want that the interface lacks. An
// address that is already there and not sluice's is left as it is (it is
// local either way).
func (b *Binder) Ensure(want []netip.Addr) error {
	if !b.ready {
		return errors.New("bind capture: Init was not called")
	}
	have, err := b.listMine()
	if err != nil {
		return fmt.Errorf("list addresses: %w", err)
	}
	// A set, not a search of the list per address: at 10,000 service IPs
	// the search made each sync's Ensure and Prune 55 ms (issue 16).
	b.mine = make(map[netip.Addr]bool, max(len(have), len(want)))
	for _, a := range have {
		b.mine[a] = true
	}
	var errs []error
	for _, a := range want {
		if b.mine[a] {
			continue
		}
		if err := b.add(a); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func (b *Binder) add(a netip.Addr) error {
	err := b.Table.Add(b.link, a)
	switch {
	case err == nil:
		b.mine[a] = true
	case !errors.Is(err, ErrExists):
		return fmt.Errorf("assign %s to %s: %w", a, b.name(), err)
	}
	return nil
}

// Change assigns add and removes those of del that sluice assigned, as
// far as the last Ensure or Prune listed and Change since changed them:
// the bind work of a sync that knows what changed, with no listing.
func (b *Binder) Change(add, del []netip.Addr) error {
	if !b.ready {
		return errors.New("bind capture: Init was not called")
	}
	if b.mine == nil {
		b.mine = map[netip.Addr]bool{}
	}
	var errs []error
	for _, a := range add {
		if !b.mine[a] {
			if err := b.add(a); err != nil {
				errs = append(errs, err)
			}
		}
	}
	for _, a := range del {
		if !b.mine[a] || slices.Contains(add, a) {
			continue
		}
		if err := b.Table.Del(b.link, a); err != nil {
			errs = append(errs, fmt.Errorf("remove %s from %s: %w", a, b.name(), err))
			continue
		}
		delete(b.mine, a)
	}
	return errors.Join(errs...)
}

// Has reports whether sluice assigned a to the interface, as far as the
// last Ensure, Prune or Change knows.
func (b *Binder) Has(a netip.Addr) bool { return b.mine[a] }

// Owned lists the addresses sluice has assigned to the interface.
func (b *Binder) Owned() ([]netip.Addr, error) {
	if !b.ready {
		return nil, nil
	}
	return b.listMine()
}

// listMine lists the interface's addresses that are sluice's: the marked
// ones, or with Adopt all but IPv6 link-local ones.
func (b *Binder) listMine() ([]netip.Addr, error) {
	if !b.Adopt {
		return b.Table.Owned(b.link)
	}
	all, err := b.Table.Addrs(b.link)
	return slices.DeleteFunc(all, func(a netip.Addr) bool { return a.Is6() && a.IsLinkLocalUnicast() }), err
}

// Prune removes sluice's addresses that are not in keep.
func (b *Binder) Prune(keep []netip.Addr) error {
	if !b.ready {
		return nil
	}
	have, err := b.listMine()
	if err != nil {
		return fmt.Errorf("list addresses: %w", err)
	}
	kept := make(map[netip.Addr]bool, len(keep))
	for _, a := range keep {
		kept[a] = true
	}
	b.mine = make(map[netip.Addr]bool, len(have))
	var errs []error
	for _, a := range have {
		b.mine[a] = true
		if !kept[a] {
			if err := b.Table.Del(b.link, a); err != nil {
				errs = append(errs, fmt.Errorf("remove %s from %s: %w", a, b.name(), err))
				continue
			}
			delete(b.mine, a)
		}
	}
	return errors.Join(errs...)
}

// CleanupAddrs removes what the bind method installs: the dummy interface
// (with its addresses) and sluice's addresses on lo. It is idempotent.
func CleanupAddrs(t AddrTable, iface string) error {
	if iface == "" {
		iface = DefaultInterface
	}
	var errs []error
	if err := t.DeleteLink(iface); err != nil {
		errs = append(errs, fmt.Errorf("delete interface %s: %w", iface, err))
	}
	if lo, err := t.LinkIndex("lo"); err == nil {
		owned, err := t.Owned(lo)
		if err != nil {
			errs = append(errs, err)
		}
		for _, a := range owned {
			if err := t.Del(lo, a); err != nil {
				errs = append(errs, fmt.Errorf("remove %s from lo: %w", a, err))
			}
		}
	}
	return errors.Join(errs...)
}

// FakeAddrTable keeps interfaces and addresses as the kernel would and
// refuses what it would refuse: a second equal address, deleting an
// address that is not there, an unknown interface, and (when NoDummy is
// set) creating a dummy interface.
type FakeAddrTable struct {
	NoDummy bool
	links   map[string]int
	addrs   map[int]map[netip.Addr]bool // link -> address -> marked as sluice's
}

// NewFakeAddrTable returns a table with lo (index 1) holding 127.0.0.1
// and ::1, unmarked.
func NewFakeAddrTable() *FakeAddrTable {
	return &FakeAddrTable{links: map[string]int{"lo": 1},
		addrs: map[int]map[netip.Addr]bool{1: {netip.MustParseAddr("127.0.0.1"): false, netip.MustParseAddr("::1"): false}}}
}

func (f *FakeAddrTable) EnsureDummy(name string) (int, error) {
	if idx, ok := f.links[name]; ok {
		return idx, nil
	}
	if f.NoDummy {
		return 0, fmt.Errorf("add link %s type dummy: %w", name, ErrNoDummy)
	}
	idx := len(f.links) + 1
	f.links[name] = idx
	f.addrs[idx] = map[netip.Addr]bool{}
	return idx, nil
}

func (f *FakeAddrTable) LinkIndex(name string) (int, error) {
	if idx, ok := f.links[name]; ok {
		return idx, nil
	}
	return 0, fmt.Errorf("link %s not found", name)
}

func (f *FakeAddrTable) DeleteLink(name string) error {
	if name == "lo" {
		return errors.New("cannot delete lo")
	}
	if idx, ok := f.links[name]; ok {
		delete(f.addrs, idx)
		delete(f.links, name)
	}
	return nil
}

func (f *FakeAddrTable) Owned(link int) ([]netip.Addr, error) {
	m, ok := f.addrs[link]
	if !ok {
		return nil, fmt.Errorf("no link with index %d", link)
	}
	var out []netip.Addr
	for a, ours := range m {
		if ours {
			out = append(out, a)
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return out, nil
}

func (f *FakeAddrTable) Addrs(link int) ([]netip.Addr, error) {
	m, ok := f.addrs[link]
	if !ok {
		return nil, fmt.Errorf("no link with index %d", link)
	}
	var out []netip.Addr
	for a := range m {
		out = append(out, a)
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return out, nil
}

// AddUnmarked assigns an address as another program would: not marked
// as sluice's.
func (f *FakeAddrTable) AddUnmarked(link int, a netip.Addr) error {
	if err := f.Add(link, a); err != nil {
		return err
	}
	f.addrs[link][a] = false
	return nil
}

func (f *FakeAddrTable) Add(link int, a netip.Addr) error {
	m, ok := f.addrs[link]
	if !ok {
		return fmt.Errorf("no link with index %d", link)
	}
	if _, dup := m[a]; dup {
		return fmt.Errorf("%s: %w", a, ErrExists)
	}
	m[a] = true
	return nil
}

func (f *FakeAddrTable) Del(link int, a netip.Addr) error {
	m, ok := f.addrs[link]
	if !ok {
		return fmt.Errorf("no link with index %d", link)
	}
	if _, there := m[a]; !there {
		return fmt.Errorf("%s: cannot assign requested address", a)
	}
	delete(m, a)
	return nil
}

// All lists every address of an interface, marked or not, for tests.
func (f *FakeAddrTable) All(name string) []netip.Addr {
	var out []netip.Addr
	for a := range f.addrs[f.links[name]] {
		out = append(out, a)
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return out
}
