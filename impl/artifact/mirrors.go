// Package fiberd holds what fiberd's commands share: registry access as
// seen from inside a cluster.
package artifact

import (
	"fmt"
	"net/http"
	"strings"

	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// Mirrors maps registry hosts as written in references (e.g. "localhost:5002",
// which is the developer's view of Kind's local registry) to where they are
// reachable from here (e.g. "kind-registry:5000"). References, and so
// digests, stay unchanged; only the connection goes elsewhere.
type Mirrors map[string]string

// ParseMirrors parses "from=to" entries.
func ParseMirrors(entries []string) (Mirrors, error) {
	m := Mirrors{}
	for _, e := range entries {
		from, to, ok := strings.Cut(e, "=")
		if !ok || from == "" || to == "" {
			return nil, fmt.Errorf("registry mirror %q: want from=to, e.g. localhost:5002=kind-registry:5000", e)
		}
		m[from] = to
	}
	return m, nil
}

// RemoteOptions returns go-containerregistry options that apply the mirrors.
func (m Mirrors) RemoteOptions() []remote.Option {
	if len(m) == 0 {
		return nil
	}
	return []remote.Option{remote.WithTransport(&mirrorTransport{mirrors: m, next: remote.DefaultTransport})}
}

type mirrorTransport struct {
	mirrors Mirrors
	next    http.RoundTripper
}

func (t *mirrorTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if to, ok := t.mirrors[r.URL.Host]; ok {
		r = r.Clone(r.Context())
		r.URL.Host = to
		r.Host = to
	}
	return t.next.RoundTrip(r)
}
