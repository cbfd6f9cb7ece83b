package ipvs

import (
	"fmt"
	"net"
	"net/netip"
	"sync"
	"syscall"
	"time"

	mobyipvs "github.com/moby/ipvs"

	"github.com/sluice-proxy/sluice/lb"
)

// Netlink is the kernel's IPVS table through moby/ipvs (generic netlink).
// It is safe for concurrent use: every request holds mu. moby/ipvs shares
// one socket per handle and discards replies whose sequence number is not
// its own, so two goroutines talking at once could each take the other's
// reply, and one would then wait for it forever (it retries on the receive
// timeout): an IPVS sync running beside the drain check hung that way.
type Netlink struct {
	mu sync.Mutex
	h  *mobyipvs.Handle
}

// NewNetlink opens a handle in this process's network namespace. It
// succeeds on a kernel without IPVS too; use Detect.
func NewNetlink() (*Netlink, error) {
	h, err := mobyipvs.New("")
	if err != nil {
		return nil, fmt.Errorf("IPVS netlink handle: %w", err)
	}
	return &Netlink{h: h}, nil
}

// Close releases the handle.
func (n *Netlink) Close() {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.h.Close()
}

var protoNum = map[lb.Protocol]uint16{lb.TCP: syscall.IPPROTO_TCP, lb.UDP: syscall.IPPROTO_UDP, lb.SCTP: 132}

func protoOf(n uint16) lb.Protocol {
	for p, v := range protoNum {
		if v == n {
			return p
		}
	}
	return lb.Protocol(fmt.Sprint(n))
}

func toMoby(s Service) *mobyipvs.Service {
	m := &mobyipvs.Service{Address: net.IP(s.Addr.AsSlice()), Protocol: protoNum[s.Proto], Port: s.Port,
		SchedName: s.Scheduler, Flags: s.Flags, Timeout: s.Timeout}
	if s.Addr.Is4() {
		m.AddressFamily, m.Netmask = syscall.AF_INET, 0xffffffff
	} else {
		m.AddressFamily, m.Netmask = syscall.AF_INET6, 128
	}
	if s.Scheduler == "" {
		m.SchedName = "rr"
	}
	return m
}

func keyOnly(k Key) *mobyipvs.Service { return toMoby(Service{Key: k}) }

func (n *Netlink) Services() ([]Service, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	ms, err := n.h.GetServices()
	if err != nil {
		return nil, err
	}
	out := make([]Service, 0, len(ms))
	for _, m := range ms {
		if m.FWMark != 0 {
			continue // firewall-mark services are not ours to manage
		}
		a, _ := netip.AddrFromSlice(m.Address)
		out = append(out, Service{Key: Key{Addr: a.Unmap(), Port: m.Port, Proto: protoOf(m.Protocol)},
			Scheduler: m.SchedName, Flags: m.Flags &^ FlagHashed, Timeout: m.Timeout})
	}
	return out, nil
}

func (n *Netlink) AddService(s Service) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.h.NewService(toMoby(s))
}

func (n *Netlink) UpdateService(s Service) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.h.UpdateService(toMoby(s))
}

func (n *Netlink) DeleteService(k Key) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.h.DelService(keyOnly(k))
}

func (n *Netlink) Reals(k Key) ([]Real, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	ds, err := n.h.GetDestinations(keyOnly(k))
	if err != nil {
		return nil, err
	}
	out := make([]Real, 0, len(ds))
	for _, d := range ds {
		a, _ := netip.AddrFromSlice(d.Address)
		out = append(out, Real{Addr: netip.AddrPortFrom(a.Unmap(), d.Port), Weight: d.Weight, Active: d.ActiveConnections, Inactive: d.InactiveConnections})
	}
	return out, nil
}

func dest(r Real) *mobyipvs.Destination {
	d := &mobyipvs.Destination{Address: net.IP(r.Addr.Addr().AsSlice()), Port: r.Addr.Port(), Weight: r.Weight,
		ConnectionFlags: mobyipvs.ConnectionFlagMasq}
	if r.Addr.Addr().Is4() {
		d.AddressFamily = syscall.AF_INET
	} else {
		d.AddressFamily = syscall.AF_INET6
	}
	return d
}

func (n *Netlink) AddReal(k Key, r Real) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.h.NewDestination(keyOnly(k), dest(r))
}

func (n *Netlink) UpdateReal(k Key, r Real) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.h.UpdateDestination(keyOnly(k), dest(r))
}

func (n *Netlink) DeleteReal(k Key, a netip.AddrPort) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.h.DelDestination(keyOnly(k), dest(Real{Addr: a}))
}

// Timeouts reads the TCP, TCP FIN and UDP timeouts (ipvsadm -L --timeout).
func (n *Netlink) Timeouts() (tcp, tcpfin, udp time.Duration, err error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	c, err := n.h.GetConfig()
	if err != nil {
		return 0, 0, 0, err
	}
	return c.TimeoutTCP, c.TimeoutTCPFin, c.TimeoutUDP, nil
}

// SetTimeouts is ipvsadm --set (tcp, tcpfin, udp); zero keeps a value.
func (n *Netlink) SetTimeouts(tcp, tcpfin, udp int64) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	cur, err := n.h.GetConfig()
	if err != nil {
		return err
	}
	c := *cur
	if tcp > 0 {
		c.TimeoutTCP = secs(tcp)
	}
	if tcpfin > 0 {
		c.TimeoutTCPFin = secs(tcpfin)
	}
	if udp > 0 {
		c.TimeoutUDP = secs(udp)
	}
	return n.h.SetConfig(&c)
}
