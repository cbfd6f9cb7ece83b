//go:build linux

package main

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"

	"golang.org/x/sys/unix"

	"github.com/sluice-proxy/sluice/config"
)

// prepareProcess applies --oom-score-adj and raises the open-file limit to
// its hard maximum, as kube-proxy's userspace mode did (it needs two file
// descriptors per proxied connection).
func prepareProcess(cfg *config.Config, log *slog.Logger) error {
	var errs []error
	if adj := cfg.KubeProxy.OOMScoreAdj; adj != nil {
		if err := os.WriteFile("/proc/self/oom_score_adj", []byte(fmt.Sprint(*adj)), 0); err != nil {
			err = fmt.Errorf("--oom-score-adj=%d: %w", *adj, err)
			if slices.Contains(cfg.Changed, "oom-score-adj") {
				errs = append(errs, err)
			} else {
				// The default too: under memory pressure the kernel would
				// pick the data plane sooner than an operator expects.
				log.Warn("default oom-score-adj not applied", "err", err)
			}
		}
	}
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &rl); err == nil && rl.Cur < rl.Max {
		rl.Cur = rl.Max
		if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &rl); err != nil {
			errs = append(errs, fmt.Errorf("raise RLIMIT_NOFILE: %w", err))
		} else {
			log.Debug("raised open-file limit", "limit", rl.Cur)
		}
	}
	return errors.Join(errs...)
}
