// Package routermeta is the one codec for the per-Revision execution metadata
// the Lampyr Revision reconciler publishes for fiber-router (docs/contracts.md §2).
package routermeta

import (
	"fmt"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

const (
	// LabelKey marks a ConfigMap as router metadata; fiber-router selects on it.
	LabelKey = "lampyr.dev/router-metadata"
	// RevisionLabelKey names the Revision the metadata belongs to.
	RevisionLabelKey = "serving.knative.dev/revision"
	// NameSuffix is appended to the Revision name to name the ConfigMap.
	NameSuffix = "-lampyr-route"
)

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

// Name is the ConfigMap name for a Revision.
func Name(revision string) string { return revision + NameSuffix }

// MakeConfigMap renders m as the ConfigMap the controller publishes. The
// caller sets owner references.
func MakeConfigMap(m Metadata) *corev1.ConfigMap {
	return &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{
			Name:      Name(m.Revision),
			Namespace: m.Namespace,
			Labels: map[string]string{
				LabelKey:         "true",
				RevisionLabelKey: m.Revision,
			},
		},
		Data: map[string]string{
			"revision":           m.Revision,
			"namespace":          m.Namespace,
			"ready":              strconv.FormatBool(m.Ready),
			"homeEndpoint":       m.HomeEndpoint,
			"maxFibers":          strconv.FormatInt(int64(m.MaxFibers), 10),
			"timeoutSeconds":     strconv.FormatInt(m.TimeoutSeconds, 10),
			"mode":               m.Mode,
			"idleTimeoutSeconds": strconv.FormatInt(m.IdleTimeoutSeconds, 10),
			"protocol":           m.Protocol,
			"generation":         strconv.FormatInt(m.Generation, 10),
		},
	}
}

// FromConfigMap decodes a ConfigMap written by MakeConfigMap. An error names
// the key that is missing or malformed.
func FromConfigMap(cm *corev1.ConfigMap) (Metadata, error) {
	d := cm.Data
	m := Metadata{
		Revision:     d["revision"],
		Namespace:    d["namespace"],
		HomeEndpoint: d["homeEndpoint"],
		Mode:         d["mode"],
		Protocol:     d["protocol"],
	}
	if m.Revision == "" || m.Namespace == "" {
		return m, fmt.Errorf("configmap %s/%s: data.revision and data.namespace are required", cm.Namespace, cm.Name)
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
	return m, nil
}
