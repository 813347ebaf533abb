package grant

import (
	corev1 "k8s.io/api/core/v1"

	"lampyr.dev/serving/impl/grant/resources"
	"lampyr.dev/serving/impl/trust/signedgrant"
)

// homeKeyFor is the TLS key of the Home whose Secret is s (nil: not made
// yet): the one s holds, so a Home keeps its key for its Secret's life and
// renewals never change what fiber-router accepts; or a new one when s holds
// none (a new Home, or a Secret an earlier version wrote). A Secret made
// anew (the Home deleted and re-created) gets a new key: that is how a
// Home's key is rotated (docs/security.md, "Keys and their rotation").
func (r *Reconciler) homeKeyFor(s *corev1.Secret) (resources.HomeKey, error) {
	if k, ok := resources.HomeKeyOf(s); ok {
		return k, nil
	}
	if r.newHomeKey != nil {
		return r.newHomeKey()
	}
	return resources.NewHomeKey()
}

// homeKeyBound says whether the grant c in Home Secret s names the key s
// holds: a grant is current only then (else it is signed again, naming the
// key fiberd serves with).
func homeKeyBound(s *corev1.Secret, c signedgrant.Claims) bool {
	k, ok := resources.HomeKeyOf(s)
	return ok && c.HomeKeySHA256 == k.SHA256
}
