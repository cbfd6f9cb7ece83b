//go:build linux

package harness

import (
	"os"
	"strings"
	"testing"
)

// snmpSample is /proc/net/snmp as kernel 6.18 writes it, cut to the
// lines around the two counters (UdpLite has an OutDatagrams of its own).
const snmpSample = `Ip: Forwarding DefaultTTL InReceives InHdrErrors InAddrErrors ForwDatagrams InUnknownProtos InDiscards InDelivers OutRequests OutDiscards OutNoRoutes ReasmTimeout ReasmReqds ReasmOKs ReasmFails FragOKs FragFails FragCreates OutTransmits
Ip: 2 64 512267 0 0 0 0 0 512267 459406 7 0 0 0 0 0 0 0 0 459406
Tcp: RtoAlgorithm RtoMin RtoMax MaxConn ActiveOpens PassiveOpens AttemptFails EstabResets CurrEstab InSegs OutSegs RetransSegs InErrs OutRsts InCsumErrors
Tcp: 1 200 120000 -1 23546 23083 310 997 0 477097 475390 2676 0 1066 0
Udp: InDatagrams NoPorts InErrors OutDatagrams RcvbufErrors SndbufErrors InCsumErrors IgnoredMulti MemErrors
Udp: 29401 7 0 36767 0 0 0 0 0
UdpLite: InDatagrams NoPorts InErrors OutDatagrams RcvbufErrors SndbufErrors InCsumErrors IgnoredMulti MemErrors
UdpLite: 0 0 0 999 0 0 0 0 0
`

func TestParseNSSentReadsTheTwoCounters(t *testing.T) {
	s, err := parseNSSent(snmpSample)
	if err != nil {
		t.Fatal(err)
	}
	if s.tcpSegs != 475390 || s.udpDatagrams != 36767 {
		t.Errorf("got %+v, want Tcp OutSegs 475390 and Udp OutDatagrams 36767", s)
	}
	for name, text := range map[string]string{
		"no Udp":        strings.Join(strings.Split(snmpSample, "\n")[:4], "\n"),
		"a bad value":   strings.Replace(snmpSample, "475390", "47x", 1),
		"values cut":    strings.Replace(snmpSample, " 2676 0 1066 0\n", "\n", 1),
		"empty":         "",
		"the wrong way": strings.ReplaceAll(snmpSample, "OutSegs", "OutSegments"),
	} {
		if s, err := parseNSSent(text); err == nil {
			t.Errorf("%s: no error (%+v)", name, s)
		}
	}
	// This process's own namespace has the file in the same form.
	if _, err := os.Stat("/proc/self/net/snmp"); err == nil {
		if _, err := readNSSent(os.Getpid()); err != nil {
			t.Errorf("this host's /proc/self/net/snmp: %v", err)
		}
	}
}
