package iptables

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
)

// The writer's comment is strconv.Quote of its parts joined, whatever
// bytes they hold: plain ones copied as they are, others quoted whole.
func TestCommentQuotesAsStrconvQuote(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	alphabet := []string{"a", "Z", "0", "/", ":", " ", "-", ">", "\"", "\\", "\t", "\n", "\x00", "\x7f", "é", "日", "\xff", "~", "'"}
	for i := 0; i < 5000; i++ {
		parts := make([]string, 1+rng.IntN(3))
		for j := range parts {
			var b strings.Builder
			for k := rng.IntN(6); k > 0; k-- {
				b.WriteString(alphabet[rng.IntN(len(alphabet))])
			}
			parts[j] = b.String()
		}
		var w writer
		w.comment(parts...)
		if want := " -m comment --comment " + strconv.Quote(strings.Join(parts, "")); w.b.String() != want {
			t.Fatalf("comment(%q) = %q, want %q", parts, w.b.String(), want)
		}
	}
}

// The writer's probability is kube-proxy's fmt "%0.10f" of 1/n.
func TestProbabilityIsKubeProxysFormat(t *testing.T) {
	for n := 1; n <= 5000; n++ {
		var w writer
		w.probability(n)
		if want := " " + fmt.Sprintf("%0.10f", 1.0/float64(n)); w.b.String() != want {
			t.Fatalf("probability(%d) = %q, want %q", n, w.b.String(), want)
		}
	}
}
