package bench

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"

	"lampyr.dev/serving/impl/artifact"
)

// plainFloor starts the bench handler (the very snapshot both sides run,
// unpacked on this host) with a plain fork+exec: no namespaces, cgroups,
// helper or mounts, no gateway. What it measures is the floor under any
// process-per-fiber backend's cold request with no warm fiber on this
// machine: the handler's own start until it answers one request
// (docs/performance.md, "The cold request with no warm fiber").
type plainFloor struct {
	bin  string
	port int
}

// newPlainFloor unpacks snap into dir and finds its entrypoint.
func newPlainFloor(ctx context.Context, snap, dir string) (*plainFloor, error) {
	s, err := artifact.Fetch(ctx, snap)
	if err != nil {
		return nil, fmt.Errorf("fetching the bench snapshot for the floor: %w", err)
	}
	if err := s.UnpackContext(ctx, dir); err != nil {
		return nil, fmt.Errorf("unpacking the bench snapshot for the floor: %w", err)
	}
	if len(s.Config.Entrypoint) == 0 {
		return nil, fmt.Errorf("the bench snapshot has no entrypoint")
	}
	bin := filepath.Join(dir, s.Config.Entrypoint[0])
	if _, err := os.Stat(bin); err != nil {
		return nil, err
	}
	return &plainFloor{bin: bin, port: 23000}, nil
}

// once starts the handler, dials it every 500 µs (as the fiber helper
// waits for a handler) until it listens, sends GET / and reads the whole
// answer, then kills it. It returns the time from just before the fork to
// the end of the answer.
func (p *plainFloor) once(ctx context.Context) (time.Duration, error) {
	p.port++
	port := strconv.Itoa(p.port)
	addr := net.JoinHostPort("127.0.0.1", port)
	t0 := time.Now()
	cmd := exec.CommandContext(ctx, p.bin)
	cmd.Env = []string{"PORT=" + port}
	if err := cmd.Start(); err != nil {
		return 0, err
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	var c net.Conn
	for {
		var err error
		if c, err = net.DialTimeout("tcp", addr, 100*time.Millisecond); err == nil {
			break
		}
		if time.Since(t0) > 10*time.Second {
			return 0, fmt.Errorf("the plain handler did not listen on %s within 10s: %v", addr, err)
		}
		time.Sleep(500 * time.Microsecond)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: floor\r\nConnection: close\r\n\r\n"); err != nil {
		return 0, err
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return 0, err
	}
	_, err = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if err != nil {
		return 0, err
	}
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("the plain handler answered %d", resp.StatusCode)
	}
	return time.Since(t0), nil
}

// hostRCUExpedited is /sys/kernel/rcu_expedited ("1", "0", or why it was
// not read): with cgroup v1, moving a fiber's helper into its memory
// cgroup waits for an RCU grace period, which that setting shortens
// (docs/performance.md).
func hostRCUExpedited() string {
	b, err := os.ReadFile("/sys/kernel/rcu_expedited")
	if err != nil {
		return "unknown (" + err.Error() + ")"
	}
	return string(b[:len(b)-1])
}
