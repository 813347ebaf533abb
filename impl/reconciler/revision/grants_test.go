package revision

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	fiberdlisters "lampyr.dev/serving/impl/client/listers/fiberd/v1alpha1"
)

// Get hands the reconciler a grant it may change: the informer cache's
// object must stay as the API server sent it.
func TestTypedGrantsGetReturnsACopy(t *testing.T) {
	cached := grant(accepted(), grantReady)
	indexer := newIndexer()
	if err := indexer.Add(cached); err != nil {
		t.Fatal(err)
	}
	want := cached.DeepCopy()
	store := &typedGrants{lister: fiberdlisters.NewCapacityGrantLister(indexer)}

	got, err := store.Get(testNS, testRevName)
	if err != nil {
		t.Fatalf("Get: %v", err)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("Get did not return the cached grant (-want +got):\n%s", diff)
	}
	got.Spec.MaxFibers++
	got.Labels["changed"] = "true"
	got.Status.HomeEndpoint = "changed"
	if diff := cmp.Diff(want, cached); diff != "" {
		t.Errorf("changing what Get returned changed the cached grant (-want +got):\n%s", diff)
	}
}
