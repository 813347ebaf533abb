package main

import (
	"context"
	"crypto/ed25519"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"lampyr.dev/serving/impl/fiberd/backend/process"
	"lampyr.dev/serving/impl/fiberd/client"
	"lampyr.dev/serving/impl/fiberd/fiberdtest"
	"lampyr.dev/serving/impl/fiberd/server"
	"lampyr.dev/serving/impl/trust/homekey"
	"lampyr.dev/serving/impl/trust/routercred"
	"lampyr.dev/serving/impl/trust/signedgrant"
)

// TestFiberdFromFiles runs fiberd the way a Home does: every input from a
// file, as the Home Secret mounts them.
func TestFiberdFromFiles(t *testing.T) {
	inst := fiberdtest.StartInstance(t, fiberdtest.Options{Revision: "files-00001", WarmFibers: 1})
	dir, err := os.MkdirTemp("/tmp", "fdm")
	if err != nil {
		t.Fatal(err)
	}
	os.Chmod(dir, 0o711) // fibers' helpers run as unprivileged host ids
	t.Cleanup(func() { os.RemoveAll(dir) })
	write := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	// The Home key, and a grant naming it, as the grant controller writes
	// them: fiberd then serves TLS with that key only.
	homeKey, _ := homekey.Generate()
	homeKeyPEM, _ := homekey.MarshalPrivateKey(homeKey)
	fp := homekey.Fingerprint(homeKey.Public().(ed25519.PublicKey))
	claims := inst.Claims
	claims.HomeKeySHA256 = fp
	signed, _ := signedgrant.Sign(inst.GrantKey, claims)
	pub, _ := signedgrant.MarshalPublicKey(inst.GrantKey.Public().(ed25519.PublicKey))
	routerPub, _ := routercred.MarshalPublicKey(inst.RouterKey.Public().(ed25519.PublicKey))
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := ln.Addr().String()
	ln.Close()
	cg := filepath.Join(process.DefaultCgroupParent, filepath.Base(dir))
	t.Cleanup(func() { os.Remove(cg) })

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, addr, write("grant", signed), write("grant-key.pub", pub), write("router-keys.pub", routerPub), write("home-key.pem", homeKeyPEM),
			fiberdtest.Build(t, fiberdtest.HelperPackage), filepath.Join(dir, "state"), cg, 1, 0, true, nil, sandboxFlags{})
	}()
	c, err := client.NewTLS(addr, inst.Token, fp)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for c.Ready(ctx) != nil {
		select {
		case err := <-done:
			t.Fatalf("fiberd exited: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("fiberd from files not ready: %v", c.Ready(ctx))
		}
		time.Sleep(50 * time.Millisecond)
	}
	f, err := c.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest(http.MethodGet, "http://app/", nil)
	resp, err := c.Do(req, f.ID)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("request: %v %v", resp, err)
	}
	resp.Body.Close()
	// The API speaks TLS only: a plain-HTTP caller gets nothing from it.
	if plain, _ := client.New(addr, inst.Token); plain.Ready(ctx) == nil {
		t.Error("fiberd with a home key answered plain HTTP")
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("fiberd: %v", err)
		}
	case <-time.After(server.HandoverQuiet + 10*time.Second):
		// It hands over first: it serves on until no fiber has been asked
		// for HandoverQuiet.
		t.Fatal("fiberd did not stop")
	}
}

func TestOwnCgroupDir(t *testing.T) {
	if _, err := os.Stat("/sys/fs/cgroup/memory/cgroup.procs"); err != nil {
		t.Skip("no cgroup v1 memory controller")
	}
	d, err := ownCgroupDir("memory")
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(d, "cgroup.procs"))
	if err != nil {
		t.Fatal(err)
	}
	// Our own PID is listed in the directory we would put fibers under.
	if !strings.Contains("\n"+string(b), "\n"+strconv.Itoa(os.Getpid())+"\n") {
		t.Fatalf("%s does not list this process (pid %d)", d, os.Getpid())
	}
}
