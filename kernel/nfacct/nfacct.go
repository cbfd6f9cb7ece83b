// Package nfacct owns the kernel's extended accounting objects
// (nfnetlink_acct): the named packet counters kube-proxy's iptables mode
// counts with (`-m nfacct --nfacct-name NAME`: the INVALID packets it
// drops, the packets accepted on localhost NodePorts), and reading them
// for its metrics.
package nfacct

import (
	"errors"
	"fmt"
	"sync"
)

// InvalidDropped is the counter kube-proxy names for the INVALID drop.
const InvalidDropped = "ct_state_invalid_dropped_pkts"

// LocalhostNodePortsAccepted is the counter kube-proxy names for packets
// to a NodePort on 127.0.0.0/8.
const LocalhostNodePortsAccepted = "localhost_nps_accepted_pkts"

// nameMax is NFACCT_NAME_MAX, the terminating NUL included.
const nameMax = 32

// ErrNotFound is a counter the kernel does not have.
var ErrNotFound = errors.New("no such nfacct counter")

// Table is the kernel's set of counters.
type Table interface {
	// Ensure creates the named counter if it does not exist.
	Ensure(name string) error
	// Packets reads the named counter's packet count.
	Packets(name string) (uint64, error)
}

func checkName(name string) error {
	if name == "" || len(name) >= nameMax {
		return fmt.Errorf("nfacct counter name %q: 1 to %d bytes", name, nameMax-1)
	}
	return nil
}

// Fake is a Table in memory; Count adds packets as a rule would.
type Fake struct {
	mu   sync.Mutex
	objs map[string]uint64
}

func (f *Fake) Ensure(name string) error {
	if err := checkName(name); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.objs == nil {
		f.objs = map[string]uint64{}
	}
	if _, ok := f.objs[name]; !ok {
		f.objs[name] = 0
	}
	return nil
}

func (f *Fake) Packets(name string) (uint64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	n, ok := f.objs[name]
	if !ok {
		return 0, fmt.Errorf("%s: %w", name, ErrNotFound)
	}
	return n, nil
}

// Count adds n packets to an existing counter.
func (f *Fake) Count(name string, n uint64) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.objs[name]; !ok {
		return fmt.Errorf("%s: %w", name, ErrNotFound)
	}
	f.objs[name] += n
	return nil
}
