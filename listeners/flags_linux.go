//go:build linux

package listeners

import "golang.org/x/sys/unix"

const msgTrunc = unix.MSG_TRUNC
