// Package integration tests fiber-router end to end against a real fiberd
// with the process backend on loopback (lampyr.dev/serving/impl/fiberd/fiberdtest):
// HTTP, h2c gRPC, streaming, SSE, WebSockets, cancellation, timeouts,
// max-scale, forged selection headers, probes, drain and fiber leaks.
// The tests skip where real fibers cannot run (no root or no cgroup v1
// memory controller); fiberdtest says why.
package integration
