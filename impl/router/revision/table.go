// Package revision keeps fiber-router's table of routable Revisions, fed by
// the router metadata the Lampyr Revision reconciler publishes
// (docs/contracts.md §2).
package revision

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/btree"

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
	// UpsertAt is Upsert with the time the metadata was first published
	// (its ConfigMap's creationTimestamp): when a bound leaves room for
	// only some Revisions, the oldest are held, so every replica holds
	// the same ones whatever order it heard of them in.
	UpsertAt(m routermeta.Metadata, created time.Time)
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
//
// Which Revisions a bound leaves room for is a function of the metadata
// alone, never of the order it arrived in: the oldest (first published,
// then by namespace and name) are held. fiber-router runs several
// replicas, each with its own informer, and an informer's resync replays
// its store in map order; first come, first served let two replicas hold
// different Revisions of a namespace at its bound, so a KIngress probe
// answered by one passed (the Route turned Ready) while requests reaching
// the other got 404. A Revision waiting for room is taken as soon as a
// deletion makes room, oldest first.
type Table struct {
	// MaxRevisions bounds the Revisions held (each costs a pool, metric
	// series and per-Home state); 0 means no bound. Beyond it the newest
	// are refused (RefusedFull) while those held still take updates.
	MaxRevisions int
	// MaxRevisionsPerNamespace bounds the Revisions of any one namespace,
	// so one tenant cannot fill the table and leave the others' Revisions
	// Ready yet unknown to the router (404); 0 means no bound. Beyond it
	// that namespace's newest Revisions are refused (RefusedNamespaceFull)
	// and taken once one of its own is deleted; other namespaces are not
	// affected.
	MaxRevisionsPerNamespace int
	// OnRefused is told about refusals, once per Revision and cause: an
	// informer's resync repeats them, an operator needs each once. Calls
	// are serialized with the listener's; neither may call back into the
	// Table. Set both fields before the Table is fed.
	OnRefused func(*RefusedError)

	mu       sync.RWMutex
	m        map[Key]routermeta.Metadata // held: what Lookup serves
	perNS    map[string]int              // Revisions held per namespace
	listener Listener
	changeMu sync.Mutex // serializes listener calls in Upsert/Delete order
	// Guarded by changeMu:
	// cands is every usable Revision's metadata, held or waiting for room.
	cands map[Key]candidate
	// byNS ranks each namespace's candidates against its own bound; its
	// held part (eligible) is ranked again, all namespaces together,
	// against MaxRevisions in global, whose held part is what m holds.
	byNS   map[string]*ranked
	global *ranked
	// refused holds the last reported refusal of each Revision whose
	// metadata is refused now; cleared when it is used or deleted.
	refused map[Key]string
}

type candidate struct {
	m       routermeta.Metadata
	created time.Time
}

// item is a candidate's place in line: first published first, then by
// namespace and name.
type item struct {
	created time.Time
	k       Key
}

func lessItem(a, b item) bool {
	if !a.created.Equal(b.created) {
		return a.created.Before(b.created)
	}
	if a.k.Namespace != b.k.Namespace {
		return a.k.Namespace < b.k.Namespace
	}
	return a.k.Name < b.k.Name
}

// ranked splits items into the bound oldest (in) and the rest (wait);
// a bound of 0 or less holds everything. Every operation is O(log n) and
// says which items entered or left in.
type ranked struct {
	bound    int
	in, wait *btree.BTreeG[item]
}

func newRanked(bound int) *ranked {
	return &ranked{bound: bound, in: btree.NewG(16, lessItem), wait: btree.NewG(16, lessItem)}
}

func (r *ranked) add(it item) (entered, left []item) {
	// wait is empty unless in is full.
	if r.bound <= 0 || r.in.Len() < r.bound {
		r.in.ReplaceOrInsert(it)
		return []item{it}, nil
	}
	if newest, _ := r.in.Max(); lessItem(it, newest) {
		r.in.DeleteMax()
		r.wait.ReplaceOrInsert(newest)
		r.in.ReplaceOrInsert(it)
		return []item{it}, []item{newest}
	}
	r.wait.ReplaceOrInsert(it)
	return nil, nil
}

func (r *ranked) remove(it item) (entered, left []item) {
	if _, ok := r.in.Delete(it); !ok {
		r.wait.Delete(it)
		return nil, nil
	}
	if next, ok := r.wait.DeleteMin(); ok {
		r.in.ReplaceOrInsert(next)
		return []item{next}, []item{it}
	}
	return nil, []item{it}
}

func (r *ranked) len() int { return r.in.Len() + r.wait.Len() }

// NewTable returns an empty table that tells l (may be nil) about changes.
// Set MaxRevisions and MaxRevisionsPerNamespace before it is fed.
func NewTable(l Listener) *Table {
	return &Table{
		m: map[Key]routermeta.Metadata{}, perNS: map[string]int{}, listener: l, refused: map[Key]string{},
		cands: map[Key]candidate{}, byNS: map[string]*ranked{},
	}
}

// Lookup returns the metadata of a Revision.
func (t *Table) Lookup(k Key) (routermeta.Metadata, bool) {
	t.mu.RLock()
	m, ok := t.m[k]
	t.mu.RUnlock()
	return m, ok
}

// Upsert implements Sink, for metadata whose publication time is unknown
// (tests, Static): it ranks by namespace and name alone.
func (t *Table) Upsert(m routermeta.Metadata) { t.UpsertAt(m, time.Time{}) }

// UpsertAt implements Sink.
func (t *Table) UpsertAt(m routermeta.Metadata, created time.Time) {
	t.changeMu.Lock()
	defer t.changeMu.Unlock()
	k := Key{m.Namespace, m.Revision}
	if c, known := t.cands[k]; known {
		// Known: held Revisions take the update; a waiting one keeps
		// waiting (a resync repeats its refusal, reported once).
		t.cands[k] = candidate{m, c.created}
		t.mu.Lock()
		old, held := t.m[k]
		if held {
			t.m[k] = m
		}
		t.mu.Unlock()
		if !held {
			t.reportWaiting(k)
			return
		}
		if old != m && t.listener != nil {
			t.listener.Changed(&old, &m)
		}
		return
	}
	t.cands[k] = candidate{m, created}
	r := t.byNS[k.Namespace]
	if r == nil {
		r = newRanked(t.MaxRevisionsPerNamespace)
		t.byNS[k.Namespace] = r
	}
	it := item{created, k}
	entered, left := r.add(it)
	t.apply(it, entered, left)
}

// Delete implements Sink.
func (t *Table) Delete(k Key) {
	t.changeMu.Lock()
	defer t.changeMu.Unlock()
	delete(t.refused, k)
	t.forget(k)
}

// Refuse implements Sink.
func (t *Table) Refuse(e *RefusedError) {
	t.changeMu.Lock()
	defer t.changeMu.Unlock()
	t.forget(e.Key)
	t.report(e)
}

// forget drops k from the candidates, and so from the table, and lets
// the next in line take its room; changeMu is held.
func (t *Table) forget(k Key) {
	c, known := t.cands[k]
	if !known {
		return
	}
	delete(t.cands, k)
	it := item{c.created, k}
	r := t.byNS[k.Namespace]
	entered, left := r.remove(it)
	if r.len() == 0 {
		delete(t.byNS, k.Namespace)
	}
	t.apply(it, entered, left)
}

// apply passes what entered and left a namespace's eligible part on to
// the global ranking, then makes m what the global ranking holds, telling
// the listener (what leaves first: a pool closes before its successor
// opens) and OnRefused (every candidate left waiting); changeMu is held.
func (t *Table) apply(changed item, entered, left []item) {
	if t.global == nil {
		t.global = newRanked(t.MaxRevisions)
	}
	touched := append([]item{changed}, entered...)
	touched = append(touched, left...)
	for _, it := range left {
		e, l := t.global.remove(it)
		touched = append(append(touched, e...), l...)
	}
	for _, it := range entered {
		e, l := t.global.add(it)
		touched = append(append(touched, e...), l...)
	}
	slices.SortFunc(touched, func(a, b item) int {
		switch {
		case lessItem(a, b):
			return -1
		case lessItem(b, a):
			return 1
		}
		return 0
	})
	touched = slices.Compact(touched)

	var out, in []Key
	t.mu.Lock()
	for _, it := range touched {
		_, held := t.m[it.k]
		_, usable := t.cands[it.k]
		want := usable && t.global.in.Has(it)
		switch {
		case held && !want:
			out = append(out, it.k)
		case !held && want:
			in = append(in, it.k)
		}
	}
	olds := make([]routermeta.Metadata, len(out))
	for i, k := range out {
		olds[i] = t.m[k]
		delete(t.m, k)
		if t.perNS[k.Namespace]--; t.perNS[k.Namespace] <= 0 {
			delete(t.perNS, k.Namespace)
		}
	}
	for _, k := range in {
		t.m[k] = t.cands[k].m
		t.perNS[k.Namespace]++
	}
	t.mu.Unlock()
	for i := range out {
		if t.listener != nil {
			t.listener.Changed(&olds[i], nil)
		}
	}
	for _, k := range in {
		delete(t.refused, k)
		if t.listener != nil {
			m := t.cands[k].m
			t.listener.Changed(nil, &m)
		}
	}
	for _, it := range touched {
		if _, usable := t.cands[it.k]; usable && !t.global.in.Has(it) {
			t.reportWaiting(it.k)
		}
	}
}

// reportWaiting reports why k, a usable Revision, is not held; changeMu
// is held.
func (t *Table) reportWaiting(k Key) {
	if r := t.byNS[k.Namespace]; r != nil && r.in.Has(item{t.cands[k].created, k}) {
		t.report(&RefusedError{Key: k, Reason: RefusedFull, Err: fmt.Errorf(
			"fiber-router already holds --max-revisions=%d Revisions; raise it, or delete Revisions", t.MaxRevisions)})
		return
	}
	t.report(&RefusedError{Key: k, Reason: RefusedNamespaceFull, Err: fmt.Errorf(
		"fiber-router already holds --max-revisions-per-namespace=%d Revisions of namespace %s; delete some of them (or raise the flag)", t.MaxRevisionsPerNamespace, k.Namespace)})
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
