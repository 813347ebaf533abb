// The signed grant in the Home Secret, issued and renewed.

package grant

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"reflect"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"lampyr.dev/serving/impl/apis/fiberd/v1alpha1"
	"lampyr.dev/serving/impl/contract"
	"lampyr.dev/serving/impl/contract/lampyrconfig"
	"lampyr.dev/serving/impl/grant/resources"
	"lampyr.dev/serving/impl/trust/signedgrant"
)

// reconcileSecret issues the signed grant (renewing it when it is past half
// its life or no longer matches the spec or the keys) and returns when to
// renew next.
func (r *Reconciler) reconcileSecret(ctx context.Context, g *v1alpha1.CapacityGrant, cfg *lampyrconfig.Config, helper signedgrant.Helper) (time.Duration, error) {
	now := r.now()
	existing, err := r.homeSecret(ctx, g)
	if err != nil {
		return 0, err
	}
	if existing != nil {
		switch ownershipOf(existing, g) {
		case foreign:
			// Never write a grant into a Secret someone else made.
			return 0, r.taken(g, "Secret", existing)
		case leftover:
			// A Home of an earlier grant of this name (a Revision deleted
			// and made again): delete all of it and start over once the
			// caches no longer show it.
			if err := r.deleteHome(ctx, g.Namespace, g.Name, string(g.UID)); err != nil {
				return 0, err
			}
			g.Status.MarkHomeNotReady(contract.ReasonHomePending, "The Home of an earlier CapacityGrant named %s is being deleted.", g.Name)
			return 0, errLeftover
		}
	}
	current := r.currentGrant(existing, now)
	homeKey, err := r.homeKeyFor(existing)
	if err != nil {
		return 0, fmt.Errorf("making the Home key of %s/%s: %w", g.Namespace, g.Name, err)
	}
	want := resources.MakeClaims(g, cfg, helper, homeKey.SHA256, "", metav1.NewTime(now))
	renewAt := time.Time{}
	if current != nil {
		renewAt = current.ExpiresAt.Add(-cfg.RenewBefore())
	}
	if current == nil || !sameTerms(*current, want) || !now.Before(renewAt) {
		want.GrantID = r.grantID(g)
		signed, err := signedgrant.Sign(r.keys.Signing, want)
		if err != nil {
			return 0, fmt.Errorf("signing grant for %s/%s: %w", g.Namespace, g.Name, err)
		}
		desired := resources.MakeHomeSecret(g, r.homesNamespace, signed, r.keys.SigningPubPEM, r.keys.RouterPubPEM, homeKey)
		if existing == nil {
			_, err = r.kube.CoreV1().Secrets(r.homesNamespace).Create(ctx, desired, metav1.CreateOptions{})
		} else {
			upd := existing.DeepCopy()
			upd.Data, upd.Labels = desired.Data, desired.Labels
			_, err = r.kube.CoreV1().Secrets(r.homesNamespace).Update(ctx, upd, metav1.UpdateOptions{})
		}
		if err != nil {
			return 0, fmt.Errorf("writing Secret %s/%s: %w", r.homesNamespace, desired.Name, err)
		}
		current = &want
		renewAt = want.ExpiresAt.Add(-cfg.RenewBefore())
	}
	g.Status.GrantID = current.GrantID
	g.Status.HomeKeySHA256 = current.HomeKeySHA256
	exp := metav1.NewTime(current.ExpiresAt)
	g.Status.ExpiresAt = &exp
	return max(renewAt.Sub(now), time.Second), nil
}

// currentGrantOf is the valid grant g's Home holds now, if any.
func (r *Reconciler) currentGrantOf(g *v1alpha1.CapacityGrant) *signedgrant.Claims {
	s, err := r.homeSecret(context.Background(), g)
	if err != nil || s == nil || !resources.IsHomeOf(s, g) {
		return nil
	}
	return r.currentGrant(s, r.now())
}

// currentGrant returns the valid grant in the Home Secret, if any, as long
// as the Secret also carries today's public keys.
func (r *Reconciler) currentGrant(s *corev1.Secret, now time.Time) *signedgrant.Claims {
	if s == nil {
		return nil
	}
	c, err := signedgrant.Verify(r.keys.Signing.Public().(ed25519.PublicKey), s.Data[resources.SecretKeyGrant], now)
	if err != nil {
		return nil
	}
	if string(s.Data[resources.SecretKeyRouterPubKeys]) != string(r.keys.RouterPubPEM) || string(s.Data[resources.SecretKeyGrantPubKey]) != string(r.keys.SigningPubPEM) || len(s.Data) != 4 || !homeKeyBound(s, c) {
		return nil
	}
	return &c
}

// sameTerms compares everything but identity and validity window.
func sameTerms(a, b signedgrant.Claims) bool {
	a.GrantID, b.GrantID = "", ""
	a.IssuedAt, b.IssuedAt = time.Time{}, time.Time{}
	a.ExpiresAt, b.ExpiresAt = time.Time{}, time.Time{}
	if len(a.Env) == 0 && len(b.Env) == 0 {
		a.Env, b.Env = nil, nil
	}
	return reflect.DeepEqual(a, b)
}

func newGrantID(g *v1alpha1.CapacityGrant) string {
	b := make([]byte, 4)
	rand.Read(b)
	uid := string(g.UID)
	if len(uid) > 8 {
		uid = uid[:8]
	}
	return fmt.Sprintf("%s-%s", uid, hex.EncodeToString(b))
}
