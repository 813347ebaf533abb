package integration

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
)

// A handler answering before it reads the body, through fiber-router and a
// real fiberd, in both modes: every request gets the handler's answer,
// whatever the body's size or framing (issue #19 saw 502s with fiberd's
// internal error text in 6 of 15 requests with 10 MiB bodies). Enough
// rounds to catch a race that loses 1 request in 20.
func TestHandlerAnswersBeforeReadingBodyThroughRouter(t *testing.T) {
	rounds := 25
	if n, err := strconv.Atoi(os.Getenv("EARLY_ANSWER_ROUNDS")); err == nil && n > 0 {
		rounds = n
	}
	for _, mode := range []string{"fresh", "reuse"} {
		t.Run(mode, func(t *testing.T) {
			e := startEnv(t, envOptions{fiberd: fiberdOpts(mode)})
			for _, size := range []int{100 << 10, 1 << 20, 10 << 20} {
				for _, chunked := range []bool{false, true} {
					body := bytes.Repeat([]byte("x"), size)
					failed, first := 0, ""
					for i := 0; i < rounds; i++ {
						var r io.Reader = bytes.NewReader(body)
						if chunked {
							r = io.MultiReader(r)
						}
						resp, err := e.http.Do(e.request(context.Background(), http.MethodPost, "/early", r))
						got := ""
						if err == nil {
							b, rerr := io.ReadAll(resp.Body)
							resp.Body.Close()
							got = fmt.Sprintf("%d %s", resp.StatusCode, b)
							if rerr != nil {
								got += " (" + rerr.Error() + ")"
							}
						} else {
							got = err.Error()
						}
						if got != "200 early" {
							failed++
							if first == "" {
								first = got
							}
							if strings.Contains(got, "127.0.0.1") {
								t.Errorf("an internal address reached the client: %.300s", got)
							}
						}
					}
					if failed > 0 {
						t.Errorf("%d KiB, chunked %v: %d of %d failed; first: %.300s", size>>10, chunked, failed, rounds, first)
					}
				}
			}
			e.settle()
			e.assertNoLeasedFibersIfFresh(mode)
		})
	}
}
