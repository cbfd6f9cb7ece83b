//go:build linux

package listeners

import "golang.org/x/sys/unix"

const msgTrunc = unix.MSG_TRUNC

// goConnFDs is what one goroutine-engine TCP connection holds: its two
// sockets and, while io.Copy splices, a pipe (two descriptors) per
// direction from Go's pipe pool, also while it waits for data.
const goConnFDs = 6
