//go:build !linux

package listeners

import (
	"io"
	"net"
)

// goConnFDs is what one goroutine-engine TCP connection holds: its two
// sockets (no splice off Linux).
const goConnFDs = 2

// tcpCopier moves one direction of a TCP connection with io.Copy; off
// Linux there is no splice and no pipe.
type tcpCopier struct{}

func newTCPCopier(*fdBudget) *tcpCopier { return &tcpCopier{} }

func (*tcpCopier) close() {}

func (*tcpCopier) shed() bool { return false }

func (*tcpCopier) connectionsOpen(int) {}

func (*tcpCopier) copy(dst, src *net.TCPConn) (int64, error) { return io.Copy(dst, src) }
