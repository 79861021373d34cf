// Added to the upstream package sigs.k8s.io/network-policy-api/conformance/utils/kubernetes by
// `go test -overlay` (scripts/cluster.sh build), with one call at the top of PokeServer: on a
// cluster that cannot serve SCTP (--sctp=false), an SCTP probe is left out and said so, instead of
// failing its case and leaving the TCP and UDP probes after it unrun. Every other probe runs as
// upstream wrote it.
package kubernetes

import (
	"flag"
	"testing"
)

// SCTPProbeLeftOut starts the line a left-out probe logs; test/cluster/npapi-conformance.test.ts counts them.
const SCTPProbeLeftOut = "SCTP probe left out (--sctp=false):"

func sctpProbeLeftOut(t *testing.T, protocol, targetHost string, targetPort int32, shouldConnect bool) bool {
	f := flag.Lookup("sctp")
	if protocol != "sctp" || f == nil || f.Value.String() != "false" {
		return false
	}
	t.Helper()
	t.Logf("%s %s:%d, expected to connect: %t", SCTPProbeLeftOut, targetHost, targetPort, shouldConnect)
	return true
}
