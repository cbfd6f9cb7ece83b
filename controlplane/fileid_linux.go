//go:build linux

package controlplane

import (
	"os"
	"syscall"
	"time"
)

// fileID is what tells a file's versions apart without reading it: its
// device and inode (an editor's save by rename makes a new one), size, and
// modification and change times (the change time cannot be set back).
type fileID struct {
	dev, ino     uint64
	size         int64
	mtime, ctime int64
	changed      time.Time // the later of the two times
}

func identify(fi os.FileInfo) (fileID, bool) {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return fileID{}, false
	}
	mtime := fi.ModTime()
	ctime := time.Unix(int64(st.Ctim.Sec), int64(st.Ctim.Nsec))
	changed := mtime
	if ctime.After(changed) {
		changed = ctime
	}
	return fileID{dev: uint64(st.Dev), ino: uint64(st.Ino), size: fi.Size(), mtime: mtime.UnixNano(), ctime: ctime.UnixNano(), changed: changed}, true
}
