//go:build linux && vmguest

package guest

import (
	"bytes"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"regexp"
	"strconv"
	"sync"
	"testing"
	"time"
)

const echoManifest = `apiVersion: v1
kind: Service
metadata: {name: echo, namespace: vm}
spec:
  type: NodePort
  clusterIP: 10.96.0.30
  ports: [{name: echo, port: 7, nodePort: 30093, protocol: TCP}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: echo-1, namespace: vm, labels: {kubernetes.io/service-name: echo}}
addressType: IPv4
ports: [{name: echo, port: 8090, protocol: TCP}]
endpoints:
- addresses: [10.244.0.5]
`

// The event loop batches its reads and writes on io_uring on the VM's
// kernel too (Debian 12's 6.1, older than the host's, and the oldest
// the ring is built for is 5.18): the start-up log says the ring is on,
// 32 clients at once each echo 64 KiB, in pieces of random size, byte
// for byte through a NodePort, and the metrics say reads and writes went
// in batches, every loop still batches, and no ring was given up.
func TestEventLoopIOUringInVM(t *testing.T) {
	b := newBed(t)
	var echo net.Listener
	must(t, inNS(b.backend, func() (err error) {
		echo, err = net.Listen("tcp", "10.244.0.5:8090")
		return err
	}))
	t.Cleanup(func() { echo.Close() })
	go func() {
		for {
			c, err := echo.Accept()
			if err != nil {
				return
			}
			go func() {
				io.Copy(c, c)
				c.(*net.TCPConn).CloseWrite()
			}()
		}
	}()
	dir := t.TempDir()
	sh(t, dir, "svc.yaml", echoManifest)
	p := startSluice(t, "--proxy-mode=userspace", "--engine=eventloop", "--userspace-capture=none", "--manifests", dir,
		"--healthz-bind-address=", "--metrics-bind-address=127.0.0.1:10249")
	p.waitLog("userspace engine", `ioUring="on`)
	p.waitLog("state applied")

	const clients, each = 32, 64 << 10
	conns := make([]*net.TCPConn, clients)
	must(t, inNS(b.client, func() error {
		for i := range conns {
			c, err := net.DialTimeout("tcp", "192.168.10.1:30093", answerWithin)
			if err != nil {
				return err
			}
			conns[i] = c.(*net.TCPConn)
		}
		return nil
	}))
	errs := make(chan error, clients)
	var wg sync.WaitGroup
	for i, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer c.Close()
			c.SetDeadline(time.Now().Add(2 * time.Minute)) // a safety net under emulation
			r := rand.New(rand.NewPCG(uint64(i), 12))
			got := make([]byte, 4096)
			for sent := 0; sent < each; {
				piece := make([]byte, 1+r.IntN(4096))
				for j := range piece {
					piece[j] = byte(r.Uint32())
				}
				if _, err := c.Write(piece); err != nil {
					errs <- fmt.Errorf("client %d at byte %d: write: %w", i, sent, err)
					return
				}
				if _, err := io.ReadFull(c, got[:len(piece)]); err != nil || !bytes.Equal(got[:len(piece)], piece) {
					errs <- fmt.Errorf("client %d at byte %d: %d bytes echoed wrong (%v)", i, sent, len(piece), err)
					return
				}
				sent += len(piece)
			}
			c.CloseWrite()
			if n, err := io.Copy(io.Discard, c); n != 0 || err != nil {
				errs <- fmt.Errorf("client %d after its half-close: %d more bytes, %v; want the backend's FIN", i, n, err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}

	resp, err := http.Get("http://127.0.0.1:10249/metrics")
	must(t, err)
	page, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	must(t, err)
	value := func(name string) float64 {
		m := regexp.MustCompile(`(?m)^` + name + ` (\S+)$`).FindSubmatch(page)
		if m == nil {
			t.Fatalf("no %s in /metrics", name)
		}
		v, err := strconv.ParseFloat(string(m[1]), 64)
		must(t, err)
		return v
	}
	loops, failed, ops := value("sluice_eventloop_io_uring_loops"), value("sluice_eventloop_io_uring_failures_total"), value("sluice_eventloop_io_uring_ops_total")
	if loops < 1 || failed != 0 || ops == 0 {
		t.Fatalf("after the echoes: %g loops batching, %g rings given up, %g reads and writes batched; want every loop still on its ring, and batches made", loops, failed, ops)
	}
	t.Logf("%g reads and writes batched on %g loops' rings", ops, loops)
	p.stop()
}
