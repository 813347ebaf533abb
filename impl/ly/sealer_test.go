package ly

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

func TestSealerKeyPath(t *testing.T) {
	home := t.TempDir()
	for _, tc := range []struct {
		name, flag, env, xdg string
		want                 string
	}{
		{name: "default", want: filepath.Join(home, ".config", "lampyr", "sealer.pem")},
		{name: "XDG_CONFIG_HOME", xdg: "/xdg", want: "/xdg/lampyr/sealer.pem"},
		{name: "relative XDG_CONFIG_HOME is ignored", xdg: "rel", want: filepath.Join(home, ".config", "lampyr", "sealer.pem")},
		{name: "env", env: "/env/key.pem", xdg: "/xdg", want: "/env/key.pem"},
		{name: "flag wins", flag: "/flag/key.pem", env: "/env/key.pem", want: "/flag/key.pem"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("HOME", home)
			t.Setenv("XDG_CONFIG_HOME", tc.xdg)
			t.Setenv(SealerKeyEnv, tc.env)
			got, err := SealerKeyPath(tc.flag)
			if err != nil || got != tc.want {
				t.Errorf("SealerKeyPath(%q) = %q, %v; want %q", tc.flag, got, err, tc.want)
			}
		})
	}
}

func TestLoadSealer(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cfg", "lampyr", "sealer.pem")
	if _, err := LoadSealer(path, false); !errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), "ly sealer show") {
		t.Fatalf("missing key without create: %v, want ErrNotExist saying how to create it", err)
	}
	s, err := LoadSealer(path, true)
	if err != nil {
		t.Fatal(err)
	}
	if !s.Created || s.Warning != "" {
		t.Errorf("first load: created %v, warning %q", s.Created, s.Warning)
	}
	for p, want := range map[string]os.FileMode{path: 0o600, filepath.Dir(path): 0o700} {
		if fi, err := os.Stat(p); err != nil || fi.Mode().Perm() != want {
			t.Errorf("%s: mode %v (%v), want %v", p, fi.Mode().Perm(), err, want)
		}
	}
	msg := s.CreatedMessage("team-a")
	for _, want := range []string{"created sealer identity " + path, s.KeyID()[:12], "ly cluster authorize-sealer ", "--public-key " + s.PublicKey(), "--namespaces team-a"} {
		if !strings.Contains(msg, want) {
			t.Errorf("created message lacks %q: %s", want, msg)
		}
	}
	if strings.Contains(msg, "\n") {
		t.Errorf("created message is more than one line: %q", msg)
	}
	again, err := LoadSealer(path, true)
	if err != nil || again.Created || again.KeyID() != s.KeyID() {
		t.Fatalf("second load: %+v %v, want the same key, not created", again, err)
	}

	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	if open, err := LoadSealer(path, false); err != nil || !strings.Contains(open.Warning, "chmod 600 "+path) {
		t.Errorf("world-readable key: %+v %v, want a warning", open, err)
	}

	bad := filepath.Join(t.TempDir(), "bad.pem")
	os.WriteFile(bad, []byte("not a key"), 0o600)
	if _, err := LoadSealer(bad, true); err == nil || !strings.Contains(err.Error(), bad) || !strings.Contains(err.Error(), "--sealer-key") {
		t.Errorf("garbage key: %v, want an error naming the file and --sealer-key", err)
	}
}

// TestLoadSealerConcurrentCreation: several ly processes starting at once
// end up with one identity.
func TestLoadSealerConcurrentCreation(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sealer.pem")
	ids := make([]string, 8)
	var wg sync.WaitGroup
	for i := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, err := LoadSealer(path, true)
			if err != nil {
				t.Error(err)
				return
			}
			ids[i] = s.KeyID()
		}()
	}
	wg.Wait()
	for _, id := range ids {
		if id != ids[0] {
			t.Fatalf("concurrent creation made several identities: %v", ids)
		}
	}
	ents, _ := os.ReadDir(filepath.Dir(path))
	if len(ents) != 1 {
		t.Errorf("temporary files left behind: %v", ents)
	}
}

func TestSealerNames(t *testing.T) {
	for in, want := range map[string]string{
		"alice-laptop":      "alice-laptop",
		`CORP\Bob-WS.local`: "corp-bob-ws.local",
		"---":               "ly",
		"é":                 "ly",
	} {
		if got := sanitizeKey(in); got != want {
			t.Errorf("sanitizeKey(%q) = %q, want %q", in, got, want)
		}
	}
	s, err := LoadSealer(filepath.Join(t.TempDir(), "k.pem"), true)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := s.AuthorizeCommand("ci", "*"), "ly cluster authorize-sealer ci --public-key "+s.PublicKey()+" --namespaces '*'"; got != want {
		t.Errorf("AuthorizeCommand = %q, want %q", got, want)
	}
	if got := s.AuthorizeCommand("ci", "a", "b"); !strings.HasSuffix(got, "--namespaces a,b") {
		t.Errorf("AuthorizeCommand = %q", got)
	}
}
