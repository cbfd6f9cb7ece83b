package config

import (
	"fmt"
	"strconv"
	"strings"
)

// PortRange is kube-proxy's --proxy-port-range: "begin-end", a single port,
// or "begin+offset", all inclusive. The zero value (Base 0) means "let the
// kernel pick a random free port".
type PortRange struct {
	Base int
	Size int
}

// ParsePortRange parses a --proxy-port-range value. "", "0" and "0-0" mean random.
func ParsePortRange(s string) (PortRange, error) {
	s = strings.TrimSpace(s)
	if s == "" || s == "0" || s == "0-0" {
		return PortRange{}, nil
	}
	bad := func(why string) (PortRange, error) {
		return PortRange{}, fmt.Errorf("invalid port range %q: %s (want begin-end, begin+offset or a single port, within 1-65535)", s, why)
	}
	num := func(x string) (int, bool) {
		n, err := strconv.Atoi(x)
		return n, err == nil && n >= 1 && n <= 65535 && x == strings.TrimSpace(x)
	}
	if b, e, ok := strings.Cut(s, "-"); ok {
		lo, ok1 := num(b)
		hi, ok2 := num(e)
		if !ok1 || !ok2 {
			return bad("ports must be numbers 1-65535")
		}
		if hi < lo {
			return bad("end is before begin")
		}
		return PortRange{Base: lo, Size: hi - lo + 1}, nil
	}
	if b, o, ok := strings.Cut(s, "+"); ok {
		lo, ok1 := num(b)
		off, err := strconv.Atoi(o)
		if !ok1 || err != nil || off < 0 || lo+off > 65535 {
			return bad("begin must be 1-65535 and begin+offset at most 65535")
		}
		return PortRange{Base: lo, Size: off + 1}, nil
	}
	p, ok := num(s)
	if !ok {
		return bad("not a port number")
	}
	return PortRange{Base: p, Size: 1}, nil
}

// String formats the range as begin-end, or "" when random.
func (r PortRange) String() string {
	if r.Base == 0 {
		return ""
	}
	return fmt.Sprintf("%d-%d", r.Base, r.Base+r.Size-1)
}
