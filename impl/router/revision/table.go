// Package revision keeps fiber-router's table of routable Revisions, fed by
// the router metadata the Lampyr Revision reconciler publishes
// (docs/contracts.md §2).
package revision

import (
	"context"
	"sync"
	"sync/atomic"

	"lampyr.dev/serving/impl/routermeta"
)

// Key names a Revision.
type Key struct {
	Namespace, Name string
}

func (k Key) String() string { return k.Namespace + "/" + k.Name }

// Sink receives metadata changes. Table is the router's Sink; a Source feeds it.
type Sink interface {
	// Upsert records the current metadata of a Revision.
	Upsert(m routermeta.Metadata)
	// Delete forgets a Revision.
	Delete(k Key)
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
	mu       sync.RWMutex
	m        map[Key]routermeta.Metadata
	listener Listener
	changeMu sync.Mutex // serializes listener calls in Upsert/Delete order
}

// NewTable returns an empty table that tells l (may be nil) about changes.
func NewTable(l Listener) *Table {
	return &Table{m: map[Key]routermeta.Metadata{}, listener: l}
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
	t.m[k] = m
	t.mu.Unlock()
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
	t.mu.Lock()
	old, had := t.m[k]
	delete(t.m, k)
	t.mu.Unlock()
	if had && t.listener != nil {
		t.listener.Changed(&old, nil)
	}
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
