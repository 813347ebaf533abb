package image

import (
	"archive/tar"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/v1/mutate"
)

func writeFakeBinary(t *testing.T, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "app")
	if err := os.WriteFile(p, []byte(content), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestFromBinaryIsReproducible(t *testing.T) {
	bin := writeFakeBinary(t, "#!binary v1")
	a, err := FromBinary(bin, "app", Options{})
	if err != nil {
		t.Fatal(err)
	}
	b, err := FromBinary(bin, "app", Options{})
	if err != nil {
		t.Fatal(err)
	}
	da, _ := a.Digest()
	db, _ := b.Digest()
	if da != db {
		t.Fatalf("same inputs gave %s and %s", da, db)
	}
	c, err := FromBinary(writeFakeBinary(t, "#!binary v2"), "app", Options{})
	if err != nil {
		t.Fatal(err)
	}
	if dc, _ := c.Digest(); dc == da {
		t.Fatal("a different binary must give a different digest")
	}
}

func TestFromBinaryConfig(t *testing.T) {
	img, err := FromBinary(writeFakeBinary(t, "x"), "controller", Options{Env: []string{"A=b"}})
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if got := cf.Config.Entrypoint; len(got) != 1 || got[0] != "/ko-app/controller" {
		t.Errorf("entrypoint = %v", got)
	}
	if cf.Config.User != "65532" {
		t.Errorf("user = %q, want the non-root 65532 Knative's runAsNonRoot needs", cf.Config.User)
	}
	if cf.OS != "linux" || cf.Architecture != "amd64" || !cf.Created.Time.Equal(epoch) {
		t.Errorf("platform/created = %s/%s %v", cf.OS, cf.Architecture, cf.Created)
	}
	found, sbin := false, false
	for _, e := range cf.Config.Env {
		found = found || e == "A=b"
		sbin = sbin || (strings.HasPrefix(e, "PATH=") && strings.Contains(e, ":/usr/sbin:"))
	}
	if !sbin {
		t.Errorf("PATH must include /usr/sbin (kube-proxy finds iptables there): %v", cf.Config.Env)
	}
	if !found {
		t.Errorf("env %v lacks A=b", cf.Config.Env)
	}
	root, err := FromBinary(writeFakeBinary(t, "x"), "x", Options{Root: true})
	if err != nil {
		t.Fatal(err)
	}
	if cf, _ := root.ConfigFile(); cf.Config.User != "0" {
		t.Errorf("root image user = %q", cf.Config.User)
	}
}

func TestLayerHasParentsAndBase(t *testing.T) {
	img, err := FromBinary(writeFakeBinary(t, "x"), "app", Options{})
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]bool{}
	rc := mutate.Extract(img)
	defer rc.Close()
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if err != nil {
			break
		}
		files[h.Name] = true
	}
	for _, want := range []string{"etc/passwd", "etc/ssl/certs/ca-certificates.crt", "tmp", "ko-app", "ko-app/app"} {
		if !files[want] {
			t.Errorf("image lacks %s (has %v)", want, files)
		}
	}
}

func TestWriteTarballRejectsBadName(t *testing.T) {
	img, _ := FromBinary(writeFakeBinary(t, "x"), "app", Options{})
	if err := WriteTarball(filepath.Join(t.TempDir(), "x.tar"), "Not A Name", img); err == nil {
		t.Fatal("want an error for an invalid image name")
	}
}
