//go:build !unix

package listeners

import "net"

// datagramReader reads datagrams from a connected UDP socket. Off Unix a
// flow keeps its own buffer while it waits (the goroutine engine's old
// cost: 64 KiB per concurrent flow).
type datagramReader struct{}

func newDatagramReader() *datagramReader { return &datagramReader{} }

func (r *datagramReader) read(c *net.UDPConn) (buf *[]byte, n int, truncated bool, err error) {
	b := make([]byte, maxDatagram+1)
	n, err = c.Read(b)
	if err != nil {
		return nil, 0, false, err
	}
	return &b, n, n > maxDatagram, nil
}

func (r *datagramReader) put(*[]byte) {}
