// Package portability proves one digest-pinned Knative Service behaves the
// same on stock Knative and on Lampyr (seed 000, "Portable Knative Service
// proof"). This file holds the request set, the normalisation of what each
// side answers and the comparisons; the Ginkgo suite runs them on real Kind
// clusters.
package portability

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/gorilla/websocket"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// ProbeHeader is sent with every request and must reach the handler on both
// platforms unchanged.
const ProbeHeader = "X-Lampyr-Portability"

// ComparedRequestHeaders are the request headers compared in /echo answers:
// the ones the client itself sent. Headers each platform's proxies add
// (X-Forwarded-*, X-Request-Id, K-Proxy-Request, Traceparent...) are
// platform facts, not the Service's behaviour, and are left out.
var ComparedRequestHeaders = []string{ProbeHeader, "User-Agent", "Accept", "X-Custom-Case"}

// ComparedResponseHeaders are the response headers compared on every answer.
var ComparedResponseHeaders = []string{"Content-Type"}

// Request is one entry of the fixed request set.
type Request struct {
	Name    string
	Method  string
	Path    string // with query
	Headers map[string]string
	Body    string
}

// RequestSet is the fixed set both platforms answer.
var RequestSet = []Request{
	{Name: "hello", Method: "GET", Path: "/"},
	{Name: "echo-get", Method: "GET", Path: "/echo?a=1&b=two", Headers: map[string]string{"Accept": "application/json", "X-Custom-Case": "MiXeD"}},
	{Name: "echo-post", Method: "POST", Path: "/echo?post=1", Headers: map[string]string{"Content-Type": "text/plain"}, Body: "payload"},
	{Name: "other-path", Method: "GET", Path: "/some/other/path?x=%20y"},
}

// Response is an answer reduced to what must be identical.
type Response struct {
	Status  int
	Headers map[string]string
	// Body for plain answers; Echo for /echo (parsed, filtered).
	Body string `json:",omitempty"`
	Echo *Echo  `json:",omitempty"`
	// Call for /call (parsed; the callee's /echo answer filtered).
	Call *Call `json:",omitempty"`
}

// Echo is the fixture's /echo answer, filtered to the compared facts.
type Echo struct {
	Method  string
	Path    string
	Query   string
	Host    string
	Headers map[string][]string
	Env     map[string]string
}

// Call is the fixture's /call answer: what the handler got when it sent a
// GET to URL itself. Error classifies a call that got no answer ("dns",
// "dns-failure", "connect", "timeout", "protocol"); the handler never
// reports the error's text, which names per-cluster addresses.
type Call struct {
	URL       string            `json:"url"`
	Status    int               `json:"status"`
	Headers   map[string]string `json:"headers,omitempty"`
	Body      string            `json:"body,omitempty"`
	Truncated bool              `json:"truncated,omitempty"`
	Error     string            `json:"error,omitempty"`
	// Echo replaces Body when the callee was the fixture's /echo.
	Echo *Echo `json:"echo,omitempty"`
}

// CallPath is the request path that has the fixture call target.
func CallPath(target string) string { return "/call?url=" + url.QueryEscape(target) }

// ParseCall parses a /call body; when the call went to /echo and was
// answered 200, the callee's echo is parsed and filtered as Do does for
// /echo (its request headers include each platform's proxies').
func ParseCall(raw []byte) (*Call, error) {
	var c Call
	if err := json.Unmarshal(raw, &c); err != nil {
		return nil, err
	}
	if u, err := url.Parse(c.URL); err == nil && strings.HasPrefix(u.Path, "/echo") && c.Status == 200 {
		e, err := ParseEcho([]byte(c.Body))
		if err != nil {
			return nil, fmt.Errorf("the callee's /echo answer: %w (body %q)", err, c.Body)
		}
		c.Echo, c.Body = e, ""
	}
	return &c, nil
}

// Do sends r to a gateway (http://127.0.0.1:PORT) for host and reduces the
// answer.
func Do(ctx context.Context, gateway, host string, r Request) (*Response, error) {
	var body io.Reader
	if r.Body != "" {
		body = strings.NewReader(r.Body)
	}
	req, err := http.NewRequestWithContext(ctx, r.Method, gateway+r.Path, body)
	if err != nil {
		return nil, err
	}
	req.Host = host
	req.Header.Set("User-Agent", "lampyr-portability/1")
	req.Header.Set(ProbeHeader, r.Name)
	for k, v := range r.Headers {
		req.Header.Set(k, v)
	}
	resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	out := &Response{Status: resp.StatusCode, Headers: pick(resp.Header, ComparedResponseHeaders)}
	switch {
	case strings.HasPrefix(r.Path, "/echo") && resp.StatusCode == 200:
		e, err := ParseEcho(raw)
		if err != nil {
			return nil, fmt.Errorf("%s: %w (body %q)", r.Name, err, raw)
		}
		out.Echo = e
	case strings.HasPrefix(r.Path, "/call?") && resp.StatusCode == 200:
		c, err := ParseCall(raw)
		if err != nil {
			return nil, fmt.Errorf("%s: %w (body %q)", r.Name, err, raw)
		}
		out.Call = c
	default:
		out.Body = string(raw)
	}
	return out, nil
}

// ParseEcho parses and filters an /echo body.
func ParseEcho(raw []byte) (*Echo, error) {
	var e Echo
	if err := json.Unmarshal(raw, &e); err != nil {
		return nil, err
	}
	h := map[string][]string{}
	for _, k := range ComparedRequestHeaders {
		if v, ok := http.Header(e.Headers)[http.CanonicalHeaderKey(k)]; ok {
			h[http.CanonicalHeaderKey(k)] = v
		}
	}
	e.Headers = h
	return &e, nil
}

func pick(h http.Header, keys []string) map[string]string {
	out := map[string]string{}
	for _, k := range keys {
		out[k] = h.Get(k)
	}
	return out
}

// Stream is a streamed answer: its chunks, and whether the first arrived
// well before the last (the platform flushed instead of buffering).
type Stream struct {
	Status      int
	Chunks      []string
	Incremental bool
}

// DoStream reads /stream?n=N&delayms=D line by line as it arrives.
func DoStream(ctx context.Context, gateway, host string, n, delayMS int) (*Stream, error) {
	req, err := http.NewRequestWithContext(ctx, "GET", fmt.Sprintf("%s/stream?n=%d&delayms=%d", gateway, n, delayMS), nil)
	if err != nil {
		return nil, err
	}
	req.Host = host
	resp, err := (&http.Client{Timeout: time.Minute}).Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	s := &Stream{Status: resp.StatusCode}
	start := time.Now()
	var first, last time.Duration
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if len(s.Chunks) == 0 {
			first = time.Since(start)
		}
		last = time.Since(start)
		s.Chunks = append(s.Chunks, sc.Text())
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	// The handler sleeps delayMS after each chunk; a buffering proxy would
	// deliver all of them at once.
	s.Incremental = last-first >= time.Duration(delayMS*(n-1))*time.Millisecond/2
	return s, nil
}

// WebSocketEcho sends msgs over a WebSocket to /ws and returns the replies.
func WebSocketEcho(ctx context.Context, gateway, host string, msgs []string) ([]string, error) {
	u, err := url.Parse(gateway)
	if err != nil {
		return nil, err
	}
	u.Scheme = "ws"
	u.Path = "/ws"
	d := websocket.Dialer{HandshakeTimeout: 20 * time.Second}
	hdr := http.Header{"Host": {host}}
	conn, resp, err := d.DialContext(ctx, u.String(), hdr)
	if err != nil {
		status := 0
		if resp != nil {
			status = resp.StatusCode
		}
		return nil, fmt.Errorf("websocket handshake (status %d): %w", status, err)
	}
	defer conn.Close()
	var out []string
	for _, m := range msgs {
		_ = conn.SetWriteDeadline(time.Now().Add(20 * time.Second))
		_ = conn.SetReadDeadline(time.Now().Add(20 * time.Second))
		if err := conn.WriteMessage(websocket.TextMessage, []byte(m)); err != nil {
			return out, err
		}
		_, reply, err := conn.ReadMessage()
		if err != nil {
			return out, err
		}
		out = append(out, string(reply))
	}
	_ = conn.WriteMessage(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, ""))
	return out, nil
}

// Diff is cmp.Diff(stock, lampyr) with a header naming both sides; empty
// when equal.
func Diff(what string, stock, lampyr any) string {
	d := cmp.Diff(stock, lampyr)
	if d == "" {
		return ""
	}
	return fmt.Sprintf("%s differs between stock Knative and Lampyr (-stock +lampyr):\n%s", what, d)
}

// DiffTargets is cmp.Diff(ref, got) with a header naming the reference
// and the target (-reference +target); empty when equal.
func DiffTargets(what, refName, name string, ref, got any) string {
	d := cmp.Diff(ref, got)
	if d == "" {
		return ""
	}
	return fmt.Sprintf("%s differs between %s (the reference) and %s (-%s +%s):\n%s", what, refName, name, refName, name, d)
}

// ServiceSpec is the defaulted Service as an API server returns it, reduced
// to what the user's YAML and the webhook's defaulting decide: spec, and the
// annotations the webhook adds (serving.knative.dev/creator,
// lastModifier). Status, uid, timestamps and managedFields are per-cluster
// facts.
func ServiceSpec(svc *unstructured.Unstructured) map[string]any {
	spec, _, _ := unstructured.NestedMap(svc.Object, "spec")
	ann := svc.GetAnnotations()
	keep := map[string]any{}
	for k, v := range ann {
		if strings.HasPrefix(k, "serving.knative.dev/") {
			keep[k] = v
		}
	}
	return map[string]any{"metadata.labels": toAny(svc.GetLabels()), "metadata.annotations": keep, "spec": spec}
}

func toAny(m map[string]string) map[string]any {
	out := map[string]any{}
	for k, v := range m {
		out[k] = v
	}
	return out
}

// CRDSpec is a CustomResourceDefinition's spec without the conversion
// webhook's caBundle, which Knative's webhook injects from each cluster's
// own generated CA and is therefore different on every cluster by design.
func CRDSpec(crd *unstructured.Unstructured) map[string]any {
	spec, _, _ := unstructured.NestedMap(crd.Object, "spec")
	unstructured.RemoveNestedField(spec, "conversion", "webhook", "clientConfig", "caBundle")
	return spec
}

// GRPCAnswers are a gRPC service's answers through a gateway: the health
// Check of the whole server, and the status code for a service it does not
// have.
type GRPCAnswers struct {
	Check        string
	UnknownCode  string
	UnknownCheck string
}

// GRPCHealth calls grpc.health.v1.Health/Check through a gateway
// (http://127.0.0.1:PORT) with host as the HTTP/2 authority.
func GRPCHealth(ctx context.Context, gateway, host string) (*GRPCAnswers, error) {
	u, err := url.Parse(gateway)
	if err != nil {
		return nil, err
	}
	conn, err := grpc.NewClient(u.Host, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithAuthority(host))
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	hc := healthpb.NewHealthClient(conn)
	out := &GRPCAnswers{}
	r, err := hc.Check(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		return nil, fmt.Errorf("grpc.health.v1.Health/Check: %w", err)
	}
	out.Check = r.GetStatus().String()
	_, err = hc.Check(ctx, &healthpb.HealthCheckRequest{Service: "no.such.Service"})
	st, _ := status.FromError(err)
	out.UnknownCode, out.UnknownCheck = st.Code().String(), st.Message()
	return out, nil
}
