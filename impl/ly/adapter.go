package ly

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"

	"sigs.k8s.io/yaml"
)

// The adapter is the tracked .lampyr-adapter/ directory `ly scaffold`
// writes: editable runtime and build support whose metadata records the
// version and each file's checksum, so deploy can warn when it was modified
// or is older than this ly's (seed 002). Deploy never rewrites it; `ly
// scaffold service NAME --upgrade` does.
const (
	AdapterDir      = ".lampyr-adapter"
	AdapterMetaFile = "adapter.yaml"
	// AdapterVersion is the adapter this ly scaffolds.
	AdapterVersion = "go/v1"
)

// AdapterMeta is .lampyr-adapter/adapter.yaml.
type AdapterMeta struct {
	Version string            `json:"version"`
	Files   map[string]string `json:"files,omitempty"` // path in the adapter dir -> sha256 hex
}

// adapterFiles are the built-in adapter's files.
var adapterFiles = map[string]string{
	"README.md": "# .lampyr-adapter\n\nRuntime and build support for this service, written by `ly scaffold`.\n" +
		"You may edit it; `ly deploy` warns when it differs from the version it\n" +
		"records, and `ly scaffold service NAME --upgrade` replaces it.\n\n" +
		"The go adapter builds `main` from lampyr.yaml with CGO_ENABLED=0, -trimpath and\n" +
		"stripped symbols, so the same sources always give the same artifact digest.\n",
	"run.md": "A fiber starts /handler with PORT set to lampyr.yaml's port and the Knative\n" +
		"runtime contract variables K_SERVICE, K_CONFIGURATION and K_REVISION.\n",
}

func adapterVersion(dir string) string {
	m, err := readAdapterMeta(dir)
	if err != nil || m == nil {
		return ""
	}
	return m.Version
}

func readAdapterMeta(dir string) (*AdapterMeta, error) {
	raw, err := os.ReadFile(filepath.Join(dir, AdapterDir, AdapterMetaFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var m AdapterMeta
	if err := yaml.Unmarshal(raw, &m); err != nil {
		return nil, fmt.Errorf("%s/%s: %w", AdapterDir, AdapterMetaFile, err)
	}
	return &m, nil
}

// CheckAdapter returns best-effort warnings about the service's adapter:
// modified or missing files, or a version other than this ly's. A service
// without an adapter (a standalone application) gets none.
func CheckAdapter(dir string) []string {
	m, err := readAdapterMeta(dir)
	if err != nil {
		return []string{"adapter metadata unreadable: " + err.Error()}
	}
	if m == nil {
		return nil
	}
	var warns []string
	if m.Version != AdapterVersion {
		warns = append(warns, fmt.Sprintf("adapter %s is not this ly's %s: upgrade with `ly scaffold service NAME --upgrade`", m.Version, AdapterVersion))
	}
	names := make([]string, 0, len(m.Files))
	for n := range m.Files {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		b, err := os.ReadFile(filepath.Join(dir, AdapterDir, n))
		if err != nil {
			warns = append(warns, fmt.Sprintf("adapter file %s/%s is missing", AdapterDir, n))
			continue
		}
		if sum(b) != m.Files[n] {
			warns = append(warns, fmt.Sprintf("adapter file %s/%s was modified", AdapterDir, n))
		}
	}
	return warns
}

// Scaffold writes a new service NAME into dir (lampyr.yaml, a handler and
// the adapter); with upgrade it replaces only the adapter of an existing one.
func Scaffold(dir, name string, upgrade bool) ([]string, error) {
	var written []string
	write := func(rel, body string) error {
		path := filepath.Join(dir, rel)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return err
		}
		written = append(written, rel)
		return os.WriteFile(path, []byte(body), 0o644)
	}
	if !upgrade {
		if _, err := os.Stat(filepath.Join(dir, ProjectFile)); err == nil {
			return nil, fmt.Errorf("%s already holds a %s: use --upgrade to replace only its adapter", dir, ProjectFile)
		}
		p := &Project{Name: name}
		p.defaults()
		if err := p.Validate(); err != nil {
			return nil, err
		}
		if err := write(ProjectFile, fmt.Sprintf("name: %s\nruntime: go\nport: 8080\n# execution:\n#   mode: reuse\n#   idleTimeout: 30s\n", name)); err != nil {
			return nil, err
		}
		if err := write("main.go", scaffoldMain); err != nil {
			return nil, err
		}
		if err := write("go.mod", "module "+name+"\n\ngo 1.24\n"); err != nil {
			return nil, err
		}
	} else if _, err := os.Stat(filepath.Join(dir, ProjectFile)); err != nil {
		return nil, fmt.Errorf("--upgrade: %s has no %s", dir, ProjectFile)
	}
	meta := AdapterMeta{Version: AdapterVersion, Files: map[string]string{}}
	for n, body := range adapterFiles {
		if err := write(filepath.Join(AdapterDir, n), body); err != nil {
			return nil, err
		}
		meta.Files[n] = sum([]byte(body))
	}
	raw, err := yaml.Marshal(meta)
	if err != nil {
		return nil, err
	}
	if err := write(filepath.Join(AdapterDir, AdapterMetaFile), string(raw)); err != nil {
		return nil, err
	}
	sort.Strings(written)
	return written, nil
}

const scaffoldMain = `package main

import (
	"fmt"
	"net/http"
	"os"
)

func main() {
	port := os.Getenv("PORT")
	if port == "" {
		port = "8080"
	}
	http.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "Hello from %s!\n", os.Getenv("K_SERVICE"))
	})
	if err := http.ListenAndServe(":"+port, nil); err != nil {
		panic(err)
	}
}
`

func sum(b []byte) string { s := sha256.Sum256(b); return hex.EncodeToString(s[:]) }

func jsonUnmarshal(b []byte, v any) error { return json.Unmarshal(b, v) }
