package controlplane

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/lb"
)

// manifest10k is n Services with one EndpointSlice of 10 endpoints each;
// edit gives Service i's first endpoint the address 10.(v).x.y instead.
func manifestService(i, v int) string {
	var eps strings.Builder
	for e := 0; e < 10; e++ {
		a := v
		if e > 0 {
			a = 200
		}
		fmt.Fprintf(&eps, "- addresses: [10.%d.%d.%d]\n  conditions: {ready: true}\n", a, i/250, (i%250)*1+e%4)
	}
	return fmt.Sprintf(`apiVersion: v1
kind: Service
metadata: {name: s%d, namespace: bench}
spec:
  clusterIP: 10.96.%d.%d
  ports: [{name: http, port: 80, protocol: TCP}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: s%d-1, namespace: bench, labels: {kubernetes.io/service-name: s%d}}
addressType: IPv4
ports: [{name: http, port: 8080, protocol: TCP}]
endpoints:
%s---
`, i, i/250, i%250, i, i, eps.String())
}

type editSink struct{ published, unchanged int }

func (c *editSink) Publish(*lb.Snapshot) { c.published++ }
func (c *editSink) Reject(err error)     { panic(err) }
func (c *editSink) Queued()              {}
func (c *editSink) Unchanged()           { c.unchanged++ }

// BenchmarkManifestEditAt10k is a one-Service edit (one endpoint's address)
// in 10,000 Services, reloaded as the watch reloads it: in one file, and
// in a directory of a file per Service (issue 16's target: p99 at most
// 20 ms).
func BenchmarkManifestEditAt10k(b *testing.B) {
	const n = 10000
	for _, layout := range []string{"one file", "file per service"} {
		b.Run(layout, func(b *testing.B) {
			dir := b.TempDir()
			// The one file is written from texts made once into one
			// reused buffer: building it anew per edit made some 100 MB of
			// garbage, whose collection ran on into the timed reload and
			// was most of its p99.
			texts := make([]string, n)
			for i := range texts {
				texts[i] = manifestService(i, 100)
			}
			var all bytes.Buffer
			write := func(edit, v int) {
				if layout == "one file" {
					all.Reset()
					for i, text := range texts {
						if i == edit {
							text = manifestService(i, v)
						}
						all.WriteString(text)
					}
					os.WriteFile(filepath.Join(dir, "all.yaml"), all.Bytes(), 0o644)
					return
				}
				if edit < 0 {
					for i := 0; i < n; i++ {
						os.WriteFile(filepath.Join(dir, fmt.Sprintf("s%05d.yaml", i)), []byte(manifestService(i, 100)), 0o644)
					}
					return
				}
				os.WriteFile(filepath.Join(dir, fmt.Sprintf("s%05d.yaml", edit)), []byte(manifestService(edit, v)), 0o644)
			}
			write(-1, 0)
			src, sink := watchedSource(b, dir)
			timeReloads(b, src, sink, func(i int) {
				write(i%n, 101+i%2)
				if layout == "one file" {
					src.touch(filepath.Join(dir, "all.yaml"))
				} else {
					src.touch(filepath.Join(dir, fmt.Sprintf("s%05d.yaml", i%n)))
				}
			})
		})
	}
}

// BenchmarkManifestShiftAt10k is the first Service cut from (and, the
// next op, put back at the head of) one file of 10,000: every document
// after it moves, so a load cannot carry them and claims every object
// again (the worst case for a reload of one file).
func BenchmarkManifestShiftAt10k(b *testing.B) {
	const n = 10000
	dir := b.TempDir()
	var all, rest bytes.Buffer
	for i := 0; i < n; i++ {
		text := manifestService(i, 100)
		all.WriteString(text)
		if i > 0 {
			rest.WriteString(text)
		}
	}
	file := filepath.Join(dir, "all.yaml")
	os.WriteFile(file, all.Bytes(), 0o644)
	src, sink := watchedSource(b, dir)
	timeReloads(b, src, sink, func(i int) {
		if i%2 == 0 {
			os.WriteFile(file, rest.Bytes(), 0o644)
		} else {
			os.WriteFile(file, all.Bytes(), 0o644)
		}
		src.touch(file)
	})
}

// BenchmarkManifestAddAt10k is a Service added to (and, the next op,
// removed from) a directory of 10,000 Services in 100 files, as a file of
// its own, reloaded as the watch reloads it.
func BenchmarkManifestAddAt10k(b *testing.B) {
	const n, perFile = 10000, 100
	dir := serviceFiles(b, n, perFile)
	src, sink := watchedSource(b, dir)
	added := filepath.Join(dir, "f050-added.yaml")
	timeReloads(b, src, sink, func(i int) {
		if i%2 == 0 {
			os.WriteFile(added, []byte(manifestService(n, 100)), 0o644)
		} else {
			os.Remove(added)
		}
		src.touchListing(added) // made or removed, as the watch reports it
	})
}

// watchedSource is a source of dir, loaded, whose reloads come as the
// watch brings them: one event, for the edited file
// (TestAWatchedEditStatsOnlyTheEditedFile has the watch itself do so).
// Its reads happen "2 s after" the writes: the files untouched since the
// set-up are past the racy window, as files on a node are (an edited one
// changes identity, so it is read anyway).
func watchedSource(b *testing.B, dir string) (*ManifestSource, *editSink) {
	sink := &editSink{}
	src := &ManifestSource{Path: dir, Sink: sink, MaxBytes: -1, Now: func() time.Time { return time.Now().Add(2 * time.Second) }}
	if err := src.Load(); err != nil {
		b.Fatal(err)
	}
	src.setWatching(true)
	src.takeTouched()
	return src, sink
}

// serviceFiles is a directory of n Services (manifestService) in files
// of perFile each.
func serviceFiles(b *testing.B, n, perFile int) string {
	dir := b.TempDir()
	for f := 0; f < n/perFile; f++ {
		var all strings.Builder
		for i := f * perFile; i < (f+1)*perFile; i++ {
			all.WriteString(manifestService(i, 100))
		}
		os.WriteFile(filepath.Join(dir, fmt.Sprintf("f%03d.yaml", f)), []byte(all.String()), 0o644)
	}
	return dir
}

// timeReloads times b.N reloads of src, each after change(i) untimed, as
// the watch brings them, reports their p50 and p99, and checks that each
// was published to sink (beside the first load).
func timeReloads(b *testing.B, src *ManifestSource, sink *editSink, change func(i int)) {
	took := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		change(i)
		b.StartTimer()
		t0 := time.Now()
		src.reload(UpdateTimes{})
		took = append(took, time.Since(t0))
	}
	b.StopTimer()
	slices.Sort(took)
	b.ReportMetric(float64(took[len(took)/2].Microseconds())/1e3, "p50-ms")
	b.ReportMetric(float64(took[(len(took)*99)/100].Microseconds())/1e3, "p99-ms")
	if sink.published != b.N+1 {
		b.Fatalf("published %d of %d", sink.published, b.N+1)
	}
}

// BenchmarkManifestHeldBytesPerService is what the manifest source holds
// per Service of 10 endpoints (a port each) once 10,000 are loaded in 100
// files: its document cache, the build's memo and the snapshot (issue 16's
// memory budget), and the heap it keeps in use. Counted, not timed: the
// live heap after a collection, before the load and after it.
// go test -run '^$' -bench ManifestHeldBytes -benchtime 3x ./controlplane
func BenchmarkManifestHeldBytesPerService(b *testing.B) {
	const n, perFile = 10000, 100
	dir := serviceFiles(b, n, perFile)
	var perService, inUse float64
	for b.Loop() {
		before, inUseBefore := heapNow()
		sink := &editSink{}
		src := &ManifestSource{Path: dir, Sink: sink, MaxBytes: -1}
		if err := src.Load(); err != nil {
			b.Fatal(err)
		}
		after, inUseAfter := heapNow()
		perService = float64(after-before) / n
		inUse = (float64(inUseAfter) - float64(inUseBefore)) / n
		if sink.published != 1 || src.lastServices != n {
			b.Fatalf("published %d, %d Services", sink.published, src.lastServices)
		}
		runtime.KeepAlive(src)
	}
	b.ReportMetric(perService, "B/service")
	b.ReportMetric(inUse, "inuse-B/service")
}

// heapNow is the live heap after a collection, and the heap in use then:
// spans with a live object in them, which resident memory follows.
func heapNow() (live, inUse uint64) {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc, m.HeapInuse
}
