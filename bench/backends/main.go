// Command sluice-demo-backend starts small demo backends on loopback: an HTTP
// server and a UDP echo server per address, each answering with its own name
// so that load balancing is visible. It is used by `make run` and by the end
// to end tests; nothing imports it.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
)

func main() {
	tcp := flag.String("tcp", "127.0.0.1:8080,127.0.0.2:8080,127.0.0.3:8080", "comma-separated HTTP listen addresses")
	udp := flag.String("udp", "127.0.0.1:5353,127.0.0.2:5353,127.0.0.3:5353", "comma-separated UDP echo listen addresses")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := run(ctx, split(*tcp), split(*udp)); err != nil {
		fmt.Fprintln(os.Stderr, "sluice-demo-backend:", err)
		os.Exit(1)
	}
}

func split(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

func run(ctx context.Context, tcpAddrs, udpAddrs []string) error {
	var closers []func()
	defer func() {
		for _, c := range closers {
			c()
		}
	}()
	var wg sync.WaitGroup
	for i, addr := range tcpAddrs {
		name := fmt.Sprintf("backend-%d", i+1)
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			return err
		}
		srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprintf(w, "hello from %s (%s), you are %s\n", name, addr, r.RemoteAddr)
		})}
		wg.Add(1)
		go func() { defer wg.Done(); srv.Serve(ln) }()
		closers = append(closers, func() { srv.Close() })
	}
	for i, addr := range udpAddrs {
		name := fmt.Sprintf("backend-%d", i+1)
		pc, err := net.ListenPacket("udp", addr)
		if err != nil {
			return err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, 65536)
			for {
				n, from, err := pc.ReadFrom(buf)
				if err != nil {
					if errors.Is(err, net.ErrClosed) {
						return
					}
					continue
				}
				pc.WriteTo(append([]byte(name+": "), buf[:n]...), from)
			}
		}()
		closers = append(closers, func() { pc.Close() })
	}
	fmt.Printf("demo backends up: http %s; udp echo %s\n", strings.Join(tcpAddrs, " "), strings.Join(udpAddrs, " "))
	<-ctx.Done()
	for _, c := range closers {
		c()
	}
	closers = nil
	wg.Wait()
	return nil
}
