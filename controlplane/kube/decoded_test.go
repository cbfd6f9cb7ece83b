package kube

import (
	"reflect"
	"testing"
	"unsafe"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

// stringsIn adds the address of every non-empty string's bytes reachable
// from v (through pointers, interfaces, structs, slices, arrays and maps,
// unexported fields included) to into.
func stringsIn(v reflect.Value, into map[*byte]string, seen map[uintptr]bool) {
	switch v.Kind() {
	case reflect.String:
		if s := v.String(); s != "" {
			into[unsafe.StringData(s)] = s
		}
	case reflect.Pointer:
		if v.IsNil() || seen[v.Pointer()] {
			return
		}
		seen[v.Pointer()] = true
		stringsIn(v.Elem(), into, seen)
	case reflect.Interface:
		if !v.IsNil() {
			stringsIn(v.Elem(), into, seen)
		}
	case reflect.Struct:
		for i := range v.NumField() {
			stringsIn(v.Field(i), into, seen)
		}
	case reflect.Slice, reflect.Array:
		for i := range v.Len() {
			stringsIn(v.Index(i), into, seen)
		}
	case reflect.Map:
		for it := v.MapRange(); it.Next(); {
			stringsIn(it.Key(), into, seen)
			stringsIn(it.Value(), into, seen)
		}
	}
}

// TestCachedObjectsKeepNoDecodedString checks that what the source keeps
// of a Service and an EndpointSlice holds no string of the object decoded
// from the wire: one kept string keeps the span it was decoded into, and
// with it the room of all the list's garbage decoded beside it (at 10k
// Services through kube-apiserver, about 12 MB of heap in use beyond the
// live heap; BenchmarkInitialListHeapInUse counts it).
func TestCachedObjectsKeepNoDecodedString(t *testing.T) {
	trim := newProxyTrim("node-1")
	for i := range 3 { // the first of each name is the one interned
		for _, kind := range []struct {
			name    string
			marshal func() ([]byte, error)
			decode  func([]byte) (any, error)
		}{
			{"service", func() ([]byte, error) { return appService(i).Marshal() },
				func(w []byte) (any, error) { o := &corev1.Service{}; return o, o.Unmarshal(w) }},
			{"slice", func() ([]byte, error) { return controllerSlice(i, 3).Marshal() },
				func(w []byte) (any, error) { o := &discoveryv1.EndpointSlice{}; return o, o.Unmarshal(w) }},
		} {
			wire, err := kind.marshal()
			if err != nil {
				t.Fatal(err)
			}
			decoded, err := kind.decode(wire)
			if err != nil {
				t.Fatal(err)
			}
			before := map[*byte]string{}
			stringsIn(reflect.ValueOf(decoded), before, map[uintptr]bool{})
			if len(before) < 10 {
				t.Fatalf("%s %d: only %d strings found in the decoded object", kind.name, i, len(before))
			}
			kept, err := trim.transform(decoded)
			if err != nil {
				t.Fatal(err)
			}
			after := map[*byte]string{}
			stringsIn(reflect.ValueOf(kept), after, map[uintptr]bool{})
			if len(after) == 0 {
				t.Fatalf("%s %d: no string found in what is kept", kind.name, i)
			}
			for p, s := range after {
				if _, ok := before[p]; ok {
					t.Errorf("%s %d: the cached object keeps the decoded string %q", kind.name, i, s)
				}
			}
		}
	}
}
