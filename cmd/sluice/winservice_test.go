package main

import (
	"context"
	"errors"
	"reflect"
	"testing"
)

// Under --windows-service sluice answers the control manager as kube-proxy
// does: start-pending then running; an interrogation gets the current
// state; stop (or shutdown) reports stop-pending once and ends the run
// through its context, with a cause the shutdown log names; the body's exit
// code is the service's.
func TestRunAsServiceAnswersTheControlManager(t *testing.T) {
	requests := make(chan serviceRequest)
	states := make(chan serviceState, 16)
	causes := make(chan error, 1)
	started := make(chan struct{})
	done := make(chan int)
	go func() {
		done <- runAsService(context.Background(), requests, func(s serviceState) { states <- s }, func(ctx context.Context) int {
			close(started)
			<-ctx.Done()
			causes <- context.Cause(ctx)
			return 3
		})
	}()
	<-started
	requests <- serviceInterrogate
	requests <- serviceStop
	var code int
	select {
	case requests <- serviceStop: // a second stop while stopping changes nothing
		code = <-done
	case code = <-done:
	}
	if code != 3 {
		t.Fatalf("exit code %d, want the body's 3", code)
	}
	close(states)
	var got []serviceState
	for s := range states {
		got = append(got, s)
	}
	if want := []serviceState{serviceStartPending, serviceRunning, serviceRunning, serviceStopPending}; !reflect.DeepEqual(got, want) {
		t.Fatalf("states %v, want %v", got, want)
	}
	cause := <-causes
	var stopped serviceStopped
	if !errors.As(cause, &stopped) || stopped.req != serviceStop {
		t.Fatalf("cause %v", cause)
	}
	ctx, cancel := context.WithCancelCause(context.Background())
	cancel(cause)
	if signalName(ctx) != "service control: stop" {
		t.Fatalf("shutdown log would say %q", signalName(ctx))
	}
}

// A body that ends on its own (a start-up error) ends the service with its
// code, without a stop request.
func TestRunAsServiceEndsWithTheBody(t *testing.T) {
	var states []serviceState
	code := runAsService(context.Background(), nil, func(s serviceState) { states = append(states, s) }, func(context.Context) int { return 1 })
	if code != 1 || len(states) != 2 || states[1] != serviceRunning {
		t.Fatalf("code %d states %v", code, states)
	}
}
