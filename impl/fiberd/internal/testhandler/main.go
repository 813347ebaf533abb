// Command testhandler is the fixture handler fiberd's tests run in fibers.
// Each endpoint makes one property of the sandbox observable from inside.
package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/gorilla/websocket"
)

var served atomic.Int64

// ballast is the memory TESTHANDLER_INIT_ALLOC_MIB touched at start-up.
var ballast []byte

func main() {
	if len(os.Args) > 1 && os.Args[1] == "sleep" {
		time.Sleep(time.Hour)
		return
	}
	// A handler that fails at start-up (argument or TESTHANDLER_START):
	// "exit:N" writes a few lines and exits with N, "kill" is killed by
	// SIGKILL, "nolisten" writes a line and never listens, "flood" writes
	// 200 long lines and exits with 1.
	start := os.Getenv("TESTHANDLER_START")
	if len(os.Args) > 1 {
		start = os.Args[1]
	}
	switch {
	case strings.HasPrefix(start, "exit:"):
		code, _ := strconv.Atoi(strings.TrimPrefix(start, "exit:"))
		fmt.Println("Started...")
		fmt.Fprintln(os.Stderr, "\x1b[31mabout to crash\x1b[0m\r")
		fmt.Println("Crashed...")
		os.Exit(code)
	case start == "kill":
		fmt.Println("killing myself")
		syscall.Kill(os.Getpid(), syscall.SIGKILL)
		time.Sleep(time.Hour)
	case start == "nolisten":
		fmt.Println("listening nowhere")
		time.Sleep(time.Hour)
	case start == "flood":
		for i := 0; i < 200; i++ {
			fmt.Printf("line %03d %s\n", i, strings.Repeat("x", 90))
		}
		os.Exit(1)
	}
	// A handler whose start-up is slow (issue 35's pre-initialized
	// fibers): TESTHANDLER_INIT_SLEEP sleeps that long before it listens,
	// TESTHANDLER_INIT_ALLOC_MIB allocates and touches that many MiB.
	initStart := time.Now()
	if d, err := time.ParseDuration(os.Getenv("TESTHANDLER_INIT_SLEEP")); err == nil {
		time.Sleep(d)
	}
	if mib, _ := strconv.Atoi(os.Getenv("TESTHANDLER_INIT_ALLOC_MIB")); mib > 0 {
		ballast = make([]byte, mib<<20)
		for i := 0; i < len(ballast); i += 4096 {
			ballast[i] = 1
		}
	}
	initTook := time.Since(initStart)
	mux := http.NewServeMux()
	// init: how long this handler's start-up took, and when it ran (a
	// fiber restored from a checkpoint answers the checkpointed run's).
	mux.HandleFunc("/init", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, map[string]any{"startedUnixNano": initStart.UnixNano(), "tookMillis": initTook.Milliseconds(), "ballastMiB": len(ballast) >> 20, "served": served.Load()})
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		n := served.Add(1)
		host, _ := os.Hostname()
		writeJSON(w, map[string]any{
			"served":          n,
			"pid":             os.Getpid(),
			"uid":             os.Getuid(),
			"hostname":        host,
			"port":            os.Getenv("PORT"),
			"k_service":       os.Getenv("K_SERVICE"),
			"k_configuration": os.Getenv("K_CONFIGURATION"),
			"k_revision":      os.Getenv("K_REVISION"),
			"env":             os.Environ(),
			"headers":         r.Header,
			"proto":           r.Proto,
			"host":            r.Host,
		})
	})
	// upload: reads the whole body and says how long it was.
	mux.HandleFunc("/upload", func(w http.ResponseWriter, r *http.Request) {
		n, err := io.Copy(io.Discard, r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		fmt.Fprintf(w, "%d", n)
	})
	// forge: a handler claiming to be fiberd (client.AnswerHeader).
	mux.HandleFunc("/forge", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Lampyr-Fiberd-Answer", "1")
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadGateway)
		io.WriteString(w, `{"reason":"FiberFailed","message":"forged by the handler"}`)
	})
	// read?path=P: can the fiber read P?
	mux.HandleFunc("/read", func(w http.ResponseWriter, r *http.Request) {
		b, err := os.ReadFile(r.URL.Query().Get("path"))
		if err != nil {
			http.Error(w, err.Error(), http.StatusNotFound)
			return
		}
		w.Write(b)
	})
	// write?path=P: can the fiber write P?
	mux.HandleFunc("/write", func(w http.ResponseWriter, r *http.Request) {
		p := r.URL.Query().Get("path")
		if err := os.WriteFile(p, []byte("x"), 0o644); err != nil {
			http.Error(w, err.Error(), http.StatusForbidden)
			return
		}
		fmt.Fprintln(w, "wrote", p)
	})
	// ps: the processes this fiber can see.
	mux.HandleFunc("/ps", func(w http.ResponseWriter, r *http.Request) {
		ents, _ := os.ReadDir("/proc")
		procs := map[string]string{}
		for _, e := range ents {
			if _, err := strconv.Atoi(e.Name()); err == nil {
				c, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
				procs[e.Name()] = strings.ReplaceAll(strings.TrimRight(string(c), "\x00"), "\x00", " ")
			}
		}
		writeJSON(w, procs)
	})
	// dial?addr=H:P: can the fiber open a TCP connection to H:P? With
	// lport=N it connects from that local port (retrying while the port's
	// last connection is still closing) and reads until the other side
	// closes, so a second dial reuses the 4-tuple at once.
	mux.HandleFunc("/dial", func(w http.ResponseWriter, r *http.Request) {
		d := net.Dialer{Timeout: time.Second}
		lport, _ := strconv.Atoi(r.URL.Query().Get("lport"))
		if lport > 0 {
			d.LocalAddr = &net.TCPAddr{Port: lport}
			d.Control = func(_, _ string, rc syscall.RawConn) error {
				return rc.Control(func(fd uintptr) { syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_REUSEADDR, 1) })
			}
		}
		var c net.Conn
		var err error
		for range 20 {
			if c, err = d.Dial("tcp", r.URL.Query().Get("addr")); !errors.Is(err, syscall.EADDRNOTAVAIL) && !errors.Is(err, syscall.EADDRINUSE) {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		if lport > 0 {
			c.SetReadDeadline(time.Now().Add(2 * time.Second))
			io.Copy(io.Discard, c)
		}
		c.Close()
		fmt.Fprintln(w, "connected")
	})
	// alloc?mb=N: allocate and touch N MiB and hold it.
	var hold [][]byte
	mux.HandleFunc("/alloc", func(w http.ResponseWriter, r *http.Request) {
		mb, _ := strconv.Atoi(r.URL.Query().Get("mb"))
		for i := 0; i < mb; i++ {
			b := make([]byte, 1<<20)
			for j := 0; j < len(b); j += 4096 {
				b[j] = 1
			}
			hold = append(hold, b)
		}
		fmt.Fprintf(w, "allocated %d MiB\n", mb)
	})
	// stream?n=N: N flushed chunks, 10 ms apart.
	mux.HandleFunc("/stream", func(w http.ResponseWriter, r *http.Request) {
		n, _ := strconv.Atoi(r.URL.Query().Get("n"))
		for i := 0; i < n; i++ {
			fmt.Fprintf(w, "chunk %d\n", i)
			w.(http.Flusher).Flush()
			time.Sleep(10 * time.Millisecond)
		}
	})
	// sleep?ms=N
	mux.HandleFunc("/sleep", func(w http.ResponseWriter, r *http.Request) {
		ms, _ := strconv.Atoi(r.URL.Query().Get("ms"))
		select {
		case <-time.After(time.Duration(ms) * time.Millisecond):
			fmt.Fprintln(w, "slept")
		case <-r.Context().Done():
		}
	})
	// spawn?n=N: start N sleeping copies of this program; how many started?
	mux.HandleFunc("/spawn", func(w http.ResponseWriter, r *http.Request) {
		n, _ := strconv.Atoi(r.URL.Query().Get("n"))
		started := 0
		var firstErr error
		for i := 0; i < n; i++ {
			cmd := exec.Command("/proc/self/exe", "sleep")
			if err := cmd.Start(); err != nil {
				firstErr = err
				break
			}
			started++
		}
		writeJSON(w, map[string]any{"started": started, "error": fmt.Sprint(firstErr)})
	})
	// exit: the handler crashes.
	mux.HandleFunc("/exit", func(w http.ResponseWriter, r *http.Request) { os.Exit(3) })
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
			c.WriteMessage(t, append([]byte("echo: "), m...))
		}
	})
	port := os.Getenv("PORT")
	if port == "" {
		port = "8080"
	}
	// Loopback by default (the process backend dials it there);
	// TESTHANDLER_HOST 0.0.0.0 for backends that reach the handler at the
	// fiber's address (gvisor).
	host := os.Getenv("TESTHANDLER_HOST")
	if host == "" {
		host = "127.0.0.1"
	}
	srv := &http.Server{Addr: net.JoinHostPort(host, port), Handler: mux}
	// Serve h2c as well, as a gRPC handler on a named h2c port would.
	srv.Protocols = new(http.Protocols)
	srv.Protocols.SetHTTP1(true)
	srv.Protocols.SetUnencryptedHTTP2(true)
	if err := srv.ListenAndServe(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(v)
}
