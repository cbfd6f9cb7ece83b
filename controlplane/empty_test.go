package controlplane

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/sluice-proxy/sluice/lb"
)

// loadedSource is a ManifestSource on dir that has loaded goodManifest
// from svc.yaml.
func loadedSource(t *testing.T) (*ManifestSource, *recordingSink, string) {
	t.Helper()
	dir := t.TempDir()
	file := filepath.Join(dir, "svc.yaml")
	if err := os.WriteFile(file, []byte(goodManifest), 0o644); err != nil {
		t.Fatal(err)
	}
	sink := &recordingSink{snaps: make(chan *lb.Snapshot, 16), rejects: make(chan error, 16)}
	src := &ManifestSource{Path: dir, Sink: sink}
	if err := src.Load(); err != nil {
		t.Fatal(err)
	}
	if s := <-sink.snaps; s.Ports.Len() == 0 {
		t.Fatal("the good manifest has no ports")
	}
	return src, sink, file
}

// reloadRejected reloads and returns the rejection; a publish fails.
func reloadRejected(t *testing.T, src *ManifestSource, sink *recordingSink) error {
	t.Helper()
	src.Reload()
	select {
	case err := <-sink.rejects:
		return err
	case s := <-sink.snaps:
		t.Fatalf("published %d service ports; want a rejection", s.Ports.Len())
	}
	return nil
}

// A file truncated by a tool that has not written yet, or left with only
// comments, must not take every Service off the node (issue 19, item 1).
func TestEmptyManifestFileIsRejectedNotApplied(t *testing.T) {
	for name, content := range map[string]string{
		"truncated":     "",
		"blank":         "\n  \n",
		"comments only": "# managed by a tool\n---\n# nothing yet\n",
		"separators":    "---\n---\n",
	} {
		t.Run(name, func(t *testing.T) {
			src, sink, file := loadedSource(t)
			if err := os.WriteFile(file, []byte(content), 0o644); err != nil {
				t.Fatal(err)
			}
			err := reloadRejected(t, src, sink)
			if !errors.Is(err, ErrEmptyFile) || !strings.Contains(err.Error(), file) {
				t.Fatalf("rejection %q does not name the empty file %s", err, file)
			}
		})
	}
}

// Emptying the directory (every file deleted) is refused too, and counted
// as a rejection; an empty List says "serve nothing" on purpose.
func TestRemovingEveryServiceNeedsAnExplicitEmptyList(t *testing.T) {
	src, sink, file := loadedSource(t)
	if err := os.Remove(file); err != nil {
		t.Fatal(err)
	}
	if err := reloadRejected(t, src, sink); !errors.Is(err, ErrWouldRemoveEveryService) {
		t.Fatalf("rejection %v, want ErrWouldRemoveEveryService", err)
	}
	// A second file with only an EndpointSlice still leaves no Service.
	other := filepath.Join(filepath.Dir(file), "eps.yaml")
	eps := "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: web-1, namespace: demo, labels: {kubernetes.io/service-name: web}}\naddressType: IPv4\nendpoints: []\n"
	if err := os.WriteFile(other, []byte(eps), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := reloadRejected(t, src, sink); !errors.Is(err, ErrWouldRemoveEveryService) {
		t.Fatalf("rejection %v, want ErrWouldRemoveEveryService", err)
	}
	// On purpose: an empty List.
	os.Remove(other)
	if err := os.WriteFile(file, []byte("apiVersion: v1\nkind: List\nitems: []\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	src.Reload()
	select {
	case s := <-sink.snaps:
		if s.Ports.Len() != 0 {
			t.Fatalf("explicit empty List published %d ports", s.Ports.Len())
		}
	case err := <-sink.rejects:
		t.Fatalf("explicit empty List rejected: %v", err)
	}
	// From nothing, a new Service is served again.
	if err := os.WriteFile(filepath.Join(filepath.Dir(file), "svc2.yaml"), []byte(goodManifest), 0o644); err != nil {
		t.Fatal(err)
	}
	src.Reload()
	if s := <-sink.snaps; s.Ports.Len() == 0 {
		t.Fatal("new Service not published")
	}
}

// At start-up an empty file is an error that names it, as any bad file is.
func TestEmptyManifestFileFailsStartUp(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "svc.yaml")
	os.WriteFile(file, nil, 0o644)
	src := &ManifestSource{Path: dir, Sink: &recordingSink{snaps: make(chan *lb.Snapshot, 1), rejects: make(chan error, 1)}}
	if err := src.Load(); !errors.Is(err, ErrEmptyFile) || !strings.Contains(err.Error(), file) {
		t.Fatalf("Load = %v, want ErrEmptyFile naming %s", err, file)
	}
	// An empty directory is still a valid start (nothing to serve yet).
	if err := (&ManifestSource{Path: t.TempDir(), Sink: &recordingSink{snaps: make(chan *lb.Snapshot, 1)}}).Load(); err != nil {
		t.Fatalf("empty directory: %v", err)
	}
}

// A load over the size limit is refused before anything is decoded, at
// start-up as on a reload, naming the file that crossed it (issue 19, item
// 9: a 50 MB file once peaked at 663 MB of RSS).
func TestManifestsOverTheSizeLimitAreRefused(t *testing.T) {
	src, sink, file := loadedSource(t)
	src.MaxBytes = int64(len(goodManifest)) + 100
	big := filepath.Join(filepath.Dir(file), "zz-big.yaml")
	if err := os.WriteFile(big, []byte("# padding\n"+strings.Repeat("#", 200)+"\n"+goodManifest), 0o644); err != nil {
		t.Fatal(err)
	}
	err := reloadRejected(t, src, sink)
	if !errors.Is(err, ErrManifestsTooLarge) || !strings.Contains(err.Error(), big) {
		t.Fatalf("rejection %v, want ErrManifestsTooLarge naming %s", err, big)
	}
	fresh := &ManifestSource{Path: filepath.Dir(file), Sink: sink, MaxBytes: src.MaxBytes}
	if err := fresh.Load(); !errors.Is(err, ErrManifestsTooLarge) {
		t.Fatalf("start-up load: %v, want ErrManifestsTooLarge", err)
	}
	// Under the limit again: served.
	os.Remove(big)
	src.Reload()
	select {
	case err := <-sink.rejects:
		t.Fatalf("rejected under the limit: %v", err)
	case <-sink.snaps:
	default: // unchanged from the last good state: nothing published
	}
}

// Thousands of broken objects make one bounded report: the first
// MaxReportedErrors and a count of the rest, and no more culprits than
// that for the per-object rejection metric.
func TestManyErrorsAreReportedBounded(t *testing.T) {
	src, sink, file := loadedSource(t)
	var b strings.Builder
	for i := 0; i < 500; i++ {
		fmt.Fprintf(&b, "apiVersion: v1\nkind: Service\nmetadata: {name: s%d, namespace: x}\nspec:\n  ports: [{name: p, port: 70000}]\n---\n", i)
	}
	if err := os.WriteFile(file, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	err := reloadRejected(t, src, sink)
	msg := err.Error()
	if n := strings.Count(msg, "\n") + 1; n != MaxReportedErrors+1 {
		t.Fatalf("%d lines reported, want %d and a summary:\n%s", n, MaxReportedErrors+1, msg)
	}
	if !strings.Contains(msg, "and 480 more errors") || !strings.Contains(msg, "Service x/s0") {
		t.Fatalf("report %q: want the first objects named and the other 480 counted", msg)
	}
	if c := Culprits(err); len(c) != MaxReportedErrors {
		t.Fatalf("%d culprits, want %d", len(c), MaxReportedErrors)
	}
}

// A YAML syntax error names the line in the file, not in its document
// (issue 17: line 15 where the editor showed 55).
func TestYAMLErrorsNameTheFilesLine(t *testing.T) {
	src, sink, file := loadedSource(t)
	bad := goodManifest + "---\napiVersion: v1\nkind: Service\nmetadata: {name: broken, namespace: demo}\nspec:\n  ports: [{port: 80\n"
	if err := os.WriteFile(file, []byte(bad), 0o644); err != nil {
		t.Fatal(err)
	}
	err := reloadRejected(t, src, sink)
	want := strings.Count(goodManifest, "\n") + 7 // the unclosed flow sequence's line, counted in the file
	m := regexp.MustCompile(`line (\d+)`).FindStringSubmatch(err.Error())
	if m == nil {
		t.Fatalf("no line in %q", err)
	}
	t.Logf("%v (want %d)", err, want)
	if got, _ := strconv.Atoi(m[1]); got < want-1 || got > want {
		t.Fatalf("error names line %d, want the file's line %d (the document's would be about %d): %v", got, want, 6, err)
	}
}

// A rejection logs one line per problem, and the first good read after a
// rejection says so (issue 17: errors joined with literal \n, and a
// restored file logged nothing).
func TestRejectionsLogOneLineEachAndRecoveryIsLogged(t *testing.T) {
	src, sink, file := loadedSource(t)
	var logs bytes.Buffer
	src.Log = slog.New(slog.NewTextHandler(&logs, nil))
	two := "apiVersion: v1\nkind: Service\nmetadata: {name: a, namespace: x}\nspec:\n  ports: [{name: p, port: 70000}]\n---\n" +
		"apiVersion: v1\nkind: Service\nmetadata: {name: b, namespace: x}\nspec:\n  ports: [{name: p, port: 70001}]\n"
	if err := os.WriteFile(file, []byte(two), 0o644); err != nil {
		t.Fatal(err)
	}
	reloadRejected(t, src, sink)
	lines := strings.Split(strings.TrimSpace(logs.String()), "\n")
	if len(lines) != 2 || !strings.Contains(lines[0], "Service x/a") || !strings.Contains(lines[1], "Service x/b") || strings.Contains(logs.String(), `\n`) {
		t.Fatalf("want one line per problem:\n%s", logs.String())
	}
	logs.Reset()
	if err := os.WriteFile(file, []byte(goodManifest), 0o644); err != nil {
		t.Fatal(err)
	}
	src.Reload()
	if !strings.Contains(logs.String(), "manifests accepted again") {
		t.Fatalf("restoring the good file logged: %q", logs.String())
	}
}

// Two Services claiming one NodePort and protocol are refused, naming
// both (issue 17: it passed and failed later at bind); the same port
// number over TCP and UDP is fine.
func TestDuplicateNodePortIsRefused(t *testing.T) {
	svc := func(name, proto string) string {
		return fmt.Sprintf("apiVersion: v1\nkind: Service\nmetadata: {name: %s, namespace: x}\nspec:\n  type: NodePort\n  ports: [{name: p, port: 80, nodePort: 30100, protocol: %s}]\n---\n", name, proto)
	}
	for _, build := range []string{"memo", "full"} {
		objs, err := ParseManifest("m.yaml", []byte(svc("a", "TCP")+svc("b", "TCP")))
		if err != nil {
			t.Fatal(err)
		}
		if build == "memo" {
			var m BuildMemo
			_, err = m.Build(objs, "")
		} else {
			_, err = Build(objs)
		}
		if err == nil || !strings.Contains(err.Error(), "Service x/b") || !strings.Contains(err.Error(), "30100/TCP is already Service x/a's") {
			t.Fatalf("%s build: %v, want the duplicate NodePort refused naming both", build, err)
		}
		objs, _ = ParseManifest("m.yaml", []byte(svc("a", "TCP")+svc("b", "UDP")))
		if _, err := Build(objs); err != nil {
			t.Fatalf("%s build, same port over TCP and UDP: %v", build, err)
		}
	}
}

// An application's manifest directory (a Deployment, a ConfigMap, an
// Ingress beside the Service) loads: other kinds are read and left alone,
// a file of them alone is not "empty", and a misspelt core kind is still
// an error (issue 17: one Deployment made the directory unusable).
func TestOtherKindsAreLeftAlone(t *testing.T) {
	src, sink, file := loadedSource(t)
	dir := filepath.Dir(file)
	app := "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web, namespace: demo}\nspec: {replicas: 2}\n---\n" +
		"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: web, namespace: demo}\ndata: {a: b}\n---\n" +
		"apiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata: {name: web, namespace: demo}\n"
	if err := os.WriteFile(filepath.Join(dir, "app.yaml"), []byte(app), 0o644); err != nil {
		t.Fatal(err)
	}
	src.Reload()
	select {
	case err := <-sink.rejects:
		t.Fatalf("an application directory was refused: %v", err)
	default:
	}
	if err := os.WriteFile(filepath.Join(dir, "typo.yaml"), []byte("apiVersion: v1\nkind: Servce\nmetadata: {name: x, namespace: demo}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := reloadRejected(t, src, sink); !strings.Contains(err.Error(), `unknown kind "Servce"`) {
		t.Fatalf("a misspelt kind: %v", err)
	}
}

// A health-check node port that is another Service's NodePort, and a
// NodePort on a port sluice itself listens on (its health server, its
// proxy port range), are refused at validation naming both owners; a
// Service's health-check port shared by its own ports is fine.
func TestHostPortClashesAreRefused(t *testing.T) {
	svc := func(name string, nodePort int, extra string) string {
		return fmt.Sprintf("apiVersion: v1\nkind: Service\nmetadata: {name: %s, namespace: x}\nspec:\n  type: LoadBalancer\n%s  ports: [{name: p, port: 80, nodePort: %d}, {name: q, port: 81, nodePort: %d}]\n---\n", name, extra, nodePort, nodePort+1)
	}
	reserved := []HostPort{
		{Proto: lb.TCP, First: 10256, Last: 10256, Owner: "--healthz-bind-address 0.0.0.0:10256"},
		{First: 31000, Last: 31099, Owner: "--proxy-port-range 31000-31099"},
	}
	for _, tc := range []struct {
		name, manifests, want string
	}{
		{"health check port on a NodePort", svc("a", 30100, "") + svc("b", 30200, "  externalTrafficPolicy: Local\n  healthCheckNodePort: 30101\n"),
			"Service x/b: spec.healthCheckNodePort: 30101/TCP is already Service x/a's (spec.ports[q].nodePort)"},
		{"NodePort on the health server", svc("a", 10255, ""), "Service x/a: spec.ports[q].nodePort: 10256/TCP is sluice's own (--healthz-bind-address 0.0.0.0:10256)"},
		{"NodePort in the proxy port range", svc("a", 31050, ""), "Service x/a: spec.ports[p].nodePort: 31050/TCP is sluice's own (--proxy-port-range 31000-31099)"},
		{"own health check port", svc("a", 30100, "  externalTrafficPolicy: Local\n  healthCheckNodePort: 30300\n"), ""},
	} {
		objs, err := ParseManifest("m.yaml", []byte(tc.manifests))
		if err != nil {
			t.Fatal(err)
		}
		m := BuildMemo{Reserved: reserved}
		_, err = m.Build(objs, "")
		if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
			t.Fatalf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}
}
