package kubetest

import (
	"fmt"
	"math/rand/v2"
	"net"
)

// TB is what the bed needs of a test: *testing.T and *testing.B are TBs.
// Fatal must not return (a test's ends its goroutine).
type TB interface {
	Helper()
	Fatal(args ...any)
	Fatalf(format string, args ...any)
	Logf(format string, args ...any)
	Skip(args ...any)
	Cleanup(func())
	TempDir() string
	Failed() bool
}

// FreePort returns a port of 127.0.0.1 free for network ("tcp" or "udp")
// now, below the ephemeral range (Linux's default is 32768-60999): a port
// from ":0" comes from that range, and a test package running beside this
// one can take it (an outgoing connection, a listener on ":0") before the
// process it is meant for binds it (seen under make test's load: sluice
// exited at once; kube-apiserver "address already in use"). claim, when
// not nil, records a port as handed out and reports false if it was: a
// port is free when drawn and bound only later, so two draws in one
// process could otherwise name the same one.
func FreePort(t TB, network string, claim func(port int) bool) int {
	t.Helper()
	for range 200 {
		port := 20000 + rand.IntN(12000)
		if claim != nil && !claim(port) {
			continue // handed out already, perhaps not yet bound
		}
		addr := fmt.Sprintf("127.0.0.1:%d", port)
		if network == "udp" {
			if pc, err := net.ListenPacket("udp", addr); err == nil {
				pc.Close()
				return port
			}
			continue
		}
		if ln, err := net.Listen("tcp", addr); err == nil {
			ln.Close()
			return port
		}
	}
	t.Fatalf("no free %s port on 127.0.0.1 in 20000-31999", network)
	return 0
}
