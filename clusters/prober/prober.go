// Package prober sends requests continuously to Knative Services on one
// or more clusters while something happens to them (an upgrade, a
// controller outage, a deleted Pod, a drained node) and records every
// failure with its time, what it got and the phase it fell in, as
// knative.dev/pkg/test/upgrade's prober does for stock Knative's upgrade
// tests (issue 33). Three kinds of traffic per Service:
//
//   - requests: one GET after another (Options.Interval apart), each
//     answered in time with the wanted status and body, or a failure;
//   - a stream: a long chunked answer (the fixture handler's /stream),
//     each chunk an answer; a stream that ends early is a failure, and a
//     new one is opened;
//   - a WebSocket: one open connection (the fixture handler's /ws echo), a
//     message every Options.Interval, each echo an answer; a connection
//     that breaks is a failure, and a new one is dialled.
//
// The suite names phases (Phase) as it goes; Stop returns a Report: per
// phase, side, Service and kind, what was sent and failed, and the
// longest time without an answer.
package prober

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/gorilla/websocket"
)

// Kind is one kind of traffic.
type Kind string

const (
	Requests  Kind = "requests"
	Stream    Kind = "stream"
	WebSocket Kind = "websocket"
)

// Target is one Service on one side, reached through that side's gateway
// with its own Host header.
type Target struct {
	// Side names the cluster ("stock", "lampyr").
	Side string
	// Service names the Service in the report.
	Service string
	// Gateway is the side's gateway, e.g. http://127.0.0.1:31080.
	Gateway string
	// Host is the Service's host name (the Host header sent).
	Host string
	// Kinds is what traffic this target gets (default: Requests).
	Kinds []Kind
}

// Options shape the traffic. Zero values take the defaults.
type Options struct {
	// Interval is the pause between two requests, and between two
	// WebSocket messages, of one target (default 200ms).
	Interval time.Duration
	// Timeout bounds one request (headers and body), one WebSocket dial
	// and one echo, and the wait for a stream's next chunk (default 10s).
	Timeout time.Duration
	// Path and Want: what a request asks for and what a good answer is
	// (default "/" and status 200 with a non-empty body).
	Path string
	Want func(status int, body []byte) error
	// StreamChunks and StreamDelay: each stream asks for this many chunks
	// this far apart (default 240 chunks 1s apart: a 4-minute stream).
	// Knative ends every request, stream and WebSocket at the Revision's
	// timeoutSeconds (300 s by default), on stock and on Lampyr alike: a
	// probe that outlives it measures that limit, not what a scenario did
	// (a 30-minute outage run saw both sides' WebSockets cut every 5
	// minutes and their streams at chunk 299 of 300).
	StreamChunks int
	StreamDelay  time.Duration
	// WebSocketLife is how long one WebSocket stays open before the prober
	// closes it cleanly and opens the next (default 4m, under Knative's
	// default timeoutSeconds: see StreamChunks).
	WebSocketLife time.Duration
	// Client sends the requests and streams (default: a client of its own
	// that keeps connections alive, as a real client would).
	Client *http.Client
}

func (o *Options) defaults() {
	if o.Interval <= 0 {
		o.Interval = 200 * time.Millisecond
	}
	if o.Timeout <= 0 {
		o.Timeout = 10 * time.Second
	}
	if o.Path == "" {
		o.Path = "/"
	}
	if o.Want == nil {
		o.Want = func(status int, body []byte) error {
			if status != http.StatusOK {
				return fmt.Errorf("status %d", status)
			}
			if len(body) == 0 {
				return fmt.Errorf("empty body")
			}
			return nil
		}
	}
	if o.StreamChunks <= 0 {
		o.StreamChunks = 240
	}
	if o.WebSocketLife <= 0 {
		o.WebSocketLife = 4 * time.Minute
	}
	if o.StreamDelay <= 0 {
		o.StreamDelay = time.Second
	}
	if o.Client == nil {
		o.Client = &http.Client{Transport: &http.Transport{
			Proxy:               nil,
			DialContext:         (&net.Dialer{Timeout: 5 * time.Second}).DialContext,
			MaxIdleConnsPerHost: 8,
			IdleConnTimeout:     30 * time.Second,
		}}
	}
}

// Failure is one request, chunk wait, message or connection that failed.
type Failure struct {
	At      time.Time
	Phase   string
	Side    string
	Service string
	Kind    Kind
	// Status is the HTTP status when one came (0: none).
	Status int
	// Err says what went wrong, without the gateway's address.
	Err string
}

// key is one line of the report.
type key struct {
	phase, side, service string
	kind                 Kind
}

// tally is what one line counts.
type tally struct {
	sent, failed int
	// last is the last answer (or the phase's start); gap the longest
	// time between two of them.
	last time.Time
	gap  time.Duration
}

// Prober runs the traffic until Stop.
type Prober struct {
	opts   Options
	start  time.Time
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu       sync.Mutex
	phase    string
	phases   []string
	tallies  map[key]*tally
	failures []Failure
	// lastAnswer is each target's (side, service, kind) last answer,
	// whatever the phase, so a gap that spans a phase change is counted
	// in the phase where it ends.
	lastAnswer map[key]time.Time
}

// Start begins the traffic to every target in phase. It returns at once;
// the traffic runs until Stop or until ctx ends.
func Start(ctx context.Context, phase string, targets []Target, opts Options) *Prober {
	opts.defaults()
	ctx, cancel := context.WithCancel(ctx)
	p := &Prober{opts: opts, start: time.Now(), cancel: cancel, phase: phase, phases: []string{phase},
		tallies: map[key]*tally{}, lastAnswer: map[key]time.Time{}}
	for _, t := range targets {
		kinds := t.Kinds
		if len(kinds) == 0 {
			kinds = []Kind{Requests}
		}
		for _, k := range kinds {
			p.lastAnswer[key{side: t.Side, service: t.Service, kind: k}] = p.start
			p.wg.Add(1)
			go func() {
				defer p.wg.Done()
				switch k {
				case Stream:
					p.streams(ctx, t)
				case WebSocket:
					p.websocket(ctx, t)
				default:
					p.requests(ctx, t)
				}
			}()
		}
	}
	return p
}

// Phase starts a new phase: what follows is counted under name.
func (p *Prober) Phase(name string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.phase = name
	p.phases = append(p.phases, name)
}

// Stop ends the traffic (in-flight requests are cancelled and not
// counted) and returns the report.
func (p *Prober) Stop() Report {
	p.mu.Lock()
	stopped := time.Now()
	p.mu.Unlock()
	p.cancel()
	p.wg.Wait()
	p.mu.Lock()
	defer p.mu.Unlock()
	r := Report{Phases: append([]string(nil), p.phases...), Failures: append([]Failure(nil), p.failures...), Duration: stopped.Sub(p.start)}
	for k, t := range p.tallies {
		gap := t.gap
		// The time since the last answer counts too: traffic that never
		// came back has its longest gap at the end.
		if last := p.lastAnswer[key{side: k.side, service: k.service, kind: k.kind}]; k.phase == p.phase && stopped.Sub(last) > gap {
			gap = stopped.Sub(last)
		}
		r.Rows = append(r.Rows, Row{Phase: k.phase, Side: k.side, Service: k.service, Kind: k.kind, Sent: t.sent, Failed: t.failed, LongestGap: gap})
	}
	order := map[string]int{}
	for i, ph := range r.Phases {
		if _, ok := order[ph]; !ok {
			order[ph] = i
		}
	}
	sort.Slice(r.Rows, func(i, j int) bool {
		a, b := r.Rows[i], r.Rows[j]
		if order[a.Phase] != order[b.Phase] {
			return order[a.Phase] < order[b.Phase]
		}
		if a.Side != b.Side {
			return a.Side < b.Side
		}
		if a.Service != b.Service {
			return a.Service < b.Service
		}
		return a.Kind < b.Kind
	})
	return r
}

// record counts one attempt of t's kind k that ended at now: an answer
// (err == "") or a failure. Attempts cut by Stop are not counted.
func (p *Prober) record(ctx context.Context, t Target, k Kind, status int, err string) {
	if ctx.Err() != nil {
		return
	}
	now := time.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	tk := key{phase: p.phase, side: t.Side, service: t.Service, kind: k}
	lk := key{side: t.Side, service: t.Service, kind: k}
	tl := p.tallies[tk]
	if tl == nil {
		tl = &tally{}
		p.tallies[tk] = tl
	}
	tl.sent++
	if err != "" {
		tl.failed++
		p.failures = append(p.failures, Failure{At: now, Phase: p.phase, Side: t.Side, Service: t.Service, Kind: k, Status: status, Err: err})
		return
	}
	if gap := now.Sub(p.lastAnswer[lk]); gap > tl.gap {
		tl.gap = gap
	}
	p.lastAnswer[lk] = now
}

// requests sends one GET after another.
func (p *Prober) requests(ctx context.Context, t Target) {
	for ctx.Err() == nil {
		status, err := p.get(ctx, t)
		p.record(ctx, t, Requests, status, err)
		sleep(ctx, p.opts.Interval)
	}
}

func (p *Prober) get(ctx context.Context, t Target) (int, string) {
	rctx, cancel := context.WithTimeout(ctx, p.opts.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(rctx, http.MethodGet, t.Gateway+p.opts.Path, nil)
	if err != nil {
		return 0, err.Error()
	}
	req.Host = t.Host
	resp, err := p.opts.Client.Do(req)
	if err != nil {
		return 0, describe(err, t.Gateway)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return resp.StatusCode, "reading the body: " + describe(err, t.Gateway)
	}
	if err := p.opts.Want(resp.StatusCode, body); err != nil {
		return resp.StatusCode, err.Error() + ": " + short(string(body))
	}
	return resp.StatusCode, ""
}

// streams keeps one long stream open: each chunk is an answer; a stream
// that fails or ends before its last chunk is a failure, and another is
// opened.
func (p *Prober) streams(ctx context.Context, t Target) {
	for ctx.Err() == nil {
		p.stream(ctx, t)
		sleep(ctx, p.opts.Interval)
	}
}

func (p *Prober) stream(ctx context.Context, t Target) {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	u := fmt.Sprintf("%s/stream?n=%d&delayms=%d", t.Gateway, p.opts.StreamChunks, p.opts.StreamDelay.Milliseconds())
	req, err := http.NewRequestWithContext(sctx, http.MethodGet, u, nil)
	if err != nil {
		p.record(ctx, t, Stream, 0, err.Error())
		return
	}
	req.Host = t.Host
	// The headers and each chunk must come within the timeout.
	watchdog := time.AfterFunc(p.opts.Timeout, cancel)
	defer watchdog.Stop()
	resp, err := p.opts.Client.Do(req)
	if err != nil {
		p.record(ctx, t, Stream, 0, "opening the stream: "+describe(err, t.Gateway))
		return
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		p.record(ctx, t, Stream, resp.StatusCode, fmt.Sprintf("opening the stream: status %d: %s", resp.StatusCode, short(string(b))))
		return
	}
	buf := make([]byte, 0, 64)
	one := make([]byte, 1)
	got := 0
	for got < p.opts.StreamChunks {
		watchdog.Reset(p.opts.Timeout + p.opts.StreamDelay)
		n, err := resp.Body.Read(one)
		if n == 1 {
			if one[0] != '\n' {
				buf = append(buf[:min(len(buf), 63)], one[0])
				continue
			}
			got++
			buf = buf[:0]
			p.record(ctx, t, Stream, resp.StatusCode, "")
			continue
		}
		if err != nil {
			why := describe(err, t.Gateway)
			if err == io.EOF {
				why = "the stream ended"
			} else if sctx.Err() != nil && ctx.Err() == nil {
				why = fmt.Sprintf("no chunk within %s", p.opts.Timeout+p.opts.StreamDelay)
			}
			p.record(ctx, t, Stream, resp.StatusCode, fmt.Sprintf("%s after %d of %d chunks", why, got, p.opts.StreamChunks))
			return
		}
	}
}

// websocket keeps one connection open and sends a message every
// Interval: each echo is an answer; a connection that breaks is a
// failure, and another is dialled.
func (p *Prober) websocket(ctx context.Context, t Target) {
	for ctx.Err() == nil {
		p.wsConn(ctx, t)
		sleep(ctx, p.opts.Interval)
	}
}

func (p *Prober) wsConn(ctx context.Context, t Target) {
	u, err := url.Parse(t.Gateway)
	if err != nil {
		p.record(ctx, t, WebSocket, 0, err.Error())
		return
	}
	u.Scheme = strings.Replace(u.Scheme, "http", "ws", 1)
	u.Path = "/ws"
	d := websocket.Dialer{HandshakeTimeout: p.opts.Timeout, Proxy: nil}
	dctx, cancel := context.WithTimeout(ctx, p.opts.Timeout)
	conn, resp, err := d.DialContext(dctx, u.String(), http.Header{"Host": {t.Host}})
	cancel()
	if err != nil {
		status := 0
		if resp != nil {
			status = resp.StatusCode
		}
		p.record(ctx, t, WebSocket, status, "dialling: "+describe(err, t.Gateway))
		return
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	end := time.Now().Add(p.opts.WebSocketLife)
	for i := 0; ctx.Err() == nil; i++ {
		if time.Now().After(end) {
			// Closed by the prober before the Revision's timeout would.
			_ = conn.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, ""), time.Now().Add(p.opts.Timeout))
			return
		}
		msg := fmt.Sprintf("probe-%d", i)
		_ = conn.SetWriteDeadline(time.Now().Add(p.opts.Timeout))
		if err := conn.WriteMessage(websocket.TextMessage, []byte(msg)); err != nil {
			p.record(ctx, t, WebSocket, 0, fmt.Sprintf("sending message %d: %s", i, describe(err, t.Gateway)))
			return
		}
		_ = conn.SetReadDeadline(time.Now().Add(p.opts.Timeout))
		_, got, err := conn.ReadMessage()
		if err != nil {
			p.record(ctx, t, WebSocket, 0, fmt.Sprintf("waiting for echo %d: %s", i, describe(err, t.Gateway)))
			return
		}
		if string(got) != "echo: "+msg {
			p.record(ctx, t, WebSocket, 0, fmt.Sprintf("echo %d: got %q", i, short(string(got))))
			return
		}
		p.record(ctx, t, WebSocket, 0, "")
		sleep(ctx, p.opts.Interval)
	}
}

// describe is err's text without the gateway's address (a report is
// read by people who need what happened, not where).
func describe(err error, gateway string) string {
	s := err.Error()
	if u, perr := url.Parse(gateway); perr == nil && u.Host != "" {
		s = strings.ReplaceAll(s, gateway, "the gateway")
		s = strings.ReplaceAll(s, u.Host, "the gateway")
	}
	return s
}

func short(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > 120 {
		return s[:120] + "…"
	}
	return s
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
