//go:build windows

package main

import (
	"context"
	"errors"

	"golang.org/x/sys/windows/svc"
)

// scmHandler adapts runAsService to the control manager's protocol.
type scmHandler struct {
	ctx  context.Context
	body func(context.Context) int
	code int
}

func (h *scmHandler) Execute(_ []string, r <-chan svc.ChangeRequest, s chan<- svc.Status) (bool, uint32) {
	requests := make(chan serviceRequest)
	stop := make(chan struct{})
	go func() {
		for {
			var req serviceRequest
			select {
			case c := <-r:
				switch c.Cmd {
				case svc.Interrogate:
					req = serviceInterrogate
				case svc.Stop:
					req = serviceStop
				case svc.Shutdown:
					req = serviceShutdown
				default:
					continue
				}
			case <-stop:
				return
			}
			select {
			case requests <- req:
			case <-stop:
				return
			}
		}
	}()
	report := func(st serviceState) {
		switch st {
		case serviceStartPending:
			s <- svc.Status{State: svc.StartPending}
		case serviceRunning:
			s <- svc.Status{State: svc.Running, Accepts: svc.AcceptStop | svc.AcceptShutdown}
		case serviceStopPending:
			s <- svc.Status{State: svc.StopPending}
		}
	}
	h.code = runAsService(h.ctx, requests, report, h.body)
	close(stop)
	if h.code != 0 {
		return true, uint32(h.code) // a service-specific exit code
	}
	return false, 0
}

// serveAsWindowsService runs body under the Windows service control
// manager (--windows-service) and returns its exit code; the service's
// name is the one it was installed under (sc create).
func serveAsWindowsService(ctx context.Context, body func(context.Context) int) (int, error) {
	is, err := svc.IsWindowsService()
	if err != nil {
		return 1, err
	}
	if !is {
		return 1, errors.New("not started by the Windows service control manager (install it with sc create, or leave the flag out)")
	}
	h := &scmHandler{ctx: ctx, body: body}
	if err := svc.Run("sluice", h); err != nil {
		return 1, err
	}
	return h.code, nil
}
