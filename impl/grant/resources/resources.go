// Package resources builds the objects the grant controller keeps for one
// CapacityGrant: the Home Pod (fiberd + lampyr-helper), its Service and the
// Secret carrying the signed grant and the public keys fiberd needs, plus the
// grant's claims. Pure functions of the grant and the configuration.
//
// Homes live in the Homes namespace (lampyr-homes), never in the tenant's:
// tenant namespaces hold no Lampyr key and run no privileged Pod
// (docs/security.md §1). Owner references cannot cross namespaces, so Home
// objects carry the grant's namespace, name and UID as labels instead and
// the grant controller deletes them when the grant is gone.
package resources

import (
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"lampyr.dev/serving/impl/apis/fiberd/v1alpha1"
	"lampyr.dev/serving/impl/contract"
	"lampyr.dev/serving/impl/contract/lampyrconfig"
	"lampyr.dev/serving/impl/fiberd/backend/gvisor/runscpin"
	"lampyr.dev/serving/impl/trust/homekey"
	"lampyr.dev/serving/impl/trust/signedgrant"
)

// Labels on every object of a Home.
const (
	ComponentKey = "app.kubernetes.io/component"
	Component    = "lampyr-home"
)

// Keys of the Home Secret, mounted at SecretMountPath: its grant, two
// public keys, and the Home's own TLS key (the one private key, which
// lets its holder be this Home to fiber-router and nothing else).
const (
	SecretKeyGrant         = "grant"
	SecretKeyGrantPubKey   = "grant-key.pub"
	SecretKeyRouterPubKeys = "router-keys.pub"
	SecretKeyHomeKey       = "home-key.pem"
	SecretMountPath        = "/var/run/lampyr/home"
	StateMountPath         = "/var/lib/fiberd"
	HelperMountPath        = "/var/lib/lampyr-helper"
)

// APIPort is fiberd's port (docs/contracts.md §4).
const APIPort = 9090

// HomeOverhead is the memory of fiberd itself, added to the fibers' memory
// for the Home Pod's request and limit.
var HomeOverhead = resource.MustParse("256Mi")

// HomeCPURequest is what each Home reserves on its node: Knative's own
// per-Pod reservation (queue-sidecar-cpu-request, 25m), since an idle Home
// costs about what an idle queue-proxy does. At 100m a 2-core Kind node
// fitted 6 Revisions beside the control plane; the 7th Home stayed
// Pending (Insufficient cpu) and its Revision never became Ready.
var HomeCPURequest = resource.MustParse("25m")

// Home volumes other than the state volume (config-lampyr
// home-storage-limit) are small and bounded too: an emptyDir without a
// sizeLimit lets whoever writes it fill the node's disk.
var helperVolumeLimit = resource.MustParse("64Mi")

// IDLockDir is the host directory every Home on a node mounts so that
// fiberd's per-fiber host id ranges never collide across Homes
// (impl/fiberd/backend/process/ids.go).
const IDLockDir = "/run/lampyr/idmap"

// HomeName names the Home Pod, Service and Secret of a grant in the Homes
// namespace: the grant's name (at most 40 characters of it, for reading)
// and 10 hex digits of a hash of namespace/name, so Revisions of the same
// name in two namespaces never share a Home and the name stays a DNS label.
func HomeName(g *v1alpha1.CapacityGrant) string { return HomeNameFor(g.Namespace, g.Name) }

// HomeNameFor is HomeName of the grant namespace/name.
func HomeNameFor(namespace, name string) string {
	sum := sha256.Sum256([]byte(namespace + "/" + name))
	base := name
	if len(base) > 40 {
		base = base[:40]
	}
	return base + "-" + hex.EncodeToString(sum[:5])
}

// IsHomeOf reports whether a Home object (by its labels) belongs to g: the
// same namespace, name and UID. An object with g's Home name but another
// UID is a leftover of an earlier grant of the same name.
func IsHomeOf(obj metav1.Object, g *v1alpha1.CapacityGrant) bool {
	l := obj.GetLabels()
	return l[ComponentKey] == Component && l[contract.GrantNamespaceLabel] == g.Namespace && l[contract.GrantLabel] == g.Name && l[contract.GrantUIDLabel] == string(g.UID)
}

// GrantKeyOf is the namespace/name of the grant a Home object belongs to,
// from its labels; ok is false for objects that are not Homes.
func GrantKeyOf(obj metav1.Object) (namespace, name string, ok bool) {
	l := obj.GetLabels()
	if l[ComponentKey] != Component || l[contract.GrantNamespaceLabel] == "" || l[contract.GrantLabel] == "" {
		return "", "", false
	}
	return l[contract.GrantNamespaceLabel], l[contract.GrantLabel], true
}

// HomeEndpointOf is status.homeEndpoint: the Ready Home Pod's own address
// when it has one, else the Home Service's name. A Pod being deleted is
// passed only while it hands over (still Ready) and its replacement is not
// Ready yet. fiber-router dials the Pod
// directly, as Knative's activator does: no DNS lookup, and no wait for
// kube-proxy to program the Home Service's new endpoint after the Pod turns
// Ready (its minimum sync period is 1 s). A replaced Pod changes the address
// and so the router metadata.
func HomeEndpointOf(g *v1alpha1.CapacityGrant, homesNamespace string, home *corev1.Pod) string {
	if home != nil && home.Status.PodIP != "" && podReady(home) {
		return net.JoinHostPort(home.Status.PodIP, strconv.Itoa(APIPort))
	}
	return HomeEndpoint(g, homesNamespace)
}

// PodEndpoint is fiberd's API on the Home Pod's own address.
func PodEndpoint(home *corev1.Pod) string {
	return net.JoinHostPort(home.Status.PodIP, strconv.Itoa(APIPort))
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// HomeEndpoint is the Home Service's host:port of fiberd's API.
func HomeEndpoint(g *v1alpha1.CapacityGrant, homesNamespace string) string {
	return fmt.Sprintf("%s.%s.svc:%d", HomeName(g), homesNamespace, APIPort)
}

// EffectiveMaxFibers resolves maxFibers 0 to the installation default.
func EffectiveMaxFibers(g *v1alpha1.CapacityGrant, cfg *lampyrconfig.Config) int32 {
	if g.Spec.MaxFibers == 0 {
		return cfg.DefaultMaxFibers
	}
	return g.Spec.MaxFibers
}

// ReservedMemory is what admitting g reserves: memoryPerFiber × maxFibers.
func ReservedMemory(g *v1alpha1.CapacityGrant, cfg *lampyrconfig.Config) int64 {
	return g.Spec.MemoryPerFiber.Value() * int64(EffectiveMaxFibers(g, cfg))
}

// Labels are the labels of every object of g's Home.
func Labels(g *v1alpha1.CapacityGrant) map[string]string {
	return map[string]string{
		contract.GrantLabel:          g.Name,
		contract.GrantNamespaceLabel: g.Namespace,
		contract.GrantUIDLabel:       string(g.UID),
		contract.RevisionLabel:       g.Spec.RevisionName,
		ComponentKey:                 Component,
	}
}

func meta(g *v1alpha1.CapacityGrant, homesNamespace string) metav1.ObjectMeta {
	return metav1.ObjectMeta{Name: HomeName(g), Namespace: homesNamespace, Labels: Labels(g)}
}

// HomeKey is a Home's TLS key (impl/trust/homekey) as the Home Secret keeps
// it, with its fingerprint.
type HomeKey struct {
	// PEM is the PKCS#8 private key (Secret key home-key.pem).
	PEM []byte
	// SHA256 is the fingerprint bound into the grant and status.
	SHA256 string
}

// NewHomeKey makes a Home key: once per Home Secret, kept for its life, so
// a re-created Secret (a new Home) has a new key.
func NewHomeKey() (HomeKey, error) {
	k, err := homekey.Generate()
	if err != nil {
		return HomeKey{}, err
	}
	pemKey, err := homekey.MarshalPrivateKey(k)
	if err != nil {
		return HomeKey{}, err
	}
	return HomeKey{PEM: pemKey, SHA256: homekey.Fingerprint(k.Public().(ed25519.PublicKey))}, nil
}

// HomeKeyOf is the Home key a Home Secret holds; ok is false when it holds
// none that parses (a Secret of an earlier version, or damaged).
func HomeKeyOf(s *corev1.Secret) (HomeKey, bool) {
	if s == nil {
		return HomeKey{}, false
	}
	k, err := homekey.ParsePrivateKey(s.Data[SecretKeyHomeKey])
	if err != nil {
		return HomeKey{}, false
	}
	return HomeKey{PEM: s.Data[SecretKeyHomeKey], SHA256: homekey.Fingerprint(k.Public().(ed25519.PublicKey))}, true
}

// MakeClaims is the content of the signed grant for g, whose template the
// grant controller opened (helper: what it says about the handler), issued
// to the Home whose TLS key has fingerprint homeKeySHA256.
func MakeClaims(g *v1alpha1.CapacityGrant, cfg *lampyrconfig.Config, helper signedgrant.Helper, homeKeySHA256, grantID string, now metav1.Time) signedgrant.Claims {
	mode := string(g.Spec.Execution.Mode)
	if mode == "" {
		mode = string(v1alpha1.ExecutionFresh)
	}
	var idle int64
	if mode == string(v1alpha1.ExecutionReuse) {
		idle = g.Spec.Execution.IdleTimeoutSeconds
	}
	env := map[string]string{}
	for k, v := range g.Spec.Env {
		env[k] = v
	}
	return signedgrant.Claims{
		GrantID:             grantID,
		Home:                HomeName(g),
		HomeKeySHA256:       homeKeySHA256,
		Namespace:           g.Namespace,
		Revision:            g.Spec.RevisionName,
		Template:            g.Spec.Template,
		Helper:              helper,
		SnapshotArtifact:    g.Spec.SnapshotArtifact,
		MemoryPerFiberBytes: g.Spec.MemoryPerFiber.Value(),
		MaxFibers:           EffectiveMaxFibers(g, cfg),
		MaxRequestSeconds:   g.Spec.MaxRequestSeconds,
		Execution:           signedgrant.Execution{Mode: mode, IdleTimeoutSeconds: idle},
		Env:                 env,
		IssuedAt:            now.UTC(),
		ExpiresAt:           now.Add(cfg.GrantTTL).UTC(),
	}
}

// MakeHomeSecret carries the signed grant (with the opened template's
// facts), the grant verification key, fiber-router's public key and the
// Home's own TLS key into the Home. No shared token and no key of the
// installation: read by anyone, it lets them be this one Home to
// fiber-router (serve its Revision's requests, which NetworkPolicy and the
// Home's address keep from reaching them) and act on nothing else
// (docs/security.md §1, §3).
func MakeHomeSecret(g *v1alpha1.CapacityGrant, homesNamespace string, signedGrant, grantPubKey, routerPubKeys []byte, key HomeKey) *corev1.Secret {
	return &corev1.Secret{
		ObjectMeta: meta(g, homesNamespace),
		Type:       corev1.SecretTypeOpaque,
		Data: map[string][]byte{
			SecretKeyGrant:         signedGrant,
			SecretKeyGrantPubKey:   grantPubKey,
			SecretKeyRouterPubKeys: routerPubKeys,
			SecretKeyHomeKey:       key.PEM,
		},
	}
}

// MakeHomeService exposes fiberd's API to fiber-router.
func MakeHomeService(g *v1alpha1.CapacityGrant, homesNamespace string) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: meta(g, homesNamespace),
		Spec: corev1.ServiceSpec{
			Selector: map[string]string{contract.GrantUIDLabel: string(g.UID), ComponentKey: Component},
			Ports: []corev1.ServicePort{{
				Name:       "https",
				Port:       APIPort,
				TargetPort: intstr.FromInt32(APIPort),
				// TLS with the Home's own key (HTTP/1.1 or h2 by ALPN).
				AppProtocol: ptr.To("https"),
			}},
		},
	}
}

// HomeGracePeriodSeconds is the Home Pod's termination grace: fiberd drains
// on SIGTERM (refuses new fibers, lets requests under way finish), so a
// deleted, evicted or drained Home gives its requests their full
// timeoutSeconds, as Knative gives a Revision's Pods (terminationGrace-
// PeriodSeconds = timeoutSeconds). Its replacement starts meanwhile under
// another name (HomePodName).
//
// Before it drains, fiberd serves on for up to HandoverSeconds while the
// replacement starts (fiberd's server.Handover), so the grace adds them.
func HomeGracePeriodSeconds(g *v1alpha1.CapacityGrant) int64 {
	return HandoverSeconds + max(g.Spec.MaxRequestSeconds, 0) + 5
}

// HandoverSeconds is fiberd's server.HandoverMax in seconds (the grant
// controller does not link fiberd's server).
const HandoverSeconds = 60

// HomePodName is the name of g's Home Pod number n: HomeName for 0 (every
// Home before replacements overlapped, and the first of each), then
// HomeName-1, -2, ... for a replacement started while its predecessor
// still drains.
func HomePodName(g *v1alpha1.CapacityGrant, n int) string {
	if n == 0 {
		return HomeName(g)
	}
	return HomeName(g) + "-" + strconv.Itoa(n)
}

// MakeHomePod runs fiberd for g. It is privileged because the process
// backend creates namespaces, mounts and memory cgroups for its fibers; it
// gets no service-account token and no service links, so nothing of the
// cluster's identity can reach a fiber.
func MakeHomePod(g *v1alpha1.CapacityGrant, cfg *lampyrconfig.Config, homesNamespace string, n int) *corev1.Pod {
	return makeHomePod(homePod{
		name: HomePodName(g, n), secret: HomeName(g), labels: Labels(g), namespace: g.Namespace,
		grace: HomeGracePeriodSeconds(g), resources: HomeResources(g, cfg),
	}, cfg, homesNamespace)
}

// homePod is what differs between a grant's Home Pod and a spare.
type homePod struct {
	name, secret string
	labels       map[string]string
	// namespace is the tenant's ("" for a spare: fiberd takes it from
	// the grant it is given).
	namespace string
	grace     int64
	resources corev1.ResourceRequirements
}

func makeHomePod(h homePod, cfg *lampyrconfig.Config, homesNamespace string) *corev1.Pod {
	helperPath := "/lampyr-helper"
	storage := cfg.HomeStorageLimit
	volumes := []corev1.Volume{
		{Name: "home", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: h.secret, DefaultMode: ptr.To[int32](0o400)}}},
		{Name: "state", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{SizeLimit: &storage}}},
		{Name: "idmap", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: IDLockDir, Type: ptr.To(corev1.HostPathDirectoryOrCreate)}}},
	}
	mounts := []corev1.VolumeMount{
		{Name: "home", MountPath: SecretMountPath, ReadOnly: true},
		{Name: "state", MountPath: StateMountPath},
		{Name: "idmap", MountPath: IDLockDir},
	}
	var inits []corev1.Container
	if cfg.HelperImage != "" {
		helperPath = HelperMountPath + "/lampyr-helper"
		volumes = append(volumes, corev1.Volume{Name: "helper", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{SizeLimit: &helperVolumeLimit}}})
		mounts = append(mounts, corev1.VolumeMount{Name: "helper", MountPath: HelperMountPath, ReadOnly: true})
		inits = append(inits, corev1.Container{
			Name:         "install-helper",
			Image:        cfg.HelperImage,
			Command:      []string{"/lampyr-helper", "install", helperPath},
			VolumeMounts: []corev1.VolumeMount{{Name: "helper", MountPath: HelperMountPath}},
		})
	}
	args := []string{
		"--listen=:" + strconv.Itoa(APIPort),
		"--grant-file=" + SecretMountPath + "/" + SecretKeyGrant,
		"--grant-key-file=" + SecretMountPath + "/" + SecretKeyGrantPubKey,
		"--router-keys-file=" + SecretMountPath + "/" + SecretKeyRouterPubKeys,
		// The API is served over TLS with the Home's key only (the grant
		// names its fingerprint; fiber-router accepts no other).
		"--tls-key-file=" + SecretMountPath + "/" + SecretKeyHomeKey,
		"--helper=" + helperPath,
		"--state-dir=" + StateMountPath,
		"--warm-fibers=" + strconv.Itoa(cfg.HomeWarmFibers),
		"--fiber-cpu=" + strconv.FormatInt(cfg.FiberCPULimit.MilliValue(), 10),
		"--id-lock-dir=" + IDLockDir,
		// Half the state volume for the unpacked snapshot; the rest is
		// headroom (a new snapshot is unpacked before the old one goes).
		"--max-unpacked-bytes=" + strconv.FormatInt(cfg.HomeStorageLimit.Value()/2, 10),
	}
	if cfg.HomeWarmIdle > 0 {
		// Only when set: a fiberd that predates the flag still starts
		// under the default configuration. Spares get it too (the same
		// function), so a spare still fits a grant's Home (SpareFits
		// compares arguments).
		args = append(args, "--warm-idle="+cfg.HomeWarmIdle.String())
	}
	for _, m := range cfg.HomeRegistryMirrors {
		args = append(args, "--registry-mirror="+m)
	}
	if cfg.FiberBackend == lampyrconfig.BackendGVisor {
		// runsc ships in the Home image beside fiberd (impl/install).
		args = append(args, "--backend="+lampyrconfig.BackendGVisor, "--runsc="+runscpin.HomePath,
			preinitFlag+strconv.FormatBool(cfg.FiberGVisorPreinit))
	}
	var env []corev1.EnvVar
	if (cfg.Egress == lampyrconfig.EgressCluster || cfg.Egress == lampyrconfig.EgressDirect) && len(cfg.EgressAllow) > 0 {
		args = append(args,
			"--egress="+lampyrconfig.EgressCluster,
			"--egress-domains="+strings.Join(cfg.EgressDomains, ","),
			"--egress-deny-names="+strings.Join(cfg.EgressDenyNames, ","),
			"--egress-allow="+prefixes(cfg.EgressAllow),
			"--egress-deny="+prefixes(cfg.EgressDeny),
			"--egress-namespace="+h.namespace,
		)
		args = append(args, egressDialArgs(cfg)...)
		// fiberd denies its own Pod's and node's addresses too.
		env = []corev1.EnvVar{
			{Name: "POD_IP", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "status.podIP"}}},
			{Name: "HOST_IP", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "status.hostIP"}}},
		}
	}
	// Both probes allow fiberd 5 s to answer: on a busy node (hundreds of
	// fiber starts a second, two cores) the kubelet's 1 s default failed
	// the liveness probe of healthy Homes, and a restarted fiberd loses
	// every fiber it ran. Both every 10 s: a new Home's readiness comes
	// from the grant controller asking fiberd itself every 200 ms in its
	// first 30 s (impl/grant/homeprobe.go), not from the kubelet, and each
	// kubelet probe is a TLS handshake with an idle Home: at 2 s, 200 idle
	// Homes cost the node 100 handshakes a second (issue 32). Readiness
	// fails after 20 s, liveness after 30 s.
	// HTTPS: fiberd's port speaks only TLS (kubelet does not check the
	// certificate, and needs nothing of it).
	readiness := &corev1.Probe{
		ProbeHandler:     corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/readyz", Port: intstr.FromInt32(APIPort), Scheme: corev1.URISchemeHTTPS}},
		PeriodSeconds:    10,
		TimeoutSeconds:   5,
		FailureThreshold: 2,
	}
	liveness := &corev1.Probe{
		ProbeHandler:     corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/healthz", Port: intstr.FromInt32(APIPort), Scheme: corev1.URISchemeHTTPS}},
		PeriodSeconds:    10,
		TimeoutSeconds:   5,
		FailureThreshold: 3,
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: h.name, Namespace: homesNamespace, Labels: h.labels},
		Spec: corev1.PodSpec{
			AutomountServiceAccountToken:  ptr.To(false),
			EnableServiceLinks:            ptr.To(false),
			TerminationGracePeriodSeconds: ptr.To(h.grace),
			RestartPolicy:                 corev1.RestartPolicyAlways,
			InitContainers:                inits,
			Containers: []corev1.Container{{
				Name:            FiberdContainer,
				Image:           cfg.HomeImage,
				Command:         []string{"/fiberd"},
				Args:            args,
				Env:             env,
				Ports:           []corev1.ContainerPort{{Name: "https", ContainerPort: APIPort}},
				SecurityContext: &corev1.SecurityContext{Privileged: ptr.To(true)},
				Resources:       h.resources,
				ReadinessProbe:  readiness,
				LivenessProbe:   liveness,
				VolumeMounts:    mounts,
			}},
			Volumes: volumes,
		},
	}
}

func prefixes(ps []netip.Prefix) string {
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = p.String()
	}
	return strings.Join(out, ",")
}

// HomeResources is what a grant's Home reserves and may use: its fibers'
// memory (memoryPerFiber x maxFibers) and fiberd's own, Knative's per-Pod
// CPU reservation, and a CPU limit. The quota Pod in the tenant's
// namespace carries the same, so the tenant's ResourceQuota and LimitRange
// count what the Home takes.
func HomeResources(g *v1alpha1.CapacityGrant, cfg *lampyrconfig.Config) corev1.ResourceRequirements {
	mem := resource.NewQuantity(ReservedMemory(g, cfg), resource.BinarySI)
	mem.Add(HomeOverhead)
	return corev1.ResourceRequirements{
		Requests: corev1.ResourceList{corev1.ResourceMemory: *mem, corev1.ResourceCPU: HomeCPURequest},
		// A CPU limit: without one a Home whose fibers spin took 1.7 of a
		// node's 2 cores and another tenant's requests slowed 33-74x
		// (issue #22). Fibers inside share it with equal weights.
		Limits: corev1.ResourceList{corev1.ResourceMemory: *mem, corev1.ResourceCPU: cfg.HomeCPULimit},
	}
}

// QuotaPodName names g's quota Pod in g's namespace: the grant's (the
// Revision's) name with a suffix, shortened with a hash when the name would
// not be a valid Pod name.
func QuotaPodName(g *v1alpha1.CapacityGrant) string {
	const suffix = "-lampyr-quota"
	if len(g.Name)+len(suffix) <= 63 {
		return g.Name + suffix
	}
	sum := sha256.Sum256([]byte(g.Name))
	return g.Name[:63-len(suffix)-11] + "-" + hex.EncodeToString(sum[:5]) + suffix
}

// MakeQuotaPod is g's quota Pod: a Pod in the tenant's namespace that is
// never scheduled (a scheduling gate only the tenant could remove, and the
// grant controller replaces a Pod without it) and carries exactly the Home's
// requests and limits, so the namespace's ResourceQuota counts the Revision
// as it would count the tenant's own Pod and its LimitRange checks it
// (docs/security.md, "What a tenant's Kubernetes objects still mean"). It
// meets Pod Security "restricted", mounts nothing and has no token; its
// command exits at once if it is ever run. Owned by the grant, it goes with
// it.
func MakeQuotaPod(g *v1alpha1.CapacityGrant, cfg *lampyrconfig.Config) *corev1.Pod {
	labels := Labels(g)
	labels[ComponentKey] = contract.QuotaPodComponent
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: QuotaPodName(g), Namespace: g.Namespace, Labels: labels,
			Annotations: map[string]string{
				"lampyr.dev/purpose": "Counts what this Revision's Home (in " + contract.HomesNamespace + ") reserves against this namespace's ResourceQuota and LimitRange. Never scheduled; deleting it makes the grant controller create it again.",
			},
			OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(g, v1alpha1.SchemeGroupVersion.WithKind("CapacityGrant"))},
		},
		Spec: corev1.PodSpec{
			SchedulingGates:               []corev1.PodSchedulingGate{{Name: contract.QuotaPodGate}},
			AutomountServiceAccountToken:  ptr.To(false),
			EnableServiceLinks:            ptr.To(false),
			RestartPolicy:                 corev1.RestartPolicyNever,
			TerminationGracePeriodSeconds: ptr.To[int64](0),
			SecurityContext: &corev1.PodSecurityContext{
				RunAsNonRoot:   ptr.To(true),
				RunAsUser:      ptr.To[int64](65532),
				SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
			},
			Containers: []corev1.Container{{
				Name:    "quota",
				Image:   cfg.HomeImage,
				Command: []string{"/fiberd", "-h"}, // prints its flags and exits 0
				SecurityContext: &corev1.SecurityContext{
					AllowPrivilegeEscalation: ptr.To(false),
					ReadOnlyRootFilesystem:   ptr.To(true),
					Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
				},
				Resources: HomeResources(g, cfg),
			}},
		},
	}
}

// FiberdContainer is the Home Pod's container.
const FiberdContainer = "fiberd"

const preinitFlag = "--gvisor-preinit="

// PreinitializesFibers is whether the Home Pod's fiberd restores fibers
// from a checkpoint of the initialized handler (the gvisor backend with
// fiber-gvisor-preinit): only such a Home is asked how its fibers start.
func PreinitializesFibers(pod *corev1.Pod) bool {
	for _, c := range pod.Spec.Containers {
		if c.Name != FiberdContainer {
			continue
		}
		for _, a := range c.Args {
			if a == preinitFlag+"true" {
				return true
			}
		}
	}
	return false
}
