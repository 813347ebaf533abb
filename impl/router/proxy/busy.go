package proxy

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"time"

	"lampyr.dev/serving/impl/contract"
	fiberdclient "lampyr.dev/serving/impl/fiberd/client"

	"lampyr.dev/serving/impl/router/pool"
)

// busyRetry covers a race in reuse mode. fiberd marks a fiber free only after
// its proxy handler returns, but the router may already hold the whole
// response (its last bytes were flushed) and hand the fiber to the next
// request, which fiberd then refuses with 409 FiberBusy for a moment. That
// refusal happens before fiberd reads the request, so resending is safe when
// the body can be replayed; the fiber is about to be free.
type busyRetry struct {
	next http.RoundTripper
}

// maxReplayBody is the largest request body kept in memory so a reused
// fiber's request can be resent; larger bodies are sent once.
const maxReplayBody = 64 << 10

const busyRetryBudget = 2 * time.Second

func (b busyRetry) RoundTrip(req *http.Request) (*http.Response, error) {
	lease, _ := req.Context().Value(leaseKey{}).(*pool.Lease)
	if lease == nil || !lease.Reused {
		return b.next.RoundTrip(req)
	}
	replay := req.Body == nil || req.Body == http.NoBody
	var body []byte
	if !replay && req.ContentLength > 0 && req.ContentLength <= maxReplayBody {
		var err error
		if body, err = io.ReadAll(io.LimitReader(req.Body, maxReplayBody+1)); err != nil {
			return nil, err
		}
		req.Body.Close()
		replay = true
	}
	deadline := time.Now().Add(busyRetryBudget)
	wait := time.Millisecond
	for {
		if body != nil {
			req.Body = io.NopCloser(bytes.NewReader(body))
		}
		resp, err := b.next.RoundTrip(req)
		if err != nil || !replay || resp.StatusCode != http.StatusConflict || time.Now().Add(wait).After(deadline) {
			return resp, err
		}
		busy, peeked := isFiberBusy(resp)
		if !busy {
			resp.Body = peeked
			return resp, nil
		}
		select {
		case <-time.After(wait):
		case <-req.Context().Done():
			return nil, req.Context().Err()
		}
		wait = min(2*wait, 50*time.Millisecond)
	}
}

// isFiberBusy reports whether a 409 is fiberd's own FiberBusy refusal rather
// than the handler's 409. It returns a body that still reads in full.
func isFiberBusy(resp *http.Response) (bool, io.ReadCloser) {
	if !strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
		return false, resp.Body
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
	rest := io.NopCloser(io.MultiReader(bytes.NewReader(b), resp.Body))
	body := struct {
		io.Reader
		io.Closer
	}{rest, resp.Body}
	if err != nil {
		return false, body
	}
	var e fiberdclient.Error
	// fiberd's own answer only: a handler's 409 saying FiberBusy is the
	// handler's (fiberd strips the header from handler responses).
	if resp.Header.Get(fiberdclient.AnswerHeader) == "" || json.Unmarshal(b, &e) != nil || e.Reason != contract.ReasonFiberBusy {
		return false, body
	}
	resp.Body.Close()
	return true, nil
}
