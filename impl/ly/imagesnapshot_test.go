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

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
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
	"lampyr.dev/serving/impl/contract"
	"lampyr.dev/serving/impl/contract/lampyrconfig"
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

// TestEditImageSnapshots: entries are keyed by the image's normalized
// repository@digest; other images' entries and other keys of config-lampyr
// are kept; old bare-digest keys are rewritten (their image is registered
// now) or removed and reported; removal works by image or by digest.
func TestEditImageSnapshots(t *testing.T) {
	a, b, d := "sha256:"+strings.Repeat("a", 64), "sha256:"+strings.Repeat("b", 64), "sha256:"+strings.Repeat("d", 64)
	img := "localhost:5002/img@" + b
	snapA, snapD := "localhost:5002/snap@"+a, "localhost:5002/snap@"+d
	for _, tc := range []struct {
		name     string
		before   string
		register []*ImageSnapshot
		remove   []string
		after    string
		report   ImageSnapshotsReport
		wantErr  string
	}{
		{name: "into an empty map", register: []*ImageSnapshot{{Image: img, Snapshot: snapA}}, after: img + ": " + snapA + "\n"},
		{name: "merges, keeping other images",
			before:   "localhost:5002/old@" + a + ": " + snapD + "\n",
			register: []*ImageSnapshot{{Image: img, Snapshot: snapA}},
			after:    img + ": " + snapA + "\nlocalhost:5002/old@" + a + ": " + snapD + "\n"},
		{name: "re-points an image", before: img + ": " + snapD + "\n", register: []*ImageSnapshot{{Image: img, Snapshot: snapA}}, after: img + ": " + snapA + "\n"},
		{name: "the same digest under another repository is another image",
			before:   "localhost:5002/other@" + b + ": " + snapD + "\n",
			register: []*ImageSnapshot{{Image: img, Snapshot: snapA}},
			after:    img + ": " + snapA + "\nlocalhost:5002/other@" + b + ": " + snapD + "\n"},
		{name: "normalizes the key", register: []*ImageSnapshot{{Image: "ubuntu@" + b, Snapshot: snapA}}, after: "index.docker.io/library/ubuntu@" + b + ": " + snapA + "\n"},
		{name: "rewrites a bare-digest key of an image registered now",
			before:   b + ": " + snapD + "\n",
			register: []*ImageSnapshot{{Image: img, Snapshot: snapA}},
			after:    img + ": " + snapA + "\n",
			report:   ImageSnapshotsReport{Rewritten: []string{b}}},
		{name: "removes and reports other bare-digest keys",
			before:   d + ": " + snapD + "\n",
			register: []*ImageSnapshot{{Image: img, Snapshot: snapA}},
			after:    img + ": " + snapA + "\n",
			report:   ImageSnapshotsReport{Removed: []RemovedImageSnapshot{{Digest: d, Snapshot: snapD}}}},
		{name: "normalizes old keys",
			before:   "ubuntu@" + d + ": " + snapD + "\n",
			register: []*ImageSnapshot{{Image: img, Snapshot: snapA}},
			after:    "index.docker.io/library/ubuntu@" + d + ": " + snapD + "\n" + img + ": " + snapA + "\n",
			report:   ImageSnapshotsReport{Normalized: []string{"ubuntu@" + d + " as index.docker.io/library/ubuntu@" + d}}},
		{name: "keeps and reports keys that are no image",
			before:   "not an image: " + snapD + "\n",
			register: []*ImageSnapshot{{Image: img, Snapshot: snapA}},
			after:    img + ": " + snapA + "\nnot an image: " + snapD + "\n",
			report:   ImageSnapshotsReport{Unparsable: []string{"not an image"}}},
		{name: "unregisters an image", before: img + ": " + snapA + "\nlocalhost:5002/other@" + b + ": " + snapD + "\n", remove: []string{img}, after: "localhost:5002/other@" + b + ": " + snapD + "\n"},
		{name: "unregisters by a non-normalized reference", before: "index.docker.io/library/ubuntu@" + b + ": " + snapA + "\n", remove: []string{"ubuntu@" + b}, after: ""},
		{name: "unregisters every image of a digest", before: img + ": " + snapA + "\nlocalhost:5002/other@" + b + ": " + snapD + "\nlocalhost:5002/keep@" + a + ": " + snapD + "\n", remove: []string{b}, after: "localhost:5002/keep@" + a + ": " + snapD + "\n"},
		{name: "a tag is refused", register: []*ImageSnapshot{{Image: "localhost:5002/img:v1", Snapshot: snapA}}, wantErr: "want a digest-pinned image reference"},
		{name: "an unpinned snapshot is refused", register: []*ImageSnapshot{{Image: img, Snapshot: "localhost:5002/snap:v1"}}, wantErr: "want a digest-pinned artifact reference"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			kube := fakekube.NewSimpleClientset(&corev1.ConfigMap{
				ObjectMeta: metav1.ObjectMeta{Namespace: "lampyr-system", Name: contract.ConfigMapName},
				Data:       map[string]string{lampyrconfig.KeyImageSnapshots: tc.before, "backend-strategy": "endpointslice"},
			})
			c := &Cluster{Kube: kube, LampyrNamespace: "lampyr-system"}
			rep, err := EditImageSnapshots(context.Background(), c, tc.register, tc.remove)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("EditImageSnapshots = %v, want an error containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			cm, _ := kube.CoreV1().ConfigMaps("lampyr-system").Get(context.Background(), contract.ConfigMapName, metav1.GetOptions{})
			if cm.Data[lampyrconfig.KeyImageSnapshots] != tc.after || cm.Data["backend-strategy"] != "endpointslice" {
				t.Errorf("config-lampyr = %q, want image-snapshots %q and other keys kept", cm.Data, tc.after)
			}
			if d := cmp.Diff(tc.report, *rep, cmpopts.EquateEmpty()); d != "" {
				t.Errorf("report (-want +got):\n%s", d)
			}
			// What ly writes, the controller reads (unless a key is no image).
			if len(tc.report.Unparsable) == 0 {
				if _, err := lampyrconfig.ParseImageSnapshots(cm.Data[lampyrconfig.KeyImageSnapshots]); err != nil {
					t.Errorf("the controller refuses what ly wrote: %v", err)
				}
			}
		})
	}
}

func TestImageSnapshotsReportNotes(t *testing.T) {
	d := "sha256:" + strings.Repeat("d", 64)
	rep := ImageSnapshotsReport{Removed: []RemovedImageSnapshot{{Digest: d, Snapshot: "r/snap@" + d}}, Unparsable: []string{"x"}}
	notes := strings.Join(rep.Notes(), "\n")
	for _, want := range []string{"removed the bare-digest entry " + d + " -> r/snap@" + d, "ly image-snapshot REPOSITORY@" + d + " --register", `kept the key "x"`} {
		if !strings.Contains(notes, want) {
			t.Errorf("notes lack %q:\n%s", want, notes)
		}
	}
}

func TestImageUser(t *testing.T) {
	root := t.TempDir()
	os.MkdirAll(filepath.Join(root, "etc"), 0o755)
	os.WriteFile(filepath.Join(root, "etc", "passwd"), []byte("root:x:0:0::/root:/bin/sh\nnonroot:x:65532:65532::/home/nonroot:/sbin/nologin\napp:x:1000:1001::/app:/bin/sh\n"), 0o644)
	os.WriteFile(filepath.Join(root, "etc", "group"), []byte("root:x:0:\nstaff:x:50:\n"), 0o644)
	for user, want := range map[string]string{
		"": "", "root": "", "0": "", "0:0": "", "nonroot": "65532:65532", "65532": "65532:65532", "app": "1000:1001",
		"1000:staff": "1000:50", "app:50": "1000:50", "70000": "", "nobody-here": "", "app:nogroup": "",
	} {
		if got := imageUser(root, user); got != want {
			t.Errorf("imageUser(%q) = %q, want %q", user, got, want)
		}
	}
}
