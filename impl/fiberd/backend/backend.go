// Package backend is the interface between fiberd's pool and the mechanism
// that runs fibers. The process backend (./process) runs each fiber as a
// Linux process sandbox; a micro-VM backend (Hyperlight) can implement the
// same interface later without touching the pool or the API.
package backend

import (
	"context"
	"errors"
	"net"
	"strings"
	"time"
	"unicode/utf8"

	"lampyr.dev/serving/impl/contract"
)

// Spec describes the fibers of one Revision: the same for every fiber of a
// grant, prepared once when the template and snapshot have been verified.
type Spec struct {
	// Revision, for names and logs.
	Revision string
	// RootFS is the host path of the unpacked, digest-verified snapshot.
	RootFS string
	// Entrypoint is the handler's command inside the root.
	Entrypoint []string
	// Port the handler listens on inside the fiber.
	Port int32
	// Env is the handler's environment (PORT and the K_* variables included).
	Env map[string]string
	// MemoryBytes is the fiber's memory limit (the grant's memoryPerFiber).
	MemoryBytes int64
	// StartupTimeout bounds how long a fiber may take to listen on Port.
	StartupTimeout time.Duration
	// ReadinessPath, if set, must answer GET with 2xx before the fiber is ready.
	ReadinessPath string
	// UID and GID the handler runs as inside the fiber's user namespace
	// (the snapshot's user); 0 for the backend's default (65534). Never
	// root: the artifact's config refuses uid 0.
	UID, GID uint32
}

// Backend starts fibers.
type Backend interface {
	// Start starts a fiber from spec and returns once its handler accepts
	// connections. id is unique within this fiberd.
	Start(ctx context.Context, id string, spec *Spec) (Fiber, error)
	// Name identifies the backend in logs and metrics.
	Name() string
}

// HomeTasks is implemented by a backend that bounds the tasks (processes
// and threads) of all of a Home's fibers together, beside each fiber's own
// bound: a Home of many fibers, each under its own bound, must still not
// take a node's PIDs (issue 31). fiberd sizes it from each grant.
type HomeTasks interface {
	// BoundHomeTasks sets the bound for a grant of maxFibers fibers and
	// returns it (0: no bound). Calling it again with the same value is
	// cheap.
	BoundHomeTasks(maxFibers int) (int, error)
}

// Preinitializer is implemented by a backend that can start fibers from a
// checkpoint of an initialized handler (the gvisor backend): fiberd reports
// on /readyz whether a Revision's fibers are restored or start cold, and
// the Revision's status says so (docs/contracts.md §4).
type Preinitializer interface {
	// PreinitEnabled is whether the backend pre-initializes fibers at all.
	PreinitEnabled() bool
	// Preinit is nil once spec's fibers are restored from a checkpoint,
	// an error wrapping ErrPreinitPending before the checkpoint is made,
	// else why they start cold.
	Preinit(spec *Spec) error
}

// Preparer is implemented by a backend that can make ahead of time what
// fibers of spec need before their handler runs (the process backend's
// sandbox shells): the pool calls it when it gets its spec, so the first
// start does not pay for it either.
type Preparer interface {
	Prepare(spec *Spec)
}

// ErrPreinitPending: the checkpoint is made by a Revision's first fiber
// start, which has not finished yet.
var ErrPreinitPending = errors.New("the checkpoint is made by the Revision's first fiber start, which has not finished")

// Fiber is one running fiber.
type Fiber interface {
	ID() string
	// Dial opens a new connection to the handler's port inside the fiber.
	Dial(ctx context.Context) (net.Conn, error)
	// Done is closed when the fiber has died (killed, crashed, destroyed).
	Done() <-chan struct{}
	// Err says why the fiber died; nil while it runs.
	Err() error
	// Destroy kills the fiber and removes every trace of its sandbox. It is
	// idempotent and returns once the fiber's processes are gone.
	Destroy() error
}

// StartFailure is the error of a Start that failed because of the handler
// itself (it exited, or did not listen or answer its readiness path in
// time), as opposed to the sandbox. The pool backs off on it and fiberd
// reports it as a typed reason (docs/contracts.md §4) so the Revision can
// say what stock Knative says of a crashing container.
type StartFailure struct {
	// Reason is HandlerExited, HandlerNotListening or HandlerNotReady.
	Reason contract.Reason `json:"reason"`
	// ExitCode is the handler's exit status, 128+N when signal N killed it
	// (as kubelet reports a container's); meaningful for HandlerExited.
	ExitCode int32 `json:"exitCode"`
	// Signal names the signal that killed the handler, if one did.
	Signal string `json:"signal,omitempty"`
	// Message says what happened, about the handler only (its port, its
	// timeout): it is shown to the Revision's owner.
	Message string `json:"message"`
	// Output is the end of the handler's stdout and stderr (at most
	// MaxFailureOutput bytes and MaxFailureOutputLines lines, valid UTF-8,
	// control characters other than newline and tab replaced). The
	// backend fills it in; the process backend's helper, which reports
	// the rest of the failure, never sees the output.
	Output string `json:"output,omitempty"`
}

// Bounds of StartFailure.Output: those of kubelet's
// FallbackToLogsOnError termination message, which stock Knative shows.
const (
	MaxFailureOutput      = 2048
	MaxFailureOutputLines = 80
)

func (f *StartFailure) Error() string { return f.Reason.String() + ": " + f.Message }

// LastOutput makes the end of a handler's output fit to show its owner: at
// most MaxFailureOutput bytes and MaxFailureOutputLines lines (a
// partial first line is dropped when whole ones remain), valid UTF-8, and
// no control characters but newline and tab (a terminal or a log viewer
// must not interpret them).
func LastOutput(b []byte) string {
	s := strings.ToValidUTF8(string(b), "\uFFFD")
	s = strings.Map(func(r rune) rune {
		if r == '\n' || r == '\t' {
			return r
		}
		if r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0) {
			return '\uFFFD'
		}
		return r
	}, s)
	s = strings.TrimRight(s, "\n")
	if len(s) > MaxFailureOutput {
		cut := len(s) - MaxFailureOutput
		for cut < len(s) && !utf8.RuneStart(s[cut]) {
			cut++
		}
		rest := s[cut:]
		if i := strings.IndexByte(rest, '\n'); i >= 0 && i < len(rest)-1 {
			rest = rest[i+1:]
		}
		s = rest
	}
	if lines := strings.Split(s, "\n"); len(lines) > MaxFailureOutputLines {
		s = strings.Join(lines[len(lines)-MaxFailureOutputLines:], "\n")
	}
	return s
}
