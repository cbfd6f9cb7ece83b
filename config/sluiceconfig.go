package config

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	logsapi "k8s.io/component-base/logs/api/v1"
	kpv1alpha1 "k8s.io/kube-proxy/config/v1alpha1"
	sigsjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

// SluiceAPIVersion and SluiceKind name sluice's own configuration
// document, which a --config file carries beside its
// KubeProxyConfiguration (a second YAML document), so that a ConfigMap-driven
// DaemonSet can set sluice's settings without flags.
const (
	SluiceAPIVersion = "config.sluice-proxy.io/v1alpha1"
	SluiceKind       = "SluiceConfiguration"
)

// SluiceConfiguration is sluice's own settings as a --config document.
// Every field is optional: an absent one keeps its default (or what the
// flag says; flags override the file). Each field is documented by the flag
// it mirrors, named in its comment.
type SluiceConfiguration struct {
	metav1.TypeMeta `json:",inline"`

	Manifests        *string          `json:"manifests,omitempty"`        // --manifests
	ManifestCoalesce *metav1.Duration `json:"manifestCoalesce,omitempty"` // --manifest-coalesce
	ManifestMaxBytes *int64           `json:"manifestMaxBytes,omitempty"` // --manifest-max-bytes
	Engine           *string          `json:"engine,omitempty"`           // --engine
	EventLoops       *int             `json:"eventLoops,omitempty"`       // --event-loops
	BusyPoll         *metav1.Duration `json:"busyPoll,omitempty"`         // --busy-poll
	IOUring          *bool            `json:"ioUring,omitempty"`          // --io-uring
	UDPTimeout       *metav1.Duration `json:"udpTimeout,omitempty"`       // --udp-timeout
	UserspaceCapture *string          `json:"userspaceCapture,omitempty"` // --userspace-capture
	// UserspaceCapturePort is --userspace-capture-port.
	UserspaceCapturePort *int    `json:"userspaceCapturePort,omitempty"`
	IPTablesBackend      *string `json:"iptablesBackend,omitempty"` // --iptables-backend
	ModeFallback         *bool   `json:"modeFallback,omitempty"`    // --mode-fallback
	// IPVSDrainInterval is --ipvs-drain-interval.
	IPVSDrainInterval *metav1.Duration `json:"ipvsDrainInterval,omitempty"`
	Connect           *SluiceConnect   `json:"connect,omitempty"`
	Ejection          *SluiceEjection  `json:"ejection,omitempty"`
	DrainTimeout      *metav1.Duration `json:"drainTimeout,omitempty"`   // --drain-timeout
	HandoverSocket    *string          `json:"handoverSocket,omitempty"` // --handover-socket ("" turns it off)
}

// SluiceConnect is how a userspace connection reaches an endpoint.
type SluiceConnect struct {
	Timeouts []metav1.Duration `json:"timeouts,omitempty"` // --connect-timeouts
	Attempts *int              `json:"attempts,omitempty"` // --connect-attempts
	Budget   *metav1.Duration  `json:"budget,omitempty"`   // --connect-budget
}

// SluiceEjection is passive ejection of failing endpoints.
type SluiceEjection struct {
	After      *int             `json:"after,omitempty"`      // --eject-after (0 turns it off)
	Backoff    *metav1.Duration `json:"backoff,omitempty"`    // --eject-backoff
	MaxBackoff *metav1.Duration `json:"maxBackoff,omitempty"` // --eject-max-backoff
}

// sluiceFields maps sluice's flags to their SluiceConfiguration fields,
// for errors that name both.
var sluiceFields = map[string]string{
	"manifests": "manifests", "manifest-coalesce": "manifestCoalesce", "manifest-max-bytes": "manifestMaxBytes",
	"engine": "engine", "event-loops": "eventLoops", "busy-poll": "busyPoll", "io-uring": "ioUring", "udp-timeout": "udpTimeout",
	"userspace-capture": "userspaceCapture", "userspace-capture-port": "userspaceCapturePort", "iptables-backend": "iptablesBackend", "mode-fallback": "modeFallback",
	"ipvs-drain-interval": "ipvsDrainInterval", "connect-timeouts": "connect.timeouts", "connect-attempts": "connect.attempts",
	"connect-budget": "connect.budget", "eject-after": "ejection.after", "eject-backoff": "ejection.backoff",
	"eject-max-backoff": "ejection.maxBackoff", "drain-timeout": "drainTimeout", "handover-socket": "handoverSocket",
}

// apply sets what the document gives over c.
func (s *SluiceConfiguration) apply(c *Config) {
	str := func(dst *string, v *string) {
		if v != nil {
			*dst = *v
		}
	}
	d := func(dst *time.Duration, v *metav1.Duration) {
		if v != nil {
			*dst = v.Duration
		}
	}
	num := func(dst *int, v *int) {
		if v != nil {
			*dst = *v
		}
	}
	str(&c.Manifests, s.Manifests)
	d(&c.ManifestCoalesce, s.ManifestCoalesce)
	if s.ManifestMaxBytes != nil {
		c.ManifestMaxBytes = *s.ManifestMaxBytes
	}
	str(&c.Engine, s.Engine)
	num(&c.EventLoops, s.EventLoops)
	d(&c.BusyPoll, s.BusyPoll)
	if s.IOUring != nil {
		c.IOUring = *s.IOUring
	}
	d(&c.UDPTimeout, s.UDPTimeout)
	str(&c.UserspaceCapture, s.UserspaceCapture)
	num(&c.UserspaceCapturePort, s.UserspaceCapturePort)
	str(&c.IPTablesBackend, s.IPTablesBackend)
	if s.ModeFallback != nil {
		c.ModeFallback = *s.ModeFallback
	}
	d(&c.IPVSDrainInterval, s.IPVSDrainInterval)
	if k := s.Connect; k != nil {
		if k.Timeouts != nil {
			c.ConnectTimeouts = make([]time.Duration, len(k.Timeouts))
			for i, t := range k.Timeouts {
				c.ConnectTimeouts[i] = t.Duration
			}
		}
		num(&c.ConnectAttempts, k.Attempts)
		d(&c.ConnectBudget, k.Budget)
	}
	if e := s.Ejection; e != nil {
		num(&c.EjectAfter, e.After)
		d(&c.EjectBackoff, e.Backoff)
		d(&c.EjectMaxBackoff, e.MaxBackoff)
	}
	d(&c.DrainTimeout, s.DrainTimeout)
	str(&c.HandoverSocket, s.HandoverSocket)
}

// sluiceConfigurationOf is c's effective sluice settings, every field set.
func sluiceConfigurationOf(c *Config) SluiceConfiguration {
	md := func(d time.Duration) *metav1.Duration { return &metav1.Duration{Duration: d} }
	ptr := func(s string) *string { return &s }
	num := func(n int) *int { return &n }
	timeouts := make([]metav1.Duration, len(c.ConnectTimeouts))
	for i, t := range c.ConnectTimeouts {
		timeouts[i] = metav1.Duration{Duration: t}
	}
	mb, fb, iu := c.ManifestMaxBytes, c.ModeFallback, c.IOUring
	return SluiceConfiguration{
		TypeMeta:             metav1.TypeMeta{APIVersion: SluiceAPIVersion, Kind: SluiceKind},
		Manifests:            ptr(c.Manifests),
		ManifestCoalesce:     md(c.ManifestCoalesce),
		ManifestMaxBytes:     &mb,
		Engine:               ptr(c.Engine),
		EventLoops:           num(c.EventLoops),
		BusyPoll:             md(c.BusyPoll),
		IOUring:              &iu,
		UDPTimeout:           md(c.UDPTimeout),
		UserspaceCapture:     ptr(c.UserspaceCapture),
		UserspaceCapturePort: num(c.UserspaceCapturePort),
		IPTablesBackend:      ptr(c.IPTablesBackend),
		ModeFallback:         &fb,
		IPVSDrainInterval:    md(c.IPVSDrainInterval),
		Connect:              &SluiceConnect{Timeouts: timeouts, Attempts: num(c.ConnectAttempts), Budget: md(c.ConnectBudget)},
		Ejection:             &SluiceEjection{After: num(c.EjectAfter), Backoff: md(c.EjectBackoff), MaxBackoff: md(c.EjectMaxBackoff)},
		DrainTimeout:         md(c.DrainTimeout),
		HandoverSocket:       ptr(c.HandoverSocket),
	}
}

// configDocument is one YAML document of a --config file and the line it
// starts on.
type configDocument struct {
	data []byte
	line int
}

// splitDocuments splits a --config file into its YAML documents (a JSON
// file is one) at "---" lines, as the YAML reader kube-proxy's decoders
// use does, dropping empty ones, each with the line it starts on.
func splitDocuments(data []byte) []configDocument {
	var docs []configDocument
	var cur []byte
	start, content := 1, false
	flush := func() {
		if content {
			docs = append(docs, configDocument{data: cur, line: start})
		}
		cur, content = nil, false
	}
	for i, l := range bytes.SplitAfter(data, []byte("\n")) {
		if rest, ok := bytes.CutPrefix(l, []byte("---")); ok {
			if r := bytes.TrimSpace(rest); len(r) == 0 || r[0] == '#' {
				flush()
				start = i + 2
				continue
			}
		}
		if t := bytes.TrimSpace(l); len(t) > 0 && t[0] != '#' {
			if !content {
				start = i + 1
			}
			content = true
		}
		cur = append(cur, l...)
	}
	flush()
	return docs
}

// loadSluiceDocument strictly decodes a SluiceConfiguration document over c.
func loadSluiceDocument(where string, data []byte, c *Config) error {
	var s SluiceConfiguration
	j, err := yaml.YAMLToJSON(data)
	if err != nil {
		return fmt.Errorf("%s: malformed YAML: %w", where, err)
	}
	// sigs.k8s.io/json names an unknown field by its path
	// (ejection.afterr), where the YAML decoder gives only its name.
	strict, err := sigsjson.UnmarshalStrict(j, &s)
	if err != nil {
		return fmt.Errorf("%s: %w", where, cleanYAMLError(err))
	}
	if len(strict) > 0 {
		return fmt.Errorf("%s: %w", where, errors.Join(strict...))
	}
	s.apply(c)
	return nil
}

// cleanYAMLError drops the decoders' nested prefixes ("error unmarshaling
// JSON: while decoding JSON: json: ") so the message leads with the field.
func cleanYAMLError(err error) error {
	msg := err.Error()
	for _, p := range []string{"error unmarshaling JSON: ", "while decoding JSON: ", "json: "} {
		msg = strings.TrimPrefix(msg, p)
	}
	return errors.New(msg)
}

// WriteFile writes the effective configuration as --write-config-to does:
// the KubeProxyConfiguration first (kube-proxy reads only the first
// document of a --config file, so the file stays usable by kube-proxy),
// then the SluiceConfiguration with every sluice setting.
func (c *Config) WriteFile(path string) error {
	kp := c.KubeProxy
	kp.APIVersion = kpv1alpha1.SchemeGroupVersion.String()
	kp.Kind = "KubeProxyConfiguration"
	kp.Logging.Format = c.LogFormat
	kp.Logging.Verbosity = logsapi.VerbosityLevel(max(c.Verbosity, 0))
	kpData, err := yaml.Marshal(&kp)
	if err != nil {
		return err
	}
	s := sluiceConfigurationOf(c)
	sData, err := yaml.Marshal(&s)
	if err != nil {
		return err
	}
	var buf bytes.Buffer
	buf.Write(kpData)
	buf.WriteString("---\n")
	buf.Write(sData)
	return os.WriteFile(path, buf.Bytes(), 0o644)
}
