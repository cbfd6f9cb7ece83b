package config

import (
	"strings"
	"testing"

	"github.com/spf13/pflag"
)

// --help opens with a synopsis and examples, then lists every flag once,
// each in a named group: a new flag that no group takes fails here.
func TestHelpGroupsEveryFlagOnce(t *testing.T) {
	_, text, err := Parse([]string{"--help"})
	if !IsHelp(err) {
		t.Fatalf("--help: %v", err)
	}
	if !strings.HasPrefix(text, "sluice: ") || !strings.Contains(text, "\nUsage:\n") || !strings.Contains(text, "\nExamples:\n") {
		t.Fatalf("no synopsis:\n%s", text)
	}
	if strings.Contains(text, "\nOther:\n") {
		t.Errorf("flags outside every group:\n%s", text[strings.Index(text, "\nOther:\n"):])
	}
	newFlagSet(Defaults()).VisitAll(func(f *pflag.Flag) {
		if n := strings.Count(text, "  --"+f.Name+" ") + strings.Count(text, ", --"+f.Name+" "); n != 1 {
			t.Errorf("--%s listed %d times", f.Name, n)
		}
	})
	for _, g := range helpGroups() {
		if !strings.Contains(text, "\n"+g.title+":\n") {
			t.Errorf("group %q missing", g.title)
		}
	}
}
