// Package revision keeps fiber-router's table of routable Revisions, fed by
// the router metadata the Lampyr Revision reconciler publishes
// (docs/contracts.md §2).
package revision

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	"lampyr.dev/serving/impl/contract/routermeta"
)

// Key names a Revision.
type Key struct {
	Namespace, Name string
}

func (k Key) String() string { return k.Namespace + "/" + k.Name }

// Reasons router metadata is refused (RefusedError.Reason), the reason label
// of lampyr_router_metadata_refused_total.
const (
	// RefusedMalformed: routermeta.FromConfigMap refused it (a field missing
	// or malformed; name, labels and data disagree; too big).
	RefusedMalformed = "malformed"
	// RefusedEndpoint: its homeEndpoint is not one the router may dial
	// (routermeta.CheckHomeEndpoint).
	RefusedEndpoint = "endpoint"
	// RefusedFull: the table already holds MaxRevisions Revisions.
	RefusedFull = "full"
	// RefusedNamespaceFull: the table already holds
	// MaxRevisionsPerNamespace Revisions of the Revision's namespace.
	RefusedNamespaceFull = "namespace-full"
)

// Reasons lists every refusal reason (metric labels are created up front).
var Reasons = []string{RefusedMalformed, RefusedEndpoint, RefusedFull, RefusedNamespaceFull}

// RefusedError says why a Revision's metadata is not used.
type RefusedError struct {
	Key    Key
	Reason string
	Err    error
}

func (e *RefusedError) Error() string {
	return fmt.Sprintf("router metadata of revision %s refused (%s): %v", e.Key, e.Reason, e.Err)
}

func (e *RefusedError) Unwrap() error { return e.Err }

// Sink receives metadata changes. Table is the router's Sink; a Source feeds it.
type Sink interface {
	// Upsert records the current metadata of a Revision.
	Upsert(m routermeta.Metadata)
	// Delete forgets a Revision.
	Delete(k Key)
	// Refuse forgets the Revision e names, whose metadata exists but must
	// not be used, and reports why. Forgetting matters: an older, usable
	// version must not stay routable as if nothing had changed.
	Refuse(e *RefusedError)
}

// Source feeds a Sink until ctx ends. Production uses the ConfigMap informer
// (NewConfigMapSource); tests write to the Table directly or use Static.
type Source interface {
	// Run blocks, feeding sink, until ctx ends.
	Run(ctx context.Context, sink Sink) error
	// HasSynced reports whether the initial state has been delivered; the
	// router is not ready before, so a replacement pod never 404s a
	// Revision it simply has not heard of yet.
	HasSynced() bool
}

// Listener is told when a Revision's metadata changes or it goes away, so the
// pools can follow. Calls are serialized.
type Listener interface {
	Changed(old, cur *routermeta.Metadata)
}

// Table is the set of known Revisions. Lookups are lock-light because every
// proxied request does one.
type Table struct {
	// MaxRevisions bounds the Revisions held (each costs a pool, metric
	// series and per-Home state); 0 means no bound. Beyond it new Revisions
	// are refused (RefusedFull) while known ones still take updates. A
	// Revision refused so is taken at its next update or informer resync
	// once a deletion has freed a slot.
	MaxRevisions int
	// MaxRevisionsPerNamespace bounds the Revisions of any one namespace,
	// so one tenant cannot fill the table and leave the others' Revisions
	// Ready yet unknown to the router (404); 0 means no bound. Beyond it
	// that namespace's new Revisions are refused (RefusedNamespaceFull)
	// and taken once one of its own is deleted, as for MaxRevisions;
	// other namespaces are not affected, and nothing known is evicted.
	MaxRevisionsPerNamespace int
	// OnRefused is told about refusals, once per Revision and cause: an
	// informer's resync repeats them, an operator needs each once. Calls
	// are serialized with the listener's; neither may call back into the
	// Table. Set both fields before the Table is fed.
	OnRefused func(*RefusedError)

	mu       sync.RWMutex
	m        map[Key]routermeta.Metadata
	perNS    map[string]int // Revisions held per namespace
	listener Listener
	changeMu sync.Mutex // serializes listener calls in Upsert/Delete order
	// refused holds the last reported refusal of each Revision whose
	// metadata is refused now; cleared when it is used or deleted.
	refused map[Key]string
}

// NewTable returns an empty table that tells l (may be nil) about changes.
func NewTable(l Listener) *Table {
	return &Table{m: map[Key]routermeta.Metadata{}, perNS: map[string]int{}, listener: l, refused: map[Key]string{}}
}

// Lookup returns the metadata of a Revision.
func (t *Table) Lookup(k Key) (routermeta.Metadata, bool) {
	t.mu.RLock()
	m, ok := t.m[k]
	t.mu.RUnlock()
	return m, ok
}

// Upsert implements Sink.
func (t *Table) Upsert(m routermeta.Metadata) {
	t.changeMu.Lock()
	defer t.changeMu.Unlock()
	k := Key{m.Namespace, m.Revision}
	t.mu.Lock()
	old, had := t.m[k]
	if !had {
		// The namespace's own bound first: a tenant at its bound hears
		// about its own Revisions, whatever the rest of the table holds.
		if t.MaxRevisionsPerNamespace > 0 && t.perNS[k.Namespace] >= t.MaxRevisionsPerNamespace {
			t.mu.Unlock()
			t.report(&RefusedError{Key: k, Reason: RefusedNamespaceFull, Err: fmt.Errorf(
				"fiber-router already holds --max-revisions-per-namespace=%d Revisions of namespace %s; delete some of them (or raise the flag)", t.MaxRevisionsPerNamespace, k.Namespace)})
			return
		}
		if t.MaxRevisions > 0 && len(t.m) >= t.MaxRevisions {
			t.mu.Unlock()
			t.report(&RefusedError{Key: k, Reason: RefusedFull, Err: fmt.Errorf(
				"fiber-router already holds --max-revisions=%d Revisions; raise it, or delete Revisions", t.MaxRevisions)})
			return
		}
		t.perNS[k.Namespace]++
	}
	t.m[k] = m
	t.mu.Unlock()
	delete(t.refused, k)
	if t.listener != nil {
		if had {
			if old == m {
				return
			}
			t.listener.Changed(&old, &m)
		} else {
			t.listener.Changed(nil, &m)
		}
	}
}

// Delete implements Sink.
func (t *Table) Delete(k Key) {
	t.changeMu.Lock()
	defer t.changeMu.Unlock()
	delete(t.refused, k)
	t.remove(k)
}

// Refuse implements Sink.
func (t *Table) Refuse(e *RefusedError) {
	t.changeMu.Lock()
	defer t.changeMu.Unlock()
	t.remove(e.Key)
	t.report(e)
}

// remove forgets k and tells the listener; changeMu is held.
func (t *Table) remove(k Key) {
	t.mu.Lock()
	old, had := t.m[k]
	if had {
		delete(t.m, k)
		if t.perNS[k.Namespace]--; t.perNS[k.Namespace] <= 0 {
			delete(t.perNS, k.Namespace)
		}
	}
	t.mu.Unlock()
	if had && t.listener != nil {
		t.listener.Changed(&old, nil)
	}
}

// report passes e to OnRefused unless it was the Revision's last reported
// refusal too; changeMu is held.
func (t *Table) report(e *RefusedError) {
	msg := e.Error()
	if t.refused[e.Key] == msg {
		return
	}
	t.refused[e.Key] = msg
	if t.OnRefused != nil {
		t.OnRefused(e)
	}
}

// NamespaceLen is the number of known Revisions of namespace.
func (t *Table) NamespaceLen(namespace string) int {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return t.perNS[namespace]
}

// Len is the number of known Revisions.
func (t *Table) Len() int {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return len(t.m)
}

// Static is a Source that delivers a fixed set once; for tests and for
// running the router without a cluster.
type Static struct {
	items  []routermeta.Metadata
	synced atomic.Bool
}

// NewStatic returns a Source that delivers items.
func NewStatic(items ...routermeta.Metadata) *Static { return &Static{items: items} }

// Run implements Source.
func (s *Static) Run(ctx context.Context, sink Sink) error {
	for _, m := range s.items {
		sink.Upsert(m)
	}
	s.synced.Store(true)
	<-ctx.Done()
	return nil
}

// HasSynced implements Source.
func (s *Static) HasSynced() bool { return s.synced.Load() }
