// Command testhandler is the handler fiber-router's integration tests run in
// real fibers. Each endpoint makes one router behaviour observable: headers
// as the handler sees them, incremental streaming, SSE, WebSocket echo,
// requests that outlive their timeout, and gRPC (unary health check,
// bidirectional streaming echo) over h2c.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/gorilla/websocket"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	testpb "google.golang.org/grpc/interop/grpc_testing"
)

var served atomic.Int64

func main() {
	mux := http.NewServeMux()
	// /: who answered and what it saw.
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{
			"served":     served.Add(1),
			"pid":        os.Getpid(),
			"k_revision": os.Getenv("K_REVISION"),
			"method":     r.Method,
			"path":       r.URL.Path,
			"host":       r.Host,
			"proto":      r.Proto,
			"headers":    r.Header,
			"body":       string(body),
		})
	})
	// /early: answers without reading the request body (Knative allows it).
	mux.HandleFunc("/early", func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "early")
	})
	// /stream?n=N: N chunks, each flushed, then the response stays open
	// until the client leaves. A client can only read all N if the router
	// forwards them as they come.
	mux.HandleFunc("/stream", func(w http.ResponseWriter, r *http.Request) {
		n, _ := strconv.Atoi(r.URL.Query().Get("n"))
		for i := 0; i < n; i++ {
			fmt.Fprintf(w, "chunk %d\n", i)
			w.(http.Flusher).Flush()
		}
		if r.URL.Query().Get("hold") != "" {
			<-r.Context().Done()
		}
	})
	// /sse?n=N: Server-Sent Events, held open after N events.
	mux.HandleFunc("/sse", func(w http.ResponseWriter, r *http.Request) {
		n, _ := strconv.Atoi(r.URL.Query().Get("n"))
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("Cache-Control", "no-cache")
		for i := 0; i < n; i++ {
			fmt.Fprintf(w, "id: %d\nevent: tick\ndata: tick %d\n\n", i, i)
			w.(http.Flusher).Flush()
		}
		<-r.Context().Done()
	})
	// /sleep?ms=N: answers after N ms unless the request ends first.
	mux.HandleFunc("/sleep", func(w http.ResponseWriter, r *http.Request) {
		ms, _ := strconv.Atoi(r.URL.Query().Get("ms"))
		select {
		case <-time.After(time.Duration(ms) * time.Millisecond):
			fmt.Fprintln(w, "slept")
		case <-r.Context().Done():
		}
	})
	// /crash: the handler dies after the response started, so the router's
	// copy of the body fails mid-stream.
	mux.HandleFunc("/crash", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "about to crash")
		w.(http.Flusher).Flush()
		os.Exit(3)
	})
	up := websocket.Upgrader{}
	mux.HandleFunc("/ws", func(w http.ResponseWriter, r *http.Request) {
		c, err := up.Upgrade(w, r, nil)
		if err != nil {
			return
		}
		defer c.Close()
		for {
			t, m, err := c.ReadMessage()
			if err != nil {
				return
			}
			if err := c.WriteMessage(t, append([]byte("echo: "), m...)); err != nil {
				return
			}
		}
	})

	gs := grpc.NewServer()
	hs := health.NewServer()
	hs.SetServingStatus("lampyr.test", healthpb.HealthCheckResponse_SERVING)
	healthpb.RegisterHealthServer(gs, hs)
	testpb.RegisterTestServiceServer(gs, echoService{})

	port := os.Getenv("PORT")
	if port == "" {
		port = "8080"
	}
	srv := &http.Server{
		Addr: "127.0.0.1:" + port,
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.ProtoMajor == 2 && strings.HasPrefix(r.Header.Get("Content-Type"), "application/grpc") {
				gs.ServeHTTP(w, r)
				return
			}
			mux.ServeHTTP(w, r)
		}),
	}
	srv.Protocols = new(http.Protocols)
	srv.Protocols.SetHTTP1(true)
	srv.Protocols.SetUnencryptedHTTP2(true)
	if err := srv.ListenAndServe(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

// echoService answers every FullDuplexCall message with its payload as soon
// as it arrives, so a client that waits for each answer before sending the
// next proves both directions stream.
type echoService struct {
	testpb.UnimplementedTestServiceServer
}

func (echoService) UnaryCall(_ context.Context, req *testpb.SimpleRequest) (*testpb.SimpleResponse, error) {
	return &testpb.SimpleResponse{Payload: req.GetPayload(), Hostname: os.Getenv("K_REVISION")}, nil
}

func (echoService) FullDuplexCall(stream grpc.BidiStreamingServer[testpb.StreamingOutputCallRequest, testpb.StreamingOutputCallResponse]) error {
	for {
		req, err := stream.Recv()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		if err := stream.Send(&testpb.StreamingOutputCallResponse{Payload: req.GetPayload()}); err != nil {
			return err
		}
	}
}
