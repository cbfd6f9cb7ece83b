package main

import "context"

// serviceRequest is what the Windows service control manager asks of a
// running service (--windows-service), as sluice needs it.
type serviceRequest int

const (
	serviceInterrogate serviceRequest = iota
	serviceStop
	serviceShutdown
)

// serviceState is what a service reports to the control manager.
type serviceState int

const (
	serviceStartPending serviceState = iota
	serviceRunning
	serviceStopPending
)

// serviceStopped is the cause of the run's end when the control manager
// asked for it: the same drain as SIGTERM.
type serviceStopped struct{ req serviceRequest }

func (s serviceStopped) Error() string {
	if s.req == serviceShutdown {
		return "service control: system shutdown"
	}
	return "service control: stop"
}

// runAsService runs body as kube-proxy's --windows-service runs kube-proxy:
// it reports start-pending, then running (accepting stop and shutdown); an
// interrogation gets the current state; a stop or shutdown request reports
// stop-pending and cancels body's context (the drain --drain-timeout
// bounds, as for SIGTERM); it returns body's exit code when body returns.
// The control manager sees the service stopped when the caller returns
// that code to it.
func runAsService(ctx context.Context, requests <-chan serviceRequest, report func(serviceState), body func(context.Context) int) int {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	report(serviceStartPending)
	done := make(chan int, 1)
	go func() { done <- body(ctx) }()
	state := serviceRunning
	report(state)
	for {
		select {
		case code := <-done:
			return code
		case r, ok := <-requests:
			if !ok {
				requests = nil
				continue
			}
			switch r {
			case serviceInterrogate:
				report(state)
			case serviceStop, serviceShutdown:
				if state == serviceRunning {
					state = serviceStopPending
					report(state)
					cancel(serviceStopped{r})
				}
			}
		}
	}
}
