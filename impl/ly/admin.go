package ly

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/util/retry"

	"lampyr.dev/serving/impl/contract"
	"lampyr.dev/serving/impl/trust/seal"
)

func partOfLampyr() map[string]string {
	return map[string]string{"app.kubernetes.io/part-of": "lampyr"}
}

// adminErr explains an API error of an administrator command: RBAC denials
// name the resource and say who may do it.
func adminErr(err error, verb, resource, command string) error {
	switch {
	case apierrors.IsForbidden(err):
		return fmt.Errorf("%s %s: permission denied (%v): only a cluster administrator may change it; an administrator must run `ly cluster %s`", verb, resource, err, command)
	case apierrors.IsUnauthorized(err):
		return fmt.Errorf("%s %s: not authenticated (%v): check the kube context's credentials (--context, --kubeconfig)", verb, resource, err)
	}
	return fmt.Errorf("%s %s: %w", verb, resource, err)
}

// ParseNamespaces parses --namespaces: a comma-separated list of namespaces,
// or "*" alone for every namespace.
func ParseNamespaces(s string) ([]string, error) {
	var out []string
	for _, ns := range strings.Split(s, ",") {
		ns = strings.TrimSpace(ns)
		if ns == "" {
			continue
		}
		if ns != seal.AllNamespaces {
			if msgs := validation.IsDNS1123Label(ns); len(msgs) > 0 {
				return nil, fmt.Errorf("--namespaces: %q is not a namespace name (%s)", ns, strings.Join(msgs, ", "))
			}
		}
		if !slices.Contains(out, ns) {
			out = append(out, ns)
		}
	}
	switch {
	case len(out) == 0:
		return nil, errors.New("--namespaces is required: the namespaces the identity may seal templates for, comma-separated (team-a,team-b), or '*' for all")
	case len(out) > 1 && slices.Contains(out, seal.AllNamespaces):
		return nil, errors.New("--namespaces: '*' already covers every namespace; give it alone")
	}
	sort.Strings(out)
	return out, nil
}

// SealerAuthorization is one `ly cluster authorize-sealer`.
type SealerAuthorization struct {
	// Name is the identity's key in the ConfigMap.
	Name string
	Key  ed25519.PublicKey
	// Namespaces it may seal for (replacing what the entry had).
	Namespaces []string
	// Revoke removes the entry instead (Key and Namespaces unused).
	Revoke bool
}

// SealerChange is what AuthorizeSealer did.
type SealerChange struct {
	Name      string `json:"name"`
	KeyID     string `json:"keyID,omitempty"`
	Action    string `json:"action"` // created, updated, unchanged, revoked
	Previous  string `json:"previous,omitempty"`
	ConfigMap string `json:"configMap"`
	// Warnings name other entries of the ConfigMap the grant controller
	// ignores (they do not parse).
	Warnings []string `json:"warnings,omitempty"`
}

// AuthorizeSealer merges one entry into the ConfigMap of authorized sealers
// in the Lampyr namespace (creating it if missing), or removes it with
// Revoke. The entry is validated as the grant controller reads it
// (seal.ParseSealers); a key already authorized under another name is
// refused, since only one of the two entries would apply. Concurrent edits
// are retried against the latest version.
func AuthorizeSealer(ctx context.Context, c *Cluster, a SealerAuthorization) (*SealerChange, error) {
	ns := c.LampyrNamespace
	resource := fmt.Sprintf("ConfigMap %s/%s", ns, contract.SealersConfigMap)
	if msgs := validation.IsConfigMapKey(a.Name); len(msgs) > 0 {
		return nil, fmt.Errorf("sealer NAME %q: %s (e.g. %s)", a.Name, strings.Join(msgs, ", "), DefaultSealerName())
	}
	var value string
	if !a.Revoke {
		var err error
		if value, err = seal.FormatSealer(seal.TrustedSealer{Name: a.Name, Key: a.Key, Namespaces: a.Namespaces}); err != nil {
			return nil, err
		}
		if _, err := seal.ParseSealers(map[string]string{a.Name: value}); err != nil {
			return nil, fmt.Errorf("sealer %s: %w", a.Name, err)
		}
	}
	cms := c.Kube.CoreV1().ConfigMaps(ns)
	var ch *SealerChange
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		ch = &SealerChange{Name: a.Name, ConfigMap: ns + "/" + contract.SealersConfigMap}
		if !a.Revoke {
			ch.KeyID = seal.SealerKeyID(a.Key)
		}
		cm, err := cms.Get(ctx, contract.SealersConfigMap, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			if a.Revoke {
				return fmt.Errorf("%s does not exist: no sealer is authorized, so there is nothing to revoke", resource)
			}
			cm = &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: contract.SealersConfigMap, Namespace: ns, Labels: partOfLampyr()}, Data: map[string]string{a.Name: value}}
			ch.Action = "created"
			_, err = cms.Create(ctx, cm, metav1.CreateOptions{FieldManager: FieldManager})
			if apierrors.IsAlreadyExists(err) {
				// Created concurrently: edit the one that won.
				return apierrors.NewConflict(corev1.Resource("configmaps"), contract.SealersConfigMap, err)
			}
			if err != nil {
				return adminErr(err, "creating", resource, "authorize-sealer")
			}
			return nil
		}
		if err != nil {
			return adminErr(err, "reading", resource, "authorize-sealer")
		}
		old, had := cm.Data[a.Name]
		if had {
			ch.Previous = describeEntry(a.Name, old)
		}
		others := map[string]string{}
		for k, v := range cm.Data {
			if k != a.Name {
				others[k] = v
			}
		}
		parsed, perr := seal.ParseSealers(others)
		if perr != nil {
			ch.Warnings = append(ch.Warnings, fmt.Sprintf("%s has entries the grant controller ignores: %v", resource, perr))
		}
		switch {
		case a.Revoke && !had:
			return fmt.Errorf("%s has no sealer %q (it has: %s)", resource, a.Name, strings.Join(sortedKeys(cm.Data), ", "))
		case a.Revoke:
			ch.Action = "revoked"
		case had && old == value:
			ch.Action = "unchanged"
			return nil
		case had:
			ch.Action = "updated"
		default:
			ch.Action = "created"
		}
		if !a.Revoke {
			for _, s := range parsed {
				if s.Key.Equal(a.Key) {
					return fmt.Errorf("the key %s is already authorized as %q (namespaces %s) in %s: one key is one identity; change that entry (ly cluster authorize-sealer %s ...) or revoke it first (--revoke)",
						shortID(ch.KeyID), s.Name, strings.Join(s.Namespaces, ","), resource, s.Name)
				}
			}
		}
		cm = cm.DeepCopy()
		if cm.Data == nil {
			cm.Data = map[string]string{}
		}
		if a.Revoke {
			delete(cm.Data, a.Name)
		} else {
			cm.Data[a.Name] = value
		}
		if _, err := cms.Update(ctx, cm, metav1.UpdateOptions{FieldManager: FieldManager}); err != nil {
			if apierrors.IsConflict(err) {
				return err
			}
			return adminErr(err, "updating", resource, "authorize-sealer")
		}
		return nil
	})
	if apierrors.IsConflict(err) {
		return nil, fmt.Errorf("updating %s: it kept changing concurrently; run the command again: %w", resource, err)
	}
	if err != nil {
		return nil, err
	}
	return ch, nil
}

// describeEntry is an entry as "key <id>, namespaces a,b", or its raw value
// if it does not parse.
func describeEntry(name, value string) string {
	s, err := seal.ParseSealers(map[string]string{name: value})
	if err != nil || len(s) != 1 {
		return "unparsable: " + strings.TrimSpace(value)
	}
	return fmt.Sprintf("key %s, namespaces %s", shortID(seal.SealerKeyID(s[0].Key)), strings.Join(s[0].Namespaces, ","))
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// ClusterSealer is one authorized sealer identity as `ly cluster describe`
// prints it.
type ClusterSealer struct {
	Name       string   `json:"name"`
	KeyID      string   `json:"keyID"`
	Namespaces []string `json:"namespaces"`
	// Mine: this is the identity of the `ly` asking.
	Mine bool `json:"mine,omitempty"`
}

// SealersReport is what `ly cluster describe` says about sealer identities.
type SealersReport struct {
	// Readable is false when the caller may not read the ConfigMap (a
	// tenant); Sealers is then empty and Note says so.
	Readable bool            `json:"readable"`
	Sealers  []ClusterSealer `json:"sealers,omitempty"`
	// MyKeyID is this ly's sealer key id ("" if it has none yet).
	MyKeyID string `json:"myKeyID,omitempty"`
	Note    string `json:"note,omitempty"`
	// Problems are entries the grant controller ignores.
	Problems string `json:"problems,omitempty"`
}

// DescribeSealers reads the authorized sealer identities and marks mine
// (nil: this ly has no identity yet). A caller who may not read the
// ConfigMap gets a report saying so, not an error.
func DescribeSealers(ctx context.Context, c *Cluster, mine *Sealer) (*SealersReport, error) {
	ns := c.LampyrNamespace
	r := &SealersReport{}
	if mine != nil {
		r.MyKeyID = mine.KeyID()
	}
	cm, err := c.Kube.CoreV1().ConfigMaps(ns).Get(ctx, contract.SealersConfigMap, metav1.GetOptions{})
	switch {
	case apierrors.IsForbidden(err):
		r.Note = fmt.Sprintf("ConfigMap %s/%s is readable only by administrators: ask one whether this ly's identity is authorized for your namespaces", ns, contract.SealersConfigMap)
		return r, nil
	case apierrors.IsNotFound(err):
		r.Readable = true
		r.Note = fmt.Sprintf("no ly identity is authorized yet (ConfigMap %s/%s does not exist): an administrator runs `ly cluster authorize-sealer`", ns, contract.SealersConfigMap)
		return r, nil
	case err != nil:
		return nil, fmt.Errorf("reading ConfigMap %s/%s: %w", ns, contract.SealersConfigMap, err)
	}
	r.Readable = true
	sealers, perr := seal.ParseSealers(cm.Data)
	if perr != nil {
		r.Problems = perr.Error()
	}
	for _, s := range sealers {
		id := seal.SealerKeyID(s.Key)
		r.Sealers = append(r.Sealers, ClusterSealer{Name: s.Name, KeyID: id, Namespaces: s.Namespaces, Mine: id == r.MyKeyID})
	}
	return r, nil
}

// Authorized reports whether the report shows this ly's identity authorized
// for namespace; known is false when the report cannot tell.
func (r *SealersReport) Authorized(namespace string) (authorized, known bool) {
	if !r.Readable || r.MyKeyID == "" {
		return false, false
	}
	for _, s := range r.Sealers {
		if s.Mine {
			return (seal.TrustedSealer{Namespaces: s.Namespaces}).Authorizes(namespace), true
		}
	}
	return false, true
}

// FleetKeyRotation is what RotateFleetKey did.
type FleetKeyRotation struct {
	OldKeyID string `json:"oldKeyID"`
	NewKeyID string `json:"newKeyID"`
	// RetiredAs is the Secret key the old private key was moved to.
	RetiredAs string `json:"retiredAs"`
	// Retired lists every retired key the Secret now holds.
	Retired []string `json:"retired"`
}

// RetiredFleetKeyName is the Secret key a retired fleet private key is kept
// under: retired-<first 16 hex of its key id>.pem.
func RetiredFleetKeyName(keyID string) string {
	if len(keyID) > 16 {
		keyID = keyID[:16]
	}
	return contract.RetiredFleetKeyPrefix + keyID + ".pem"
}

// RotateFleetKey makes a new fleet key current: the Secret's current private
// key moves to RetiredFleetKeyName(its id), so templates sealed to it keep
// opening and running Revisions keep running; the new pair replaces
// private.pem, public.pem and keyID; then the public ConfigMap `ly` seals
// to follows. It refuses if the Secret is missing (the grant controller
// creates it at its first start) and does not retry a concurrent change.
func RotateFleetKey(ctx context.Context, c *Cluster) (*FleetKeyRotation, error) {
	ns := c.LampyrNamespace
	resource := fmt.Sprintf("Secret %s/%s", ns, contract.FleetKeyName)
	secrets := c.Kube.CoreV1().Secrets(ns)
	sec, err := secrets.Get(ctx, contract.FleetKeyName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("%s does not exist: the grant controller creates the fleet key at its first start; is it running? kubectl -n %s get pods (nothing was changed)", resource, ns)
	}
	if err != nil {
		return nil, adminErr(err, "reading", resource, "rotate-fleet-key")
	}
	cur, err := seal.ParsePrivateKeyPEM(sec.Data[contract.FleetPrivateKeyKey])
	if err != nil {
		return nil, fmt.Errorf("%s key %s: %w: refusing to rotate a key that does not parse (nothing was changed)", resource, contract.FleetPrivateKeyKey, err)
	}
	next, err := seal.GenerateFleetKey()
	if err != nil {
		return nil, err
	}
	nextPEM, err := next.MarshalPEM()
	if err != nil {
		return nil, err
	}
	rot := &FleetKeyRotation{OldKeyID: cur.Public().KeyID(), NewKeyID: next.Public().KeyID()}
	rot.RetiredAs = RetiredFleetKeyName(rot.OldKeyID)
	sec = sec.DeepCopy()
	if prev, ok := sec.Data[rot.RetiredAs]; ok && string(prev) != string(sec.Data[contract.FleetPrivateKeyKey]) {
		return nil, fmt.Errorf("%s already has a different key %s: refusing to overwrite a retired key (nothing was changed)", resource, rot.RetiredAs)
	}
	sec.Data[rot.RetiredAs] = sec.Data[contract.FleetPrivateKeyKey]
	sec.Data[contract.FleetPrivateKeyKey] = nextPEM
	sec.Data[contract.FleetPublicKeyKey] = next.Public().MarshalPEM()
	sec.Data[contract.FleetKeyIDKey] = []byte(rot.NewKeyID)
	for k := range sec.Data {
		if strings.HasPrefix(k, contract.RetiredFleetKeyPrefix) {
			rot.Retired = append(rot.Retired, k)
		}
	}
	sort.Strings(rot.Retired)
	if _, err := secrets.Update(ctx, sec, metav1.UpdateOptions{FieldManager: FieldManager}); err != nil {
		if apierrors.IsConflict(err) {
			return nil, fmt.Errorf("%s changed while rotating (another rotation?): nothing was changed; check `ly cluster describe` and run it again if needed", resource)
		}
		return nil, adminErr(err, "updating", resource, "rotate-fleet-key")
	}
	if err := publishFleetKey(ctx, c, next.Public()); err != nil {
		return rot, fmt.Errorf("the Secret now holds fleet key %s, but %w; restarting the grant controller republishes it (kubectl -n %s rollout restart deployment/lampyr-grant-controller)", shortID(rot.NewKeyID), err, ns)
	}
	return rot, nil
}

// publishFleetKey writes the public ConfigMap ly seals to.
func publishFleetKey(ctx context.Context, c *Cluster, pub *seal.PublicKey) error {
	ns := c.LampyrNamespace
	resource := fmt.Sprintf("ConfigMap %s/%s", ns, contract.FleetKeyName)
	want := map[string]string{contract.FleetPublicKeyKey: string(pub.MarshalPEM()), contract.FleetKeyIDKey: pub.KeyID()}
	cms := c.Kube.CoreV1().ConfigMaps(ns)
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cm, err := cms.Get(ctx, contract.FleetKeyName, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			_, err = cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: contract.FleetKeyName, Namespace: ns, Labels: partOfLampyr()}, Data: want}, metav1.CreateOptions{FieldManager: FieldManager})
			if err != nil {
				return adminErr(err, "creating", resource, "rotate-fleet-key")
			}
			return nil
		}
		if err != nil {
			return adminErr(err, "reading", resource, "rotate-fleet-key")
		}
		cm = cm.DeepCopy()
		cm.Data = want
		if _, err := cms.Update(ctx, cm, metav1.UpdateOptions{FieldManager: FieldManager}); err != nil {
			if apierrors.IsConflict(err) {
				return err
			}
			return adminErr(err, "updating", resource, "rotate-fleet-key")
		}
		return nil
	})
}
