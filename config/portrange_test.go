package config

import "testing"

func TestParsePortRange(t *testing.T) {
	good := map[string]PortRange{
		"":            {},
		"0":           {},
		"0-0":         {},
		"30000-30010": {Base: 30000, Size: 11},
		"8080":        {Base: 8080, Size: 1},
		"1000+5":      {Base: 1000, Size: 6},
		"65535":       {Base: 65535, Size: 1},
	}
	for in, want := range good {
		got, err := ParsePortRange(in)
		if err != nil || got != want {
			t.Errorf("ParsePortRange(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"x", "10-5", "0-10", "70000", "1-70000", "-1", "100+65500", "1+-1", "1-2-3", "5- 6"} {
		if _, err := ParsePortRange(in); err == nil {
			t.Errorf("ParsePortRange(%q) accepted", in)
		}
	}
}

func FuzzParsePortRange(f *testing.F) {
	for _, s := range []string{"", "0-0", "30000-30010", "8080", "1000+5", "x-", "+", "65535+0"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		r, err := ParsePortRange(s)
		if err != nil {
			return
		}
		if r.Base == 0 {
			if r.Size != 0 {
				t.Fatalf("random range with size %d", r.Size)
			}
			return
		}
		if r.Base < 1 || r.Size < 1 || r.Base+r.Size-1 > 65535 {
			t.Fatalf("%q parsed to out-of-range %+v", s, r)
		}
		again, err := ParsePortRange(r.String())
		if err != nil || again != r {
			t.Fatalf("round trip of %q: %+v -> %q -> %+v, %v", s, r, r.String(), again, err)
		}
	})
}
