package main

import (
	"errors"
	"testing"
)

func TestEphemeralProxyPortsReadTheKernelsRange(t *testing.T) {
	files := map[string]string{procEphemeralRange: "40000\t40003\n", procReservedPorts: "80,40000-40001,40003\n"}
	read := func(name string) ([]byte, error) {
		s, ok := files[name]
		if !ok {
			return nil, errors.New("no such file")
		}
		return []byte(s), nil
	}
	a, err := ephemeralProxyPorts(read)
	if err != nil {
		t.Fatal(err)
	}
	if p, _ := a.Next(); p != 40002 {
		t.Fatalf("Next = %d, want 40002, the range's one port not reserved", p)
	}
	if p, _ := a.Next(); p != 0 {
		t.Fatalf("Next = %d, want 0 (the kernel's choice)", p)
	}
	for _, bad := range []map[string]string{
		{procEphemeralRange: "60999 32768", procReservedPorts: ""},
		{procEphemeralRange: "32768 60999", procReservedPorts: "80-70"},
		{procEphemeralRange: "32768 60999"},
		{},
	} {
		files = bad
		a, err := ephemeralProxyPorts(read)
		if err == nil {
			t.Errorf("%v: no error", bad)
		}
		if p, _ := a.Next(); p != 0 {
			t.Errorf("%v: Next = %d, want the kernel's choice", bad, p)
		}
	}
}
