package client

import (
	"net/http"
	"testing"
	"time"
)

func TestIdleSecondsHeader(t *testing.T) {
	for _, d := range []time.Duration{0, 999 * time.Millisecond, 90*time.Second + 500*time.Millisecond, -time.Second} {
		h := http.Header{}
		h.Set(IdleSecondsHeader, FormatIdleSeconds(d))
		got, ok, err := ParseIdleSeconds(h)
		want := max(d, 0).Truncate(time.Second)
		if !ok || err != nil || got != want {
			t.Errorf("FormatIdleSeconds(%s) = %q, parsed %s %v %v; want %s", d, h.Get(IdleSecondsHeader), got, ok, err, want)
		}
	}
	if _, ok, err := ParseIdleSeconds(http.Header{}); ok || err != nil {
		t.Errorf("absent header: ok %v, err %v; want neither", ok, err)
	}
	for _, v := range []string{"-1", "1.5", "x", "99999999999999999999"} {
		h := http.Header{IdleSecondsHeader: {v}}
		if _, ok, err := ParseIdleSeconds(h); ok || err == nil {
			t.Errorf("%s: %q parsed (ok %v, err %v), want an error", IdleSecondsHeader, v, ok, err)
		}
	}
}
