//go:build !linux

package listeners

import "errors"

// NewEventLoop is Linux-only: it is built on epoll. Use the goroutine engine.
func NewEventLoop(Options) (Engine, error) {
	return nil, errors.New("the eventloop engine needs Linux (epoll); use --engine=goroutine")
}
