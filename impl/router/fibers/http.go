package fibers

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// HTTPClient implements Client over fiberd's JSON API (contracts §4).
type HTTPClient struct {
	// Token returns the router's service token (Secret
	// lampyr-system/fiber-router-token). A function, not a string, so a
	// rotated Secret is picked up without a restart.
	Token func() string
	// API carries the control calls (acquire, release). Its own client so a
	// slow proxied stream never starves acquisitions of connections.
	API *http.Client
}

// NewHTTPClient returns a client with connection pooling sized for one
// acquire and one release per request in fresh mode.
func NewHTTPClient(token func() string) *HTTPClient {
	t := &http.Transport{
		Proxy:               nil, // fiberd is always in-cluster; never follow HTTP_PROXY
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:        1024,
		MaxIdleConnsPerHost: 256,
		IdleConnTimeout:     90 * time.Second,
	}
	return &HTTPClient{Token: token, API: &http.Client{Transport: t, Timeout: 30 * time.Second}}
}

type acquireResponse struct {
	ID        string    `json:"id"`
	StartedAt time.Time `json:"startedAt"`
}

// Acquire implements Client.
func (c *HTTPClient) Acquire(ctx context.Context, home string) (Fiber, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+home+"/v1/fibers", nil)
	if err != nil {
		return Fiber{}, err
	}
	c.authorize(req)
	resp, err := c.API.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return Fiber{}, ctx.Err()
		}
		return Fiber{}, &UnavailableError{Home: home, Reason: err.Error()}
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	switch resp.StatusCode {
	case http.StatusCreated, http.StatusOK:
		var ar acquireResponse
		if err := json.Unmarshal(body, &ar); err != nil || ar.ID == "" {
			return Fiber{}, fmt.Errorf("fiberd %s: acquire answered %d with an unusable body %q", home, resp.StatusCode, truncate(body))
		}
		return Fiber{ID: ar.ID, Home: home, StartedAt: ar.StartedAt}, nil
	case http.StatusTooManyRequests:
		return Fiber{}, &CapacityError{Home: home, RetryAfter: parseRetryAfter(resp.Header.Get("Retry-After"))}
	case http.StatusServiceUnavailable:
		return Fiber{}, &UnavailableError{Home: home, Reason: strings.TrimSpace(truncate(body))}
	default:
		return Fiber{}, fmt.Errorf("fiberd %s: acquire answered %d: %s", home, resp.StatusCode, truncate(body))
	}
}

// Release implements Client.
func (c *HTTPClient) Release(ctx context.Context, f Fiber) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodDelete, "http://"+f.Home+"/v1/fibers/"+url.PathEscape(f.ID), nil)
	if err != nil {
		return err
	}
	c.authorize(req)
	resp, err := c.API.Do(req)
	if err != nil {
		return fmt.Errorf("fiberd %s: release %s: %w", f.Home, f.ID, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	switch {
	case resp.StatusCode/100 == 2, resp.StatusCode == http.StatusNotFound:
		// 404: fiberd already reaped it (its own timeout, a crash); either
		// way nothing of it is left to release.
		return nil
	default:
		return fmt.Errorf("fiberd %s: release %s answered %d: %s", f.Home, f.ID, resp.StatusCode, truncate(body))
	}
}

// PrepareProxy implements Client.
func (c *HTTPClient) PrepareProxy(out *http.Request, f Fiber) {
	out.URL.Scheme = "http"
	out.URL.Host = f.Home
	// Set, never Add: a client-supplied Lampyr-Fiber must not pick a fiber.
	out.Header.Set(FiberHeader, f.ID)
	c.authorize(out)
}

func (c *HTTPClient) authorize(r *http.Request) {
	if c.Token == nil {
		return
	}
	if tok := c.Token(); tok != "" {
		r.Header.Set("Authorization", "Bearer "+tok)
	}
}

func parseRetryAfter(v string) time.Duration {
	if v == "" {
		return time.Second
	}
	if s, err := strconv.Atoi(strings.TrimSpace(v)); err == nil && s >= 0 {
		return time.Duration(s) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil {
		if d := time.Until(t); d > 0 {
			return d
		}
		return 0
	}
	return time.Second
}

func truncate(b []byte) string {
	const max = 512
	if len(b) > max {
		return string(b[:max]) + "..."
	}
	return string(b)
}
