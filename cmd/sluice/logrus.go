package main

import (
	"io"
	"log/slog"
	"strings"

	"github.com/sirupsen/logrus"
)

// routeLogrus sends the lines of libraries that log through logrus (moby/ipvs)
// into sluice's own log, in its format (--logging-format=json included).
// moby/ipvs's two lines on a kernel without IPVS (a failed modprobe, "Could
// not get ipvs family information") are part of the ordinary fall-back,
// which sluice explains in its own line, so they become debug lines rather
// than a frightening level=error.
func routeLogrus(log *slog.Logger) {
	logrus.SetOutput(io.Discard)
	logrus.SetLevel(logrus.DebugLevel)
	logrus.AddHook(logrusHook{log: log.With("from", "moby/ipvs")})
}

type logrusHook struct{ log *slog.Logger }

func (logrusHook) Levels() []logrus.Level { return logrus.AllLevels }

func (h logrusHook) Fire(e *logrus.Entry) error {
	msg := e.Message
	switch {
	case strings.HasPrefix(msg, "Running modprobe ip_vs failed"), strings.HasPrefix(msg, "Could not get ipvs family information"):
		h.log.Debug(msg)
	case e.Level <= logrus.ErrorLevel:
		h.log.Error(msg)
	case e.Level == logrus.WarnLevel:
		h.log.Warn(msg)
	case e.Level == logrus.InfoLevel:
		h.log.Info(msg)
	default:
		h.log.Debug(msg)
	}
	return nil
}
