// Package routermeta is the one codec for the per-Revision execution metadata
// the Lampyr Revision reconciler publishes for fiber-router (docs/contracts.md
// §2, docs/security.md §4).
//
// The metadata lives in Lampyr's own namespace (the controller's, where
// tenants cannot write), one ConfigMap per Revision named after the
// Revision's namespace and name. fiber-router reads only that namespace, so a
// ConfigMap a tenant creates anywhere is never read.
package routermeta

import (
	"fmt"
	"net"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"lampyr.dev/serving/impl/contract"
	"lampyr.dev/serving/impl/trust/homekey"
)

const (
	// NamePrefix starts every router metadata ConfigMap's name.
	NamePrefix = "route."
)

// MaxBytes bounds one metadata ConfigMap's data (keys and values); what the
// controller writes is a few hundred bytes. fiber-router ignores bigger ones.
const MaxBytes = 4096

// Protocols a handler can speak.
const (
	ProtocolHTTP1 = "http1"
	ProtocolH2C   = "h2c"
)

// Metadata is what fiber-router needs to serve one Revision.
type Metadata struct {
	Revision  string
	Namespace string
	// Ready is false while the Revision is being (re)built or torn down;
	// fiber-router answers 503 for it then.
	Ready bool
	// HomeEndpoint is host:port of the Home's fiberd API.
	HomeEndpoint string
	// Home is the Home's name in the Homes namespace: the audience of the
	// credentials fiber-router presents to it (impl/fiberd/routercred).
	Home string
	// HomeKeySHA256 is the fingerprint of the Home's TLS key (the grant's
	// status.homeKeySHA256, impl/trust/homekey): fiber-router dials the
	// Home over TLS and accepts no other key. Empty for a Home of a version
	// before Home keys, which fiber-router dials only when told to
	// (--allow-unauthenticated-homes).
	HomeKeySHA256 string
	// MaxFibers caps concurrent fibers (max-scale); 0 means the installation default.
	MaxFibers int32
	// TimeoutSeconds is the longest request/stream/WebSocket life.
	TimeoutSeconds int64
	// Mode is "fresh" or "reuse".
	Mode string
	// IdleTimeoutSeconds applies to "reuse".
	IdleTimeoutSeconds int64
	// Protocol is ProtocolHTTP1 or ProtocolH2C.
	Protocol string
	// Generation is the Revision generation the metadata was built from.
	Generation int64
}

// Name is the ConfigMap name for a Revision: "route.<namespace>.<revision>".
// Namespaces and Revision names are DNS labels (no dots), so the name is
// unambiguous.
func Name(namespace, revision string) string { return NamePrefix + namespace + "." + revision }

// MakeConfigMap renders m as the ConfigMap the controller publishes in
// systemNamespace.
func MakeConfigMap(systemNamespace string, m Metadata) *corev1.ConfigMap {
	return &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{
			Name:      Name(m.Namespace, m.Revision),
			Namespace: systemNamespace,
			Labels: map[string]string{
				contract.RouterMetadataLabel:    "true",
				contract.RevisionLabel:          m.Revision,
				contract.RevisionNamespaceLabel: m.Namespace,
			},
		},
		Data: map[string]string{
			"revision":           m.Revision,
			"namespace":          m.Namespace,
			"ready":              strconv.FormatBool(m.Ready),
			"homeEndpoint":       m.HomeEndpoint,
			"home":               m.Home,
			"homeKeySHA256":      m.HomeKeySHA256,
			"maxFibers":          strconv.FormatInt(int64(m.MaxFibers), 10),
			"timeoutSeconds":     strconv.FormatInt(m.TimeoutSeconds, 10),
			"mode":               m.Mode,
			"idleTimeoutSeconds": strconv.FormatInt(m.IdleTimeoutSeconds, 10),
			"protocol":           m.Protocol,
			"generation":         strconv.FormatInt(m.Generation, 10),
		},
	}
}

// FromConfigMap decodes a ConfigMap written by MakeConfigMap and checks that
// its name, labels and data agree and that it is small. An error names the
// key that is missing or malformed.
func FromConfigMap(cm *corev1.ConfigMap) (Metadata, error) {
	d := cm.Data
	size := 0
	for k, v := range d {
		size += len(k) + len(v)
	}
	if size > MaxBytes || len(cm.BinaryData) > 0 {
		return Metadata{}, fmt.Errorf("configmap %s/%s: %d bytes of data, more than router metadata ever holds (%d): ignored", cm.Namespace, cm.Name, size, MaxBytes)
	}
	m := Metadata{
		Revision:     d["revision"],
		Namespace:    d["namespace"],
		HomeEndpoint: d["homeEndpoint"],
		Home:         d["home"],
		// Absent in metadata of an earlier controller: the same as empty.
		HomeKeySHA256: d["homeKeySHA256"],
		Mode:          d["mode"],
		Protocol:      d["protocol"],
	}
	if m.Revision == "" || m.Namespace == "" {
		return m, fmt.Errorf("configmap %s/%s: data.revision and data.namespace are required", cm.Namespace, cm.Name)
	}
	if cm.Name != Name(m.Namespace, m.Revision) || cm.Labels[contract.RevisionLabel] != m.Revision || cm.Labels[contract.RevisionNamespaceLabel] != m.Namespace {
		return m, fmt.Errorf("configmap %s/%s claims Revision %s/%s but is not named %q and labelled for it: ignored",
			cm.Namespace, cm.Name, m.Namespace, m.Revision, Name(m.Namespace, m.Revision))
	}
	var err error
	if m.Ready, err = strconv.ParseBool(d["ready"]); err != nil {
		return m, fmt.Errorf("configmap %s/%s: data.ready: %w", cm.Namespace, cm.Name, err)
	}
	ints := []struct {
		key string
		dst *int64
	}{
		{"timeoutSeconds", &m.TimeoutSeconds},
		{"idleTimeoutSeconds", &m.IdleTimeoutSeconds},
		{"generation", &m.Generation},
	}
	for _, f := range ints {
		if *f.dst, err = strconv.ParseInt(d[f.key], 10, 64); err != nil {
			return m, fmt.Errorf("configmap %s/%s: data.%s: %w", cm.Namespace, cm.Name, f.key, err)
		}
	}
	maxFibers, err := strconv.ParseInt(d["maxFibers"], 10, 32)
	if err != nil {
		return m, fmt.Errorf("configmap %s/%s: data.maxFibers: %w", cm.Namespace, cm.Name, err)
	}
	m.MaxFibers = int32(maxFibers)
	switch m.Mode {
	case "fresh", "reuse":
	default:
		return m, fmt.Errorf("configmap %s/%s: data.mode %q: want fresh or reuse", cm.Namespace, cm.Name, m.Mode)
	}
	switch m.Protocol {
	case ProtocolHTTP1, ProtocolH2C:
	default:
		return m, fmt.Errorf("configmap %s/%s: data.protocol %q: want %s or %s", cm.Namespace, cm.Name, m.Protocol, ProtocolHTTP1, ProtocolH2C)
	}
	if m.HomeKeySHA256 != "" {
		if err := homekey.CheckFingerprint(m.HomeKeySHA256); err != nil {
			return m, fmt.Errorf("configmap %s/%s: data.homeKeySHA256: %w", cm.Namespace, cm.Name, err)
		}
	}
	if m.Ready && (m.HomeEndpoint == "" || m.Home == "") {
		return m, fmt.Errorf("configmap %s/%s: ready but data.homeEndpoint or data.home is empty", cm.Namespace, cm.Name)
	}
	return m, nil
}

// CheckHomeEndpoint says whether endpoint is one fiber-router may dial: an
// IP address (a Home Pod's) or a Service in homesNamespace, with a port.
// fiber-router dials nothing else, whatever metadata says.
func CheckHomeEndpoint(endpoint, homesNamespace string) error {
	host, port, err := net.SplitHostPort(endpoint)
	if err != nil {
		return fmt.Errorf("home endpoint %q: want host:port", endpoint)
	}
	if p, err := strconv.Atoi(port); err != nil || p <= 0 || p > 65535 {
		return fmt.Errorf("home endpoint %q: bad port", endpoint)
	}
	if ip := net.ParseIP(host); ip != nil {
		if ip.IsLoopback() || ip.IsUnspecified() || ip.IsLinkLocalUnicast() || ip.IsMulticast() {
			return fmt.Errorf("home endpoint %q: not a Pod address", endpoint)
		}
		return nil
	}
	labels := strings.Split(strings.TrimSuffix(host, "."), ".")
	if len(labels) >= 3 && labels[1] == homesNamespace && labels[2] == "svc" && (len(labels) == 3 || strings.Join(labels[3:], ".") == "cluster.local") {
		return nil
	}
	return fmt.Errorf("home endpoint %q: neither an IP nor a Service in namespace %s", endpoint, homesNamespace)
}
