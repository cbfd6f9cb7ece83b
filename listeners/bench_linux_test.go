//go:build linux

package listeners

import (
	"context"
	"io"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/lb"
	"golang.org/x/sys/unix"
)

// Engine micro-benchmarks, peers side by side in one run: no proxy
// (direct), the two engines we ship, and the gnet v2.10.0 candidate. They
// are reported by `make bench`, never asserted. The full harness against
// HAProxy and nginx lives in bench/ (its own issue).

type benchSystem struct {
	name  string
	start func(b *testing.B, backend netip.AddrPort) netip.AddrPort
}

func benchSystems() []benchSystem {
	engine := func(name string) func(*testing.B, netip.AddrPort) netip.AddrPort {
		return func(b *testing.B, backend netip.AddrPort) netip.AddrPort {
			e, err := New(name, Options{Loops: 1})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				e.Shutdown(ctx)
			})
			tg := &Target{Picker: lb.NewPicker(nil, lb.DefaultEjectionPolicy()), Retry: defaultRetry()}
			tg.Picker.SetEndpoints([]netip.AddrPort{backend})
			ln, err := e.Listen(lb.TCP, netip.MustParseAddrPort("127.0.0.1:0"), tg)
			if err != nil {
				b.Fatal(err)
			}
			return ln.Addr()
		}
	}
	return []benchSystem{
		{"direct", func(_ *testing.B, backend netip.AddrPort) netip.AddrPort { return backend }},
		{"eventloop", engine(EngineEventLoop)},
		{"goroutine", engine(EngineGoroutine)},
		{"gnet", func(b *testing.B, backend netip.AddrPort) netip.AddrPort {
			tg := &Target{Picker: lb.NewPicker(nil, lb.DefaultEjectionPolicy()), Retry: defaultRetry()}
			tg.Picker.SetEndpoints([]netip.AddrPort{backend})
			return startGnetCandidate(b, tg).Addr()
		}},
	}
}

func benchBackend(b *testing.B) netip.AddrPort {
	ln, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.AcceptTCP()
			if err != nil {
				return
			}
			go func() { io.Copy(c, c); c.Close() }()
		}
	}()
	return ln.Addr().(*net.TCPAddr).AddrPort()
}

// BenchmarkRequestResponse: one connection, 64-byte ping-pong per op.
func BenchmarkRequestResponse(b *testing.B) {
	for _, sys := range benchSystems() {
		b.Run(sys.name, func(b *testing.B) {
			addr := sys.start(b, benchBackend(b))
			c, err := net.Dial("tcp", addr.String())
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			msg := make([]byte, 64)
			buf := make([]byte, 64)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				c.Write(msg)
				if _, err := io.ReadFull(c, buf); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkConnectPerRequest: a new connection per 64-byte request.
func BenchmarkConnectPerRequest(b *testing.B) {
	for _, sys := range benchSystems() {
		b.Run(sys.name, func(b *testing.B) {
			addr := sys.start(b, benchBackend(b))
			msg := make([]byte, 64)
			buf := make([]byte, 64)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				c, err := net.Dial("tcp", addr.String())
				if err != nil {
					b.Fatal(err)
				}
				c.Write(msg)
				if _, err := io.ReadFull(c, buf); err != nil {
					b.Fatal(err)
				}
				c.Close()
			}
		})
	}
}

// BenchmarkBulk: 1 MiB echoed through one connection per op.
func BenchmarkBulk(b *testing.B) {
	for _, sys := range benchSystems() {
		b.Run(sys.name, func(b *testing.B) {
			addr := sys.start(b, benchBackend(b))
			c, err := net.Dial("tcp", addr.String())
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			msg := make([]byte, 1<<20)
			buf := make([]byte, 1<<20)
			b.SetBytes(1 << 20)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				go c.Write(msg)
				if _, err := io.ReadFull(c, buf); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkUDPRequestResponse: one client tuple, 64-byte datagram ping-pong.
func BenchmarkUDPRequestResponse(b *testing.B) {
	backend := func(b *testing.B) netip.AddrPort {
		pc, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { pc.Close() })
		go func() {
			buf := make([]byte, 2048)
			for {
				n, from, err := pc.ReadFromUDPAddrPort(buf)
				if err != nil {
					return
				}
				pc.WriteToUDPAddrPort(buf[:n], from)
			}
		}()
		return pc.LocalAddr().(*net.UDPAddr).AddrPort()
	}
	for _, name := range []string{"direct", EngineEventLoop, EngineGoroutine} {
		b.Run(name, func(b *testing.B) {
			addr := backend(b)
			if name != "direct" {
				e, err := New(name, Options{Loops: 1})
				if err != nil {
					b.Fatal(err)
				}
				b.Cleanup(func() { e.Shutdown(context.Background()) })
				tg := &Target{Picker: lb.NewPicker(nil, lb.DefaultEjectionPolicy()), Retry: defaultRetry(), UDPTimeout: time.Minute}
				tg.Picker.SetEndpoints([]netip.AddrPort{addr})
				ln, err := e.Listen(lb.UDP, netip.MustParseAddrPort("127.0.0.1:0"), tg)
				if err != nil {
					b.Fatal(err)
				}
				addr = ln.Addr()
			}
			c, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(addr))
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			msg, buf := make([]byte, 64), make([]byte, 2048)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				c.Write(msg)
				c.SetReadDeadline(time.Now().Add(5 * time.Second))
				if _, err := c.Read(buf); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkSyscallBookkeeping is what Go's entersyscall/exitsyscall add to
// a call that never blocks (close of no descriptor: the kernel's
// shortest path), the reason the engine's per-connection calls are raw.
func BenchmarkSyscallBookkeeping(b *testing.B) {
	b.Run("Syscall", func(b *testing.B) {
		for b.Loop() {
			unix.Syscall(unix.SYS_CLOSE, ^uintptr(0), 0, 0)
		}
	})
	b.Run("RawSyscall", func(b *testing.B) {
		for b.Loop() {
			unix.RawSyscall(unix.SYS_CLOSE, ^uintptr(0), 0, 0)
		}
	})
}
