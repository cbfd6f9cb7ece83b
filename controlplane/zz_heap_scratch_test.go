package controlplane

import (
	"os"
	"runtime"
	"runtime/pprof"
	"testing"
)

func BenchmarkZZHeap(b *testing.B) {
	runtime.MemProfileRate = 1
	dir := serviceFiles(b, 10000, 100)
	sink := &editSink{}
	src := &ManifestSource{Path: dir, Sink: sink, MaxBytes: -1}
	if err := src.Load(); err != nil {
		b.Fatal(err)
	}
	runtime.GC()
	f, _ := os.Create("/tmp/zzheap.pb.gz")
	pprof.Lookup("heap").WriteTo(f, 0)
	f.Close()
	runtime.KeepAlive(src)
	runtime.KeepAlive(sink)
}
