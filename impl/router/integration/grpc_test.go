package integration

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	testpb "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"lampyr.dev/serving/impl/fiberd/fiberdtest"
	"lampyr.dev/serving/impl/router/proxy"
)

func grpcEnv(t *testing.T) (*env, *grpc.ClientConn, context.Context) {
	t.Helper()
	e := startEnv(t, envOptions{fiberd: fiberdtest.Options{Protocol: "h2c"}})
	// gRPC clients speak HTTP/2 with prior knowledge: the h2c port.
	cc, err := grpc.NewClient(e.srv.H2CAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	// The gateway's selection headers, as HTTP/2 request headers.
	ctx := metadata.AppendToOutgoingContext(context.Background(),
		strings.ToLower(proxy.RevisionHeader), e.meta.Revision,
		strings.ToLower(proxy.NamespaceHeader), e.meta.Namespace)
	return e, cc, ctx
}

func TestGRPCUnary(t *testing.T) {
	e, cc, ctx := grpcEnv(t)
	hc := healthpb.NewHealthClient(cc)
	for i := 0; i < 3; i++ {
		resp, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: "lampyr.test"})
		if err != nil {
			t.Fatalf("health check %d: %v", i, err)
		}
		if resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			t.Fatalf("status %v", resp.GetStatus())
		}
	}
	// An error status travels back in the trailers.
	_, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: "no-such-service"})
	if status.Code(err) != codes.NotFound {
		t.Fatalf("unknown service: %v, want NotFound from the handler", err)
	}
	tc := testpb.NewTestServiceClient(cc)
	r, err := tc.UnaryCall(ctx, &testpb.SimpleRequest{Payload: &testpb.Payload{Body: []byte("hi")}})
	if err != nil || string(r.GetPayload().GetBody()) != "hi" || r.GetHostname() != e.meta.Revision {
		t.Fatalf("UnaryCall: %v %v", r, err)
	}
	e.assertNoLeasedFibers()
	// Fresh mode: every RPC is one request with its own fiber.
	if a := e.counter("acquired"); a != 5 {
		t.Fatalf("acquired %v fibers for 5 RPCs", a)
	}
}

func TestGRPCBidirectionalStreaming(t *testing.T) {
	e, cc, ctx := grpcEnv(t)
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	stream, err := testpb.NewTestServiceClient(cc).FullDuplexCall(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Each answer is awaited before the next message is sent: only a
	// router that streams both directions lets this finish.
	for i := 0; i < 5; i++ {
		msg := "ping " + strconv.Itoa(i)
		if err := stream.Send(&testpb.StreamingOutputCallRequest{Payload: &testpb.Payload{Body: []byte(msg)}}); err != nil {
			t.Fatalf("send %d: %v", i, err)
		}
		resp, err := stream.Recv()
		if err != nil {
			t.Fatalf("recv %d: %v", i, err)
		}
		if string(resp.GetPayload().GetBody()) != msg {
			t.Fatalf("recv %d: %q", i, resp.GetPayload().GetBody())
		}
	}
	if live := e.counter("live"); live != 1 {
		t.Fatalf("fibers live during the stream: %v, want 1", live)
	}
	if err := stream.CloseSend(); err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); err == nil {
		t.Fatal("stream did not end after CloseSend")
	}
	e.assertNoLeasedFibers()
}

func TestGRPCWithoutSelectionIsNotFound(t *testing.T) {
	e, cc, _ := grpcEnv(t)
	_, err := healthpb.NewHealthClient(cc).Check(context.Background(), &healthpb.HealthCheckRequest{})
	// The router answers 404 over HTTP/2; gRPC maps it to Unimplemented.
	if status.Code(err) != codes.Unimplemented {
		t.Fatalf("RPC without Revision headers: %v", err)
	}
	if a := e.counter("acquired"); a != 0 {
		t.Fatalf("acquired %v fibers", a)
	}
}
