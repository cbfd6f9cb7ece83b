//go:build unix

package listeners

import "golang.org/x/sys/unix"

// processFDLimit is RLIMIT_NOFILE's soft limit (Go raises it to the hard
// limit at start-up); 0 when unknown or unlimited.
func processFDLimit() int64 {
	var r unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &r); err != nil || r.Cur == unix.RLIM_INFINITY || r.Cur > 1<<40 {
		return 0
	}
	return int64(r.Cur)
}
