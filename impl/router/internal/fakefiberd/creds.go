package fakefiberd

import (
	"slices"
	"sync"

	"lampyr.dev/serving/impl/trust/routercred"
)

// RecordingCreds is the router's credential source (a routercred.Minter)
// that also records which Homes' credentials the router forgot, so tests can
// check a Home is dropped exactly when nothing names it any more.
type RecordingCreds struct {
	*routercred.Minter
	mu     sync.Mutex
	forgot []string
}

// Forget records home and forgets its credential.
func (r *RecordingCreds) Forget(home string) {
	r.mu.Lock()
	r.forgot = append(r.forgot, home)
	r.mu.Unlock()
	r.Minter.Forget(home)
}

// Forgotten lists the Homes forgotten so far, in order.
func (r *RecordingCreds) Forgotten() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.forgot)
}
