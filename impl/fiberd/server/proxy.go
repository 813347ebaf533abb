package server

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"time"

	"lampyr.dev/serving/impl/contract"
	"lampyr.dev/serving/impl/fiberd/client"
	"lampyr.dev/serving/impl/fiberd/pool"
)

func (s *Server) proxy(w http.ResponseWriter, r *http.Request, id string) {
	// Every answer fiberd makes here, rather than the handler, is marked
	// (client.AnswerHeader) for the router.
	own := func() { w.Header().Set(client.AnswerHeader, "1") }
	if status, reason, msg := s.credentialOK(r.Header.Get(client.ProxyAuthHeader)); status != 0 {
		own()
		writeErr(w, status, reason, msg+" (proxied requests carry it in "+client.ProxyAuthHeader+")")
		return
	}
	l, g, status, reason, msg := s.current()
	if l == nil {
		own()
		writeErr(w, status, reason, msg)
		return
	}
	f, end, err := l.pool.Begin(r.Context(), id)
	if err != nil {
		own()
		writeBeginErr(w, err)
		return
	}
	defer end()
	ctx := r.Context()
	if g.MaxRequestSeconds > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, time.Duration(g.MaxRequestSeconds)*time.Second)
		defer cancel()
	}
	reuse := l.pool.Mode() == pool.ModeReuse
	mk := func() *http.Transport {
		tr := &http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				c, err := f.Dial(ctx)
				if err != nil || l.protocol == "h2c" {
					return c, err
				}
				return &answerFirstConn{Conn: c}, nil
			},
			// A fresh fiber serves one request: no connection to keep.
			DisableKeepAlives: !reuse && l.protocol != "h2c",
			// The router already decompresses nothing; pass bytes through.
			DisableCompression:  true,
			MaxIdleConnsPerHost: 1,
			// As Knative's own transports (http.DefaultTransport's value):
			// a request with "Expect: 100-continue" gets its body sent
			// once the handler asks for it, so the client sees a 100
			// Continue only if the handler reads the body, as on stock.
			ExpectContinueTimeout: time.Second,
		}
		if l.protocol == "h2c" {
			tr.Protocols = new(http.Protocols)
			tr.Protocols.SetUnencryptedHTTP2(true)
		}
		return tr
	}
	var tr *http.Transport
	if reuse {
		// A reused fiber keeps its connection between requests (the
		// helper bridges bytes, so keep-alive passes through); the pool
		// closes it when the fiber ends.
		tr = f.Transport(mk)
	}
	if tr == nil { // fresh mode, or the fiber ended meanwhile
		tr = mk()
		defer tr.CloseIdleConnections()
	}

	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme = "http"
			pr.Out.URL.Host = "fiber-" + id
			pr.Out.Host = pr.In.Host
			pr.Out.Header.Del(client.FiberHeader)
			pr.Out.Header.Del(client.ProxyAuthHeader)
			// Rewrite strips these from the outbound request, as a proxy
			// that cannot trust its client must. fiberd's data path is
			// reached only with the router's credential, and the router has set
			// them as Knative's runtime contract promises the handler
			// (Forwarded MUST, X-Forwarded-For/-Proto SHOULD): pass them on
			// unchanged, fiberd is not a hop the handler should see.
			for _, h := range forwardedHeaders {
				if v, ok := pr.In.Header[h]; ok {
					pr.Out.Header[h] = v
				}
			}
		},
		Transport:     tr,
		FlushInterval: -1,
		BufferPool:    copyBuffers{},
		ModifyResponse: func(resp *http.Response) error {
			resp.Header.Del(client.AnswerHeader) // only fiberd's own answers carry it
			return nil
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			own()
			log.Printf("fiber %s: %s %s: %v", id, r.Method, r.URL.Path, err)
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				writeErr(w, http.StatusGatewayTimeout, contract.ReasonRequestTimeout, fmt.Sprintf("request exceeded maxRequestSeconds %d", g.MaxRequestSeconds))
				return
			}
			if ferr := f.Err(); ferr != nil {
				err = fmt.Errorf("%w (%v)", err, ferr)
			}
			writeErr(w, http.StatusBadGateway, contract.ReasonFiberFailed, "fiber "+id+": "+err.Error())
		},
	}
	s.metrics.requests.Inc()
	rp.ServeHTTP(w, r.WithContext(ctx))
}

func writeBeginErr(w http.ResponseWriter, err error) {
	switch {
	case errors.Is(err, pool.ErrUnknown):
		writeErr(w, http.StatusNotFound, contract.ReasonUnknownFiber, err.Error())
	case errors.Is(err, pool.ErrBusy):
		writeErr(w, http.StatusConflict, contract.ReasonFiberBusy, err.Error())
	case errors.Is(err, pool.ErrSpent):
		writeErr(w, http.StatusConflict, contract.ReasonFiberSpent, err.Error())
	case errors.Is(err, pool.ErrTunnelFresh):
		writeErr(w, http.StatusConflict, contract.ReasonTunnelRefused, err.Error())
	default:
		writeErr(w, http.StatusConflict, contract.ReasonUnknownFiber, err.Error())
	}
}

// forwardedHeaders are passed from the router to the fiber unchanged.
var forwardedHeaders = []string{"Forwarded", "X-Forwarded-For", "X-Forwarded-Host", "X-Forwarded-Proto"}
