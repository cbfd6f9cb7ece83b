package config

import (
	"os"
	"regexp"
	"slices"
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

// The README's Flags section names every flag (literally, or by a prefix
// such as --iptables-*), Windows's own included, and names no flag that
// does not exist.
func TestREADMEFlagsMatchTheFlagSet(t *testing.T) {
	data, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	text := string(data)
	start := strings.Index(text, "\n## Flags\n")
	if start < 0 {
		t.Fatal("README has no Flags section")
	}
	section := text[start+1:]
	if end := strings.Index(section[3:], "\n## "); end >= 0 {
		section = section[:end+3]
	}
	mentioned := map[string]bool{}
	var prefixes []string
	for _, m := range regexp.MustCompile("`(--[a-z0-9-]+\\*?|-v)[ `/=]").FindAllStringSubmatch(section, -1) {
		name := strings.TrimLeft(m[1], "-")
		if p, ok := strings.CutSuffix(name, "*"); ok {
			prefixes = append(prefixes, p)
			continue
		}
		mentioned[name] = true
	}
	names := map[string]bool{}
	all := newFlagSet(Defaults()) // with the flags of every OS
	if all.Lookup("source-vip") == nil {
		addOSFlags(all, &Defaults().KubeProxy, "windows")
	}
	all.VisitAll(func(f *pflag.Flag) {
		names[f.Name] = true
		if !mentioned[f.Name] && !slices.ContainsFunc(prefixes, func(p string) bool { return strings.HasPrefix(f.Name, p) }) {
			t.Errorf("--%s is not in the README's Flags section", f.Name)
		}
	})
	for name := range mentioned {
		if !names[name] {
			t.Errorf("the README's Flags section names --%s, which sluice does not have", name)
		}
	}
}
