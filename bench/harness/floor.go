//go:build linux

package harness

import (
	_ "embed"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
)

// floorRelaySource is a minimal epoll TCP relay in C (floorrelay/relay.c):
// the same syscalls per unit of work as sluice's event loop and nothing
// else, no language runtime. It is the reference for issue 12's "show the
// floor": what it spends per request is what any poll-driven proxy spends
// on this kernel, so sluice's cost above it is sluice's and Go's, and a
// target below it is out of reach of the design, not of the code.
//
//go:embed floorrelay/relay.c
var floorRelaySource []byte

// floor is floor-relay as a bench system. It is no peer (it is not a
// product: no timeouts, retries, accounting or UDP) and runs only when
// named.
type floor struct{ oneThread bool }

func (f floor) Name() string {
	if f.oneThread {
		return "floor-c-1thread"
	}
	return "floor-c"
}
func (floor) Peer() bool              { return false }
func (floor) Supports(s Service) bool { return !s.UDP && !s.Affinity && s.Backends[0].Addr().Is4() }
func (f floor) Start(t *Topology, dir string, svcs []Service, at Place) (*Proc, error) {
	bin, err := BuildFloorRelay(dir)
	if err != nil {
		return nil, err
	}
	threads := 2 // sluice's loops, HAProxy's nbthread, nginx's workers here
	if f.oneThread {
		threads = 1
	}
	return StartProc(f.Name(), at, t.InNode(floorArgs(bin, threads, t.LB, svcs)...)...)
}

// floorArgs is floor-relay's command line for svcs on lb.
func floorArgs(bin string, threads int, lb netip.Addr, svcs []Service) []string {
	args := []string{bin, "-t", strconv.Itoa(threads)}
	for _, s := range svcs {
		bs := make([]string, len(s.Backends))
		for i, b := range s.Backends {
			bs[i] = b.String()
		}
		args = append(args, fmt.Sprintf("%s=%s", netip.AddrPortFrom(lb, s.Port), strings.Join(bs, ",")))
	}
	return args
}

// BuildFloorRelay compiles floor-relay into dir with the system's C
// compiler (-O2, as Debian builds HAProxy and nginx) and returns its path.
func BuildFloorRelay(dir string) (string, error) {
	cc, err := exec.LookPath("cc")
	if err != nil {
		return "", fmt.Errorf("floor-c needs a C compiler (apt-get install gcc): %w", err)
	}
	src, bin := filepath.Join(dir, "floor-relay.c"), filepath.Join(dir, "floor-relay")
	if err := os.WriteFile(src, floorRelaySource, 0o644); err != nil {
		return "", err
	}
	if out, err := exec.Command(cc, "-O2", "-Wall", "-Werror", "-pthread", "-o", bin, src).CombinedOutput(); err != nil {
		return "", fmt.Errorf("building floor-relay: %v\n%s", err, out)
	}
	return bin, nil
}
