package ly

import (
	"archive/tar"
	"bytes"
	"context"
	"io"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	fakekube "k8s.io/client-go/kubernetes/fake"

	"lampyr.dev/serving/impl/artifact"
)

func tarLayer(t *testing.T, entries ...tar.Header) v1.Layer {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, h := range entries {
		body := h.Linkname
		if h.Typeflag == tar.TypeReg {
			h.Size = int64(len(h.Uname))
			body, h.Uname = h.Uname, ""
		}
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			io.WriteString(tw, body)
		}
	}
	tw.Close()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(buf.Bytes())), nil })
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// TestSnapshotImage turns a two-layer image (a later layer overwrites a
// file; a device node; a relative entrypoint found on the image's PATH)
// into a snapshot artifact and reads it back as fiberd does.
func TestSnapshotImage(t *testing.T) {
	srv := httptest.NewServer(registry.New())
	defer srv.Close()
	host := strings.TrimPrefix(srv.URL, "http://")
	ctx := context.Background()

	// Regular file bodies travel in Uname (see tarLayer).
	base := tarLayer(t,
		tar.Header{Name: "etc/", Typeflag: tar.TypeDir, Mode: 0o755},
		tar.Header{Name: "etc/motd", Typeflag: tar.TypeReg, Mode: 0o644, Uname: "old"},
		tar.Header{Name: "dev/null", Typeflag: tar.TypeChar, Mode: 0o666},
	)
	app := tarLayer(t,
		tar.Header{Name: "ko-app/", Typeflag: tar.TypeDir, Mode: 0o755},
		tar.Header{Name: "ko-app/hello", Typeflag: tar.TypeReg, Mode: 0o755, Uname: "#!binary"},
		tar.Header{Name: "ko-app/alias", Typeflag: tar.TypeSymlink, Linkname: "hello"},
		tar.Header{Name: "etc/motd", Typeflag: tar.TypeReg, Mode: 0o644, Uname: "new"},
	)
	img, err := mutate.AppendLayers(empty.Image, base, app)
	if err != nil {
		t.Fatal(err)
	}
	img, err = mutate.Config(img, v1.Config{Entrypoint: []string{"hello"}, Cmd: []string{"-v"}, Env: []string{"PATH=/usr/bin:/ko-app"}})
	if err != nil {
		t.Fatal(err)
	}
	tag, _ := name.NewTag(host + "/test/hello:v1")
	if err := remote.Write(tag, img); err != nil {
		t.Fatal(err)
	}
	d, _ := img.Digest()
	image := host + "/test/hello@" + d.String()

	if _, err := SnapshotImage(ctx, host+"/test/hello:v1", ImageSnapshotOptions{}); err == nil || !strings.Contains(err.Error(), "pin it by digest") {
		t.Errorf("a tag: %v, want a digest-pinning error", err)
	}

	got, err := SnapshotImage(ctx, image, ImageSnapshotOptions{Protocol: "h2c", Port: 9000})
	if err != nil {
		t.Fatal(err)
	}
	if want := host + "/lampyr/snapshots/hello@sha256:"; !strings.HasPrefix(got.Snapshot, want) {
		t.Errorf("snapshot %s, want it under %s", got.Snapshot, want)
	}
	if got.Config.Entrypoint[0] != "/ko-app/hello" || got.Config.Entrypoint[1] != "-v" || got.Config.Port != 9000 || got.Config.Protocol != "h2c" {
		t.Errorf("config %+v", got.Config)
	}
	if len(got.Dropped) != 1 || got.Dropped[0] != "/dev/null" {
		t.Errorf("dropped %v, want [/dev/null]", got.Dropped)
	}

	snap, err := artifact.Fetch(ctx, got.Snapshot)
	if err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(t.TempDir(), "root")
	if err := snap.Unpack(root); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(root, "etc", "motd")); string(b) != "new" {
		t.Errorf("etc/motd = %q, want the upper layer's", b)
	}
	if l, _ := os.Readlink(filepath.Join(root, "ko-app", "alias")); l != "hello" {
		t.Errorf("symlink = %q", l)
	}

	// Same image, same snapshot: the build is reproducible.
	again, err := SnapshotImage(ctx, image, ImageSnapshotOptions{Protocol: "h2c", Port: 9000})
	if err != nil || again.Snapshot != got.Snapshot {
		t.Errorf("second snapshot %v %v, want %s", again, err, got.Snapshot)
	}
}

func TestRegisterImageSnapshotsMerges(t *testing.T) {
	a, b := "sha256:"+strings.Repeat("a", 64), "sha256:"+strings.Repeat("b", 64)
	kube := fakekube.NewSimpleClientset(&corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: "lampyr-system", Name: ConfigLampyr},
		Data:       map[string]string{KeyImageSnapshots: a + ": r/old@" + b + "\n", "backend-strategy": "endpointslice"},
	})
	c := &Cluster{Kube: kube, LampyrNamespace: "lampyr-system"}
	err := RegisterImageSnapshots(context.Background(), c, []*ImageSnapshot{{Image: "r/img@" + b, Snapshot: "r/snap@" + a}})
	if err != nil {
		t.Fatal(err)
	}
	cm, _ := kube.CoreV1().ConfigMaps("lampyr-system").Get(context.Background(), ConfigLampyr, metav1.GetOptions{})
	want := a + ": r/old@" + b + "\n" + b + ": r/snap@" + a + "\n"
	if cm.Data[KeyImageSnapshots] != want || cm.Data["backend-strategy"] != "endpointslice" {
		t.Errorf("config-lampyr = %v, want image-snapshots %q and other keys kept", cm.Data, want)
	}
	if err := UnregisterImageSnapshots(context.Background(), c, []string{a}); err != nil {
		t.Fatal(err)
	}
	cm, _ = kube.CoreV1().ConfigMaps("lampyr-system").Get(context.Background(), ConfigLampyr, metav1.GetOptions{})
	if want := b + ": r/snap@" + a + "\n"; cm.Data[KeyImageSnapshots] != want {
		t.Errorf("after unregistering %s: %q, want %q", a, cm.Data[KeyImageSnapshots], want)
	}
}

// TestUntarRootRefusesWritesThroughSymlinks: "etc -> <outside>" followed by
// "etc/passwd" must not write outside the stage directory.
func TestUntarRootRefusesWritesThroughSymlinks(t *testing.T) {
	outside := t.TempDir()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	tw.WriteHeader(&tar.Header{Name: "etc", Typeflag: tar.TypeSymlink, Linkname: outside})
	tw.WriteHeader(&tar.Header{Name: "etc/passwd", Typeflag: tar.TypeReg, Mode: 0o644, Size: 4})
	io.WriteString(tw, "evil")
	tw.Close()
	_, err := untarRoot(&buf, filepath.Join(t.TempDir(), "root"))
	if err == nil || !strings.Contains(err.Error(), "below the symlink /etc") {
		t.Fatalf("untarRoot = %v, want a refusal naming the symlink", err)
	}
	if _, err := os.Stat(filepath.Join(outside, "passwd")); err == nil {
		t.Fatal("a file was written through the symlink, outside the root")
	}
}
