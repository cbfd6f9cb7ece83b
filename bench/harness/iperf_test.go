//go:build linux

package harness

import "testing"

// iperf3 3.12's -J report, cut to what parseIperf reads.
const iperfSample = `{
	"start": {"version": "iperf 3.12"},
	"intervals": [],
	"end": {
		"sum_sent": {"start": 0, "end": 0.000534, "seconds": 0.000534, "bytes": 1048576, "bits_per_second": 15709003745.3, "retransmits": 0, "sender": true},
		"sum_received": {"start": 0, "end": 0.000534, "seconds": 0.000534, "bytes": 1048576, "bits_per_second": 15709003745.318354, "sender": true}
	}
}`

func TestParseIperfReadsTheReceiversSum(t *testing.T) {
	got, err := parseIperf([]byte(iperfSample))
	if err != nil {
		t.Fatal(err)
	}
	if got.Bytes != 1048576 || got.BitsPerSecond != 15709003745.318354 {
		t.Errorf("got %+v, want 1048576 bytes at 15709003745.318354 bit/s", got)
	}
	for name, text := range map[string]string{
		// What iperf3 -J prints when it cannot reach the server.
		"refused":         `{"start": {"connected": []}, "intervals": [], "end": {}, "error": "unable to connect to server: Connection refused"}`,
		"no receiver sum": `{"end": {"sum_sent": {"bytes": 1}}}`,
		"not json":        "iperf3: error",
	} {
		if got, err := parseIperf([]byte(text)); err == nil {
			t.Errorf("%s: no error (%+v)", name, got)
		}
	}
}
