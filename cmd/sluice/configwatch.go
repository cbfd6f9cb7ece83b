package main

import (
	"context"
	"errors"
	"log/slog"
	"path/filepath"
	"reflect"
	"time"

	"github.com/fsnotify/fsnotify"

	"github.com/sluice-proxy/sluice/config"
)

// errConfigChanged ends a sluice whose --config file was rewritten, with
// kube-proxy's words: kube-proxy exits when its configuration file is
// written, so that its supervisor (kubelet, systemd) starts it again with
// the new file, and sluice does the same.
var errConfigChanged = errors.New("content of the proxy server's configuration file was updated")

// configWatch watches a --config file for the rewrites kube-proxy exits
// on: a write to the file, or a file renamed over it (an editor's save).
// Unlike kube-proxy, it reads the file first: a file that no longer parses
// (or fails validation) is logged and the running sluice goes on serving
// with the configuration it read at start, and a file that parses to that
// same configuration changes nothing. A file that is a symbolic link (a
// ConfigMap mounted in a pod, whose updates kubelet makes by swapping
// ..data) sees no event for its own name, so its updates take a rollout,
// as kube-proxy's do.
type configWatch struct {
	path  string
	parse func() (*config.Config, error) // the command line, parsed again
	log   *slog.Logger
	after func(time.Duration) <-chan time.Time
}

// run watches until ctx ends, and calls changed once, when the file parses
// to a configuration other than running.
func (c configWatch) run(ctx context.Context, running *config.Config, changed func()) error {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return err
	}
	defer w.Close()
	// The directory, not the file: a save renamed over the file leaves a
	// watch on the file itself watching the old one.
	path := filepath.Clean(c.path)
	if err := w.Add(filepath.Dir(path)); err != nil {
		return err
	}
	// The file is read once its events have stopped for settle: a write in
	// place is a truncation and then the writes, and reading between them
	// would find half a file.
	var settled <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			return nil
		case err, ok := <-w.Errors:
			if !ok {
				return nil
			}
			c.log.Warn("--config watch error; a change may go unnoticed until a restart", "path", c.path, "err", err)
		case ev, ok := <-w.Events:
			if !ok {
				return nil
			}
			if filepath.Clean(ev.Name) == path && (ev.Has(fsnotify.Write) || ev.Has(fsnotify.Create)) {
				settled = c.after(configSettle)
			}
		case <-settled:
			settled = nil
			next, err := c.parse()
			if err != nil {
				c.log.Error("the --config file changed and is not valid: still serving with the configuration read at start", "path", c.path, "err", err)
				continue
			}
			if reflect.DeepEqual(next, running) {
				c.log.Debug("the --config file was rewritten with the same configuration", "path", c.path)
				continue
			}
			c.log.Info("the --config file changed: exiting, to be started again with it, as kube-proxy does", "path", c.path)
			changed()
			return nil
		}
	}
}

// configSettle is how long a --config file's events must have stopped
// before it is read.
const configSettle = 100 * time.Millisecond
