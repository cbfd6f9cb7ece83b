package nfacct

import (
	"errors"
	"net"
	"os"
	"os/exec"
	"runtime"
	"testing"

	"github.com/vishvananda/netns"
)

// The real table, in a network namespace of the test's own (nfacct
// objects belong to the namespace): a counter is created once, a second
// Ensure is no error, a rule counts into it, and an unknown name is
// ErrNotFound.
func TestNetlinkInANamespace(t *testing.T) {
	if os.Getuid() != 0 {
		if os.Getenv("CI") == "true" {
			t.Fatal("needs root for a network namespace (CI must run it)")
		}
		t.Skip("needs root for a network namespace")
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	defer orig.Close()
	ns, err := netns.New() // and enters it, on this thread only
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		netns.Set(orig)
		ns.Close()
	}()

	var tab Netlink
	if _, err := tab.Packets("sluice_test_missing"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("an unknown counter: %v, want ErrNotFound", err)
	}
	if err := tab.Ensure(InvalidDropped); err != nil {
		t.Fatal(err)
	}
	if err := tab.Ensure(InvalidDropped); err != nil {
		t.Fatalf("a second Ensure: %v", err)
	}
	n, err := tab.Packets(InvalidDropped)
	if err != nil || n != 0 {
		t.Fatalf("a new counter: %d, %v", n, err)
	}
	if err := tab.Ensure("a-name-that-is-thirty-two-bytes!"); err == nil {
		t.Fatal("a 32-byte name was taken; the kernel keeps 31")
	}
	// Count through a rule: loopback output in this namespace only.
	if _, err := exec.LookPath("iptables"); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("no iptables to count through (make test-deps installs it)")
		}
		t.Skip("no iptables to count through")
	}
	for _, args := range [][]string{{"link", "set", "lo", "up"}} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %v: %v %s", args, err, out)
		}
	}
	if out, err := exec.Command("iptables", "-A", "OUTPUT", "-o", "lo", "-p", "udp", "-m", "nfacct", "--nfacct-name", InvalidDropped).CombinedOutput(); err != nil {
		t.Fatalf("iptables -m nfacct: %v %s", err, out)
	}
	c, err := net.ListenPacket("udp", "127.0.0.1:0") // this thread's namespace; unconnected, so no ICMP error comes back
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for i := 0; i < 2; i++ {
		if _, err := c.WriteTo([]byte("x"), &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 9}); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := tab.Packets(InvalidDropped); err != nil || n != 2 {
		t.Fatalf("after 2 datagrams: %d, %v; want 2", n, err)
	}
}
