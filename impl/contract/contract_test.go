package contract_test

import (
	"testing"

	fiberdv1alpha1 "lampyr.dev/serving/impl/apis/fiberd/v1alpha1"
	"lampyr.dev/serving/impl/contract"
)

// The GVR here is spelled out so the package imports nothing of Lampyr; it
// must be the one the API types register.
func TestCapacityGrantsMatchesTheAPIGroup(t *testing.T) {
	want := fiberdv1alpha1.SchemeGroupVersion.WithResource("capacitygrants")
	if contract.CapacityGrants != want {
		t.Errorf("contract.CapacityGrants = %v, want %v (impl/apis/fiberd/v1alpha1)", contract.CapacityGrants, want)
	}
	if contract.FiberdGroup != fiberdv1alpha1.GroupName {
		t.Errorf("contract.FiberdGroup = %q, want %q", contract.FiberdGroup, fiberdv1alpha1.GroupName)
	}
}

func TestReasonClasses(t *testing.T) {
	for _, r := range []contract.Reason{contract.ReasonTemplateMismatch, contract.ReasonSnapshotUnavailable, contract.ReasonSnapshotTooLarge, contract.ReasonInvalidGrant} {
		if !contract.LoadFailure(r) || contract.HandlerFailure(r) {
			t.Errorf("%s: want a load failure, not a handler failure", r)
		}
	}
	for _, r := range []contract.Reason{contract.ReasonHandlerExited, contract.ReasonHandlerNotListening, contract.ReasonHandlerNotReady} {
		if !contract.HandlerFailure(r) || contract.LoadFailure(r) {
			t.Errorf("%s: want a handler failure, not a load failure", r)
		}
	}
	for _, r := range []contract.Reason{contract.ReasonNotReady, contract.ReasonHomeNotReady, contract.ReasonTemplateUnsealable, ""} {
		if contract.HandlerFailure(r) || contract.LoadFailure(r) {
			t.Errorf("%q: want neither a load nor a handler failure", r)
		}
	}
}
