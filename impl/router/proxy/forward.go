package proxy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"strconv"
	"strings"
	"time"

	"lampyr.dev/serving/impl/contract"
	fiberdclient "lampyr.dev/serving/impl/fiberd/client"

	"lampyr.dev/serving/impl/router/fibers"
	"lampyr.dev/serving/impl/router/pool"
)

// tunnelTransport sends a request over its fiber's tunnel; when the Home
// turns out to have no tunnel call (an older fiberd during an upgrade) it
// sends it through the proxy path instead. Nothing was sent then, so the
// request is whole.
type tunnelTransport struct {
	tunnels  fibers.Tunnels
	client   fibers.Client
	fallback http.RoundTripper
}

func (t tunnelTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.tunnels.TunnelTransport().RoundTrip(req)
	var nt *fibers.NoTunnelError
	if err == nil || !errors.As(err, &nt) {
		return resp, err
	}
	lease := req.Context().Value(leaseKey{}).(*pool.Lease)
	out := req.Clone(req.Context())
	t.client.PrepareProxy(out, lease.Fiber)
	return t.fallback.RoundTrip(out)
}

// homeTransport sends a proxied request over the connections of its
// fiber's Home (fibers.ProxyTransports): TLS that accepts only the key the
// Home's metadata names.
type homeTransport struct {
	homes fibers.ProxyTransports
	h2    bool
}

func (t homeTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	lease, _ := req.Context().Value(leaseKey{}).(*pool.Lease)
	if lease == nil {
		return nil, errors.New("proxied request without a fiber lease")
	}
	rt, err := t.homes.ProxyTransport(lease.Fiber, t.h2)
	if err != nil {
		return nil, err
	}
	return rt.RoundTrip(req)
}

// newHTTP1Transport and newH2CTransport carry proxied requests for a
// Client without per-Home connections (tests' fakes), in clear.
func newHTTP1Transport() *http.Transport {
	return &http.Transport{
		Proxy:               nil,
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:        4096,
		MaxIdleConnsPerHost: 1024,
		IdleConnTimeout:     90 * time.Second,
		// Bodies pass through untouched; the handler owns compression.
		DisableCompression: true,
		// As Knative's transports (http.DefaultTransport's value): the body
		// of an "Expect: 100-continue" request goes once fiberd (and so the
		// handler) asks for it, and the client sees the handler's 100
		// Continue, or none if it answers without reading, as on stock.
		ExpectContinueTimeout: time.Second,
	}
}

// newH2CTransport speaks HTTP/2 with prior knowledge to fiberd, so gRPC
// streams (full duplex, trailers) keep their semantics end to end.
func newH2CTransport() *http.Transport {
	t := newHTTP1Transport()
	t.Protocols = new(http.Protocols)
	t.Protocols.SetUnencryptedHTTP2(true)
	return t
}

type leaseKey struct{}

func (r *Router) newReverseProxy(t http.RoundTripper, prepare func(*http.Request, fibers.Fiber)) *httputil.ReverseProxy {
	return &httputil.ReverseProxy{
		Transport: t,
		Rewrite: func(pr *httputil.ProxyRequest) {
			lease := pr.In.Context().Value(leaseKey{}).(*pool.Lease)
			prepare(pr.Out, lease.Fiber)
			if pr.Out.Body != nil && pr.Out.Body != http.NoBody && pr.Out.ContentLength > 0 {
				pr.Out.Body = &declaredLengthBody{rc: pr.Out.Body, left: pr.Out.ContentLength}
			}
			pr.Out.Host = pr.In.Host // the handler sees the Host the client used
			setForwarded(pr)
		},
		// As queue-proxy (knative.dev/networking/pkg/http/proxy.FlushInterval):
		// 0 still flushes every write of a streamed response (no
		// Content-Length) and of text/event-stream at once, and saves a
		// syscall per write for bodies of known length.
		FlushInterval:  0,
		BufferPool:     bufferPool{},
		ErrorHandler:   r.proxyError,
		ModifyResponse: r.fiberdAnswer,
		ErrorLog:       log.New(slogWriter{r.log}, "", 0),
	}
}

// fiberdAnswer turns an answer fiberd made itself (fiberdclient.AnswerHeader:
// the fiber failed, ended or timed out, the credential was refused) into the
// router's own error, as proxyError does for a fiber it could not reach:
// fiberd's message names fiber ids and loopback addresses, which go to the
// log, never to the client. The lease ends: the fiber is not put back.
func (r *Router) fiberdAnswer(resp *http.Response) error {
	if resp.Header.Get(fiberdclient.AnswerHeader) == "" {
		return nil
	}
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
	resp.Body.Close()
	var fe fiberdclient.Error
	_ = json.Unmarshal(b, &fe)
	req := resp.Request
	reqID := req.Header.Get(RequestIDHeader)
	err := fmt.Errorf("fiberd answered %d %s: %s", resp.StatusCode, fe.Reason, truncateString(fe.Message, 512))
	if pe, ok := req.Context().Value(proxyErrKey{}).(*proxyErr); ok {
		pe.err = err
	}
	status, msg := http.StatusBadGateway, "the fiber failed before it answered"
	switch {
	case fe.Reason == contract.ReasonRequestTimeout || resp.StatusCode == http.StatusGatewayTimeout:
		status, msg = http.StatusGatewayTimeout, "request exceeded the Revision's timeoutSeconds"
	case fe.Reason == contract.ReasonFiberBusy:
		status, msg = http.StatusServiceUnavailable, "the fiber is busy"
	}
	r.log.Warn("fiberd answered instead of the handler", "request", reqID, "status", resp.StatusCode, "reason", fe.Reason, "err", err)
	body := fmt.Sprintf("fiber-router: %s\n", msg)
	h := http.Header{}
	h.Set("Content-Type", "text/plain; charset=utf-8")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	if status == http.StatusServiceUnavailable {
		h.Set("Retry-After", "1")
	}
	if reqID != "" {
		h.Set(RequestIDHeader, reqID)
	}
	resp.StatusCode, resp.Status = status, fmt.Sprintf("%d %s", status, http.StatusText(status))
	resp.Header, resp.Trailer = h, nil
	resp.ContentLength = int64(len(body))
	resp.TransferEncoding = nil
	resp.Body = io.NopCloser(strings.NewReader(body))
	return nil
}

type proxyErrKey struct{}

type proxyErr struct {
	err error
	// client is the client's own request context (the proxied request
	// carries the router's timeout/shutdown context instead).
	client context.Context
}

// proxyError is ReverseProxy's ErrorHandler: the fiber could not be reached
// or the response could not be read before anything was written.
func (r *Router) proxyError(w http.ResponseWriter, req *http.Request, err error) {
	clientGone := false
	if pe, ok := req.Context().Value(proxyErrKey{}).(*proxyErr); ok {
		pe.err = err
		clientGone = pe.client.Err() != nil
	}
	reqID := req.Header.Get(RequestIDHeader)
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		r.fail(w, reqID, http.StatusGatewayTimeout, "request exceeded the Revision's timeoutSeconds")
	case r.hardStop.Err() != nil && !clientGone:
		w.Header().Set("Retry-After", "1")
		r.fail(w, reqID, http.StatusServiceUnavailable, "this fiber-router replica is shutting down")
	case errors.Is(err, context.Canceled):
		// The client is gone: record it, nobody reads an answer.
		w.WriteHeader(499)
	default:
		r.log.Warn("proxy to fiber failed", "request", reqID, "err", err)
		r.fail(w, reqID, http.StatusBadGateway, "the fiber could not be reached")
	}
}
