package revision

import (
	"context"
	"fmt"

	apierrs "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	v1 "knative.dev/serving/pkg/apis/serving/v1"
)

// ownedKind is how the reconciler reads and writes one kind of object a
// Revision owns: the CapacityGrant, the backend Service, its EndpointSlice
// and the router metadata ConfigMap. ensure holds the get / create / own /
// compare / update logic they share, as upstream's revision reconciler
// does per kind (knative.dev/serving/pkg/reconciler/revision
// reconcile_resources.go) without repeating it.
type ownedKind[T metav1.Object] struct {
	// kind names the object in errors, logs and Events ("Service").
	kind string
	// get reads the object from the informer cache.
	get func(namespace, name string) (T, error)
	// create and update write through the API and return what was stored.
	create func(ctx context.Context, want T) (T, error)
	update func(ctx context.Context, obj T) (T, error)
	// ours says whether an existing object was made for rev; nil means rev
	// controls it (owner reference).
	ours func(got T) bool
	// matches says whether got already has every field we decide, so that
	// values the API server or others fill in cause no update.
	matches func(got, want T) bool
	// merge returns a copy of got with the fields we decide taken from want.
	merge func(got, want T) T
	// replace says got cannot become want by an update (an immutable field
	// differs), so it is deleted with del and created again; nil: never.
	replace func(got, want T) bool
	del     func(ctx context.Context, got T) error
}

// ensured says what ensure did.
type ensured int

const (
	// foreign: an object that is not rev's holds the name; nothing written.
	foreign ensured = iota
	created
	updated
	unchanged
)

// ensure makes the object named like want exist as want says: created when
// absent, left alone when it is someone else's, updated (or replaced) when
// a field we decide differs. It returns the object as stored or read.
func ensure[T metav1.Object](ctx context.Context, rev *v1.Revision, k ownedKind[T], want T) (T, ensured, error) {
	var none T
	name := qualifiedName(rev, want)
	got, err := k.get(want.GetNamespace(), want.GetName())
	switch {
	case apierrs.IsNotFound(err):
		saved, err := k.create(ctx, want)
		if apierrs.IsAlreadyExists(err) {
			// Exists but the cache does not show it (a filtered lister),
			// so it is not one we made.
			return none, foreign, nil
		}
		if err != nil {
			return none, 0, fmt.Errorf("creating %s %s: %w", k.kind, name, err)
		}
		logWrite(ctx, "Created", k.kind, name)
		return saved, created, nil
	case err != nil:
		return none, 0, fmt.Errorf("reading %s %s: %w", k.kind, name, err)
	}
	ours := k.ours
	if ours == nil {
		ours = func(got T) bool { return metav1.IsControlledBy(got, rev) }
	}
	if !ours(got) {
		return none, foreign, nil
	}
	if k.matches(got, want) {
		return got, unchanged, nil
	}
	if k.replace != nil && k.replace(got, want) {
		if err := k.del(ctx, got); err != nil && !apierrs.IsNotFound(err) {
			return none, 0, fmt.Errorf("replacing %s %s: %w", k.kind, name, err)
		}
		saved, err := k.create(ctx, want)
		if err != nil {
			return none, 0, fmt.Errorf("creating %s %s: %w", k.kind, name, err)
		}
		logWrite(ctx, "Replaced", k.kind, name)
		return saved, updated, nil
	}
	saved, err := k.update(ctx, k.merge(got, want))
	if err != nil {
		return none, 0, fmt.Errorf("updating %s %s: %w", k.kind, name, err)
	}
	logWrite(ctx, "Updated", k.kind, name)
	return saved, updated, nil
}

// qualifiedName is obj's name, with its namespace when that is not rev's
// (the router metadata lives in the Lampyr namespace).
func qualifiedName(rev *v1.Revision, obj metav1.Object) string {
	if obj.GetNamespace() != rev.Namespace {
		return obj.GetNamespace() + "/" + obj.GetName()
	}
	return obj.GetName()
}
