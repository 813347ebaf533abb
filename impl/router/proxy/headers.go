package proxy

import (
	"crypto/rand"
	"encoding/hex"
	"net"
	"net/http"
	"net/http/httputil"
	"strings"
)

// Headers the gateway adds to select a Revision (Kourier and Traefik append
// them per traffic split). They are consumed here: the handler never sees them.
const (
	RevisionHeader  = "Knative-Serving-Revision"
	NamespaceHeader = "Knative-Serving-Namespace"
	RequestIDHeader = "X-Request-Id"
)

// setForwarded makes the outbound request carry what a Knative user
// container sees behind queue-proxy: the gateway's X-Forwarded-Proto/Host
// kept, our peer appended to X-Forwarded-For, and an RFC 7239 Forwarded
// header (a MUST in Knative's runtime contract) derived from the gateway's
// X-Forwarded-* when the gateway sent none.
//
// ReverseProxy's Rewrite hook strips all of these from the outbound request
// because a generic proxy cannot trust them; fiber-router's data ports are
// reached through the cluster's gateway, which sets them, so they are kept.
func setForwarded(pr *httputil.ProxyRequest) {
	in, out := pr.In.Header, pr.Out.Header
	xff := in.Values("X-Forwarded-For")
	xfp := in.Get("X-Forwarded-Proto")
	xfh := in.Get("X-Forwarded-Host")
	if fwd := in.Values("Forwarded"); len(fwd) > 0 {
		out["Forwarded"] = fwd
	} else if len(xff) > 0 || xfp != "" || xfh != "" {
		// queue-proxy's ForwardedShimHandler builds Forwarded from the
		// inbound X-Forwarded-* before its own proxy appends its peer.
		out.Set("Forwarded", generateForwarded(strings.Join(xff, ", "), xfp, xfh))
	}

	if ip, _, err := net.SplitHostPort(pr.In.RemoteAddr); err == nil {
		xff = append(xff, ip)
	}
	if len(xff) > 0 {
		out.Set("X-Forwarded-For", strings.Join(xff, ", "))
	}
	if xfp == "" {
		xfp = "http"
		if pr.In.TLS != nil {
			xfp = "https"
		}
	}
	out.Set("X-Forwarded-Proto", xfp)
	if xfh != "" {
		out.Set("X-Forwarded-Host", xfh)
	}
	if out.Get("Forwarded") == "" {
		// No gateway in front (a direct call): describe this hop.
		out.Set("Forwarded", generateForwarded(strings.Join(xff, ", "), xfp, ""))
	}
}

// generateForwarded follows knative.dev/serving/pkg/queue's
// ForwardedShimHandler so handlers see the same Forwarded value as behind
// queue-proxy. (That package drags in queue-proxy's metrics stack, so it is
// not imported for these few lines.)
func generateForwarded(xff, xfp, xfh string) string {
	var b strings.Builder
	nodes := strings.Split(xff, ",")
	if xff == "" {
		nodes = nil
	}
	first := ""
	if len(nodes) > 0 {
		first = strings.TrimSpace(nodes[0])
		b.WriteString("for=")
		writeNode(&b, first)
	}
	if xfh != "" {
		if first != "" {
			b.WriteByte(';')
		}
		b.WriteString("host=")
		b.WriteString(xfh)
	}
	if xfp != "" {
		if first != "" || xfh != "" {
			b.WriteByte(';')
		}
		b.WriteString("proto=")
		b.WriteString(xfp)
	}
	for _, n := range nodes[min(1, len(nodes)):] {
		b.WriteString(", for=")
		writeNode(&b, strings.TrimSpace(n))
	}
	return b.String()
}

func writeNode(b *strings.Builder, node string) {
	if strings.Contains(node, ":") { // IPv6 must be quoted and bracketed
		b.WriteString(`"[`)
		b.WriteString(node)
		b.WriteString(`]"`)
		return
	}
	b.WriteString(node)
}

// ensureRequestID gives every request an X-Request-Id (Envoy-based gateways
// set one; Traefik does not) so router logs, error bodies and the handler's
// logs can be correlated.
func ensureRequestID(h http.Header) string {
	if id := h.Get(RequestIDHeader); id != "" {
		return id
	}
	var b [16]byte
	_, _ = rand.Read(b[:])
	id := hex.EncodeToString(b[:])
	h.Set(RequestIDHeader, id)
	return id
}
