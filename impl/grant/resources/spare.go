package resources

import (
	"crypto/rand"
	"encoding/hex"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"lampyr.dev/serving/impl/apis/fiberd/v1alpha1"
	"lampyr.dev/serving/impl/contract/lampyrconfig"
)

// Spare Homes (config-lampyr home-spares): Home Pods started before any
// Revision needs them, running fiberd with no grant. An admitted grant
// claims one: the grant controller relabels the Pod and its Secret as the
// grant's Home, grows the Pod's memory to the grant's (in-place resize),
// writes the grant into the Secret and pushes it to fiberd, which loads the
// Revision at once; a new Revision's Home is then ready in the time its
// snapshot takes to load instead of a Pod's start. A spare is claimed once
// and never returned: a Home that ran a tenant's code serves no one else
// (docs/security.md §1, "Spare Homes").
const (
	// SpareLabel marks a spare Home's Pod: SpareUnclaimed while it waits,
	// SpareClaimed once it is a grant's Home (the label then stays, so
	// the Pod is known for a claimed spare under a name not its grant's).
	SpareLabel     = "lampyr.dev/home-spare"
	SpareUnclaimed = "unclaimed"
	SpareClaimed   = "claimed"
	// SparePrefix begins every spare's name (Pod and Secret).
	SparePrefix = "home-spare-"
)

// SpareMemory is what a spare reserves before it is claimed: fiberd
// itself. A claim grows it to the grant's HomeResources.
var SpareMemory = HomeOverhead

// SpareMaxRequestSeconds is the longest timeoutSeconds a spare's grace
// period covers (Knative's default max-revision-timeout-seconds, 600): a
// grant with a longer one gets a Home Pod of its own.
const SpareMaxRequestSeconds = 600

// NewSpareName is a new spare's name.
func NewSpareName() string {
	b := make([]byte, 5)
	rand.Read(b)
	return SparePrefix + hex.EncodeToString(b)
}

// SpareLabels are an unclaimed spare's labels.
func SpareLabels() map[string]string {
	return map[string]string{ComponentKey: Component, SpareLabel: SpareUnclaimed}
}

// ClaimedLabels are the labels of a spare claimed as g's Home.
func ClaimedLabels(g *v1alpha1.CapacityGrant) map[string]string {
	l := Labels(g)
	l[SpareLabel] = SpareClaimed
	return l
}

// IsSpare reports whether a Pod is an unclaimed spare.
func IsSpare(obj metav1.Object) bool {
	l := obj.GetLabels()
	return l[ComponentKey] == Component && l[SpareLabel] == SpareUnclaimed
}

// IsClaimedSpare reports whether a Pod is a spare claimed as a grant's Home.
func IsClaimedSpare(obj metav1.Object) bool {
	return obj.GetLabels()[SpareLabel] == SpareClaimed
}

// spareResources are a spare's requests and limits: a grant's, with
// SpareMemory for the memory.
func spareResources(cfg *lampyrconfig.Config) corev1.ResourceRequirements {
	return corev1.ResourceRequirements{
		Requests: corev1.ResourceList{corev1.ResourceMemory: SpareMemory, corev1.ResourceCPU: HomeCPURequest},
		Limits:   corev1.ResourceList{corev1.ResourceMemory: SpareMemory, corev1.ResourceCPU: cfg.HomeCPULimit},
	}
}

// MakeSparePod is a spare Home Pod named name: a Home Pod with no grant,
// its own Secret (MakeSpareSecret), no tenant namespace, fiberd's memory
// only, and the grace of a grant with SpareMaxRequestSeconds.
func MakeSparePod(cfg *lampyrconfig.Config, homesNamespace, name string) *corev1.Pod {
	return makeHomePod(homePod{
		name: name, secret: name, labels: SpareLabels(),
		grace:     HandoverSeconds + SpareMaxRequestSeconds + 5,
		resources: spareResources(cfg),
	}, cfg, homesNamespace)
}

// MakeSpareSecret is a spare's Secret: the keys of a Home Secret but the
// grant, which the claim writes.
func MakeSpareSecret(homesNamespace, name string, grantPubKey, routerPubKeys []byte, key HomeKey) *corev1.Secret {
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: homesNamespace, Labels: SpareLabels()},
		Type:       corev1.SecretTypeOpaque,
		Data: map[string][]byte{
			SecretKeyGrantPubKey:   grantPubKey,
			SecretKeyRouterPubKeys: routerPubKeys,
			SecretKeyHomeKey:       key.PEM,
		},
	}
}

// SpareIsCurrent reports whether a spare runs what a spare made from cfg
// now would: the same images, arguments and grace. Any other is replaced.
func SpareIsCurrent(p *corev1.Pod, cfg *lampyrconfig.Config, homesNamespace string) bool {
	want := MakeSparePod(cfg, homesNamespace, p.Name)
	return sameContainers(p.Spec.InitContainers, want.Spec.InitContainers) && sameContainers(p.Spec.Containers, want.Spec.Containers) &&
		ptrEq(p.Spec.TerminationGracePeriodSeconds, want.Spec.TerminationGracePeriodSeconds)
}

func sameContainers(a, b []corev1.Container) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].Image != b[i].Image || !slices.Equal(a[i].Args, b[i].Args) || !slices.Equal(a[i].Command, b[i].Command) {
			return false
		}
	}
	return true
}

func ptrEq(a, b *int64) bool { return (a == nil) == (b == nil) && (a == nil || *a == *b) }

// SpareFits reports whether the spare p can be g's Home: it runs what g's
// own Home Pod would (images and arguments, but for the tenant namespace,
// which fiberd takes from the grant), its grace covers g's, and g's memory
// is at least the spare's (the claim only grows it: a resize never has to
// take memory back from a running fiberd). The reason says why not.
func SpareFits(p *corev1.Pod, g *v1alpha1.CapacityGrant, cfg *lampyrconfig.Config, homesNamespace string) (bool, string) {
	want := MakeHomePod(g, cfg, homesNamespace, 0)
	args := slices.Clone(want.Spec.Containers[0].Args)
	for i, a := range args {
		if strings.HasPrefix(a, "--egress-namespace=") {
			args[i] = "--egress-namespace="
		}
	}
	want.Spec.Containers[0].Args = args
	switch {
	case !sameContainers(p.Spec.InitContainers, want.Spec.InitContainers) || !sameContainers(p.Spec.Containers, want.Spec.Containers):
		return false, "the spare runs another configuration"
	case p.Spec.TerminationGracePeriodSeconds == nil || *p.Spec.TerminationGracePeriodSeconds < HomeGracePeriodSeconds(g):
		return false, "the Revision's timeoutSeconds exceeds what a spare's grace covers"
	}
	mem := HomeResources(g, cfg).Limits[corev1.ResourceMemory]
	if have := p.Spec.Containers[0].Resources.Limits[corev1.ResourceMemory]; mem.Cmp(have) < 0 {
		return false, "the Revision needs less memory than a spare holds"
	}
	return true, ""
}

// MountSecret makes a Home Pod mount the Home Secret name (a claimed
// spare's, which keeps the spare's name) instead of its Home's name.
func MountSecret(p *corev1.Pod, name string) {
	for i := range p.Spec.Volumes {
		if v := p.Spec.Volumes[i].Secret; v != nil && p.Spec.Volumes[i].Name == "home" {
			v.SecretName = name
		}
	}
}
