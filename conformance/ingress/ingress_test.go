// Package ingress runs Knative's own KIngress conformance suite
// (knative.dev/networking test/conformance/ingress, at the version serving
// pins) unchanged against a cluster's networking layer. It is driven by
// conformance/cmd/ingress-conformance, which builds the suite's test images,
// passes the flags and writes the per-subtest report.
package ingress

import (
	"os"
	"testing"

	"knative.dev/networking/test/conformance/ingress"
)

func TestIngressConformance(t *testing.T) {
	if os.Getenv("LAMPYR_E2E") != "1" {
		t.Skip("runs against a real cluster: use `just test-ingress-conformance` (sets LAMPYR_E2E=1 and the suite's flags)")
	}
	ingress.RunConformance(t)
}
