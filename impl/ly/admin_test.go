package ly

import (
	"context"
	"crypto/ed25519"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	fakekube "k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"lampyr.dev/serving/impl/artifact"
	"lampyr.dev/serving/impl/contract"
	"lampyr.dev/serving/impl/trust/seal"
)

const testLampyrNS = "lampyr-system"

func newSealerKey(t *testing.T) *seal.SealerKey {
	t.Helper()
	k, err := seal.GenerateSealerKey()
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func sealerEntry(t *testing.T, k ed25519.PublicKey, ns ...string) string {
	t.Helper()
	v, err := seal.FormatSealer(seal.TrustedSealer{Key: k, Namespaces: ns})
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func sealersCM(data map[string]string) *corev1.ConfigMap {
	return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: testLampyrNS, Name: contract.SealersConfigMap}, Data: data}
}

// forbid makes every verb on resource fail as RBAC would.
func forbid(kube *fakekube.Clientset, verb, resource string) {
	kube.PrependReactor(verb, resource, func(a k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(corev1.Resource(resource), "", nil)
	})
}

func TestParseNamespaces(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    []string
		wantErr string
	}{
		{in: "team-b,team-a", want: []string{"team-a", "team-b"}},
		{in: " a , a,b ", want: []string{"a", "b"}},
		{in: "*", want: []string{"*"}},
		{in: "", wantErr: "--namespaces is required"},
		{in: " , ", wantErr: "--namespaces is required"},
		{in: "a,*", wantErr: "give it alone"},
		{in: "Team_A", wantErr: `--namespaces: "Team_A" is not a namespace name`},
	} {
		got, err := ParseNamespaces(tc.in)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("ParseNamespaces(%q) = %v, %v; want an error containing %q", tc.in, got, err, tc.wantErr)
			}
			continue
		}
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("ParseNamespaces(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
	}
}

func TestAuthorizeSealer(t *testing.T) {
	alice, bob := newSealerKey(t).Public(), newSealerKey(t).Public()
	for _, tc := range []struct {
		name     string
		existing *corev1.ConfigMap
		forbid   string // verb denied on configmaps
		auth     SealerAuthorization
		// want is the ConfigMap's identities afterwards: name -> namespaces.
		want         map[string][]string
		wantAction   string
		wantPrevious string
		wantWarning  string
		wantErr      []string
	}{
		{name: "creates the ConfigMap", auth: SealerAuthorization{Name: "alice", Key: alice, Namespaces: []string{"team-a"}},
			want: map[string][]string{"alice": {"team-a"}}, wantAction: "created"},
		{name: "adds an identity, keeping the others",
			existing: sealersCM(map[string]string{"bob": sealerEntry(t, bob, "*")}),
			auth:     SealerAuthorization{Name: "alice", Key: alice, Namespaces: []string{"team-a", "team-b"}},
			want:     map[string][]string{"alice": {"team-a", "team-b"}, "bob": {"*"}}, wantAction: "created"},
		{name: "replaces an identity's namespaces",
			existing: sealersCM(map[string]string{"alice": sealerEntry(t, alice, "team-a")}),
			auth:     SealerAuthorization{Name: "alice", Key: alice, Namespaces: []string{"team-b"}},
			want:     map[string][]string{"alice": {"team-b"}}, wantAction: "updated", wantPrevious: "namespaces team-a"},
		{name: "unchanged",
			existing: sealersCM(map[string]string{"alice": sealerEntry(t, alice, "team-a")}),
			auth:     SealerAuthorization{Name: "alice", Key: alice, Namespaces: []string{"team-a"}},
			want:     map[string][]string{"alice": {"team-a"}}, wantAction: "unchanged", wantPrevious: "namespaces team-a"},
		{name: "one key is one identity",
			existing: sealersCM(map[string]string{"alice": sealerEntry(t, alice, "team-a")}),
			auth:     SealerAuthorization{Name: "alice2", Key: alice, Namespaces: []string{"team-b"}},
			want:     map[string][]string{"alice": {"team-a"}},
			wantErr:  []string{`already authorized as "alice" (namespaces team-a)`, "--revoke"}},
		{name: "warns about entries the grant controller ignores",
			existing: sealersCM(map[string]string{"broken": "publicKey: nope\nnamespaces: [a]\n"}),
			auth:     SealerAuthorization{Name: "alice", Key: alice, Namespaces: []string{"*"}},
			want:     map[string][]string{"alice": {"*"}}, wantAction: "created", wantWarning: "broken: publicKey"},
		{name: "revokes",
			existing: sealersCM(map[string]string{"alice": sealerEntry(t, alice, "team-a"), "bob": sealerEntry(t, bob, "*")}),
			auth:     SealerAuthorization{Name: "alice", Revoke: true},
			want:     map[string][]string{"bob": {"*"}}, wantAction: "revoked", wantPrevious: "namespaces team-a"},
		{name: "revoking an unknown identity names the known ones",
			existing: sealersCM(map[string]string{"bob": sealerEntry(t, bob, "*")}),
			auth:     SealerAuthorization{Name: "alice", Revoke: true},
			want:     map[string][]string{"bob": {"*"}},
			wantErr:  []string{`has no sealer "alice" (it has: bob)`}},
		{name: "revoking without the ConfigMap", auth: SealerAuthorization{Name: "alice", Revoke: true},
			wantErr: []string{"lampyr-system/lampyr-template-sealers does not exist"}},
		{name: "a name that is no ConfigMap key", auth: SealerAuthorization{Name: "alice smith", Key: alice, Namespaces: []string{"a"}},
			wantErr: []string{`sealer NAME "alice smith"`}},
		{name: "RBAC denial names the resource and who may do it", forbid: "get",
			auth:    SealerAuthorization{Name: "alice", Key: alice, Namespaces: []string{"a"}},
			wantErr: []string{"reading ConfigMap lampyr-system/lampyr-template-sealers: permission denied", "an administrator must run `ly cluster authorize-sealer`"}},
		{name: "RBAC denial on update",
			existing: sealersCM(map[string]string{"bob": sealerEntry(t, bob, "*")}), forbid: "update",
			auth:    SealerAuthorization{Name: "alice", Key: alice, Namespaces: []string{"a"}},
			want:    map[string][]string{"bob": {"*"}},
			wantErr: []string{"updating ConfigMap lampyr-system/lampyr-template-sealers: permission denied", "an administrator must run"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var objs []runtime.Object
			if tc.existing != nil {
				objs = append(objs, tc.existing)
			}
			kube := fakekube.NewSimpleClientset(objs...)
			if tc.forbid != "" {
				forbid(kube, tc.forbid, "configmaps")
			}
			c := &Cluster{Kube: kube, LampyrNamespace: testLampyrNS}
			ch, err := AuthorizeSealer(context.Background(), c, tc.auth)
			if len(tc.wantErr) > 0 {
				if err == nil {
					t.Fatalf("AuthorizeSealer = %+v, want an error", ch)
				}
				for _, w := range tc.wantErr {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("error %q lacks %q", err, w)
					}
				}
			} else {
				if err != nil {
					t.Fatal(err)
				}
				if ch.Action != tc.wantAction || !strings.Contains(ch.Previous, tc.wantPrevious) || (tc.wantPrevious == "") != (ch.Previous == "") {
					t.Errorf("change = %+v, want action %s, previous %q", ch, tc.wantAction, tc.wantPrevious)
				}
				if got := strings.Join(ch.Warnings, "; "); !strings.Contains(got, tc.wantWarning) || (tc.wantWarning == "") != (got == "") {
					t.Errorf("warnings %q, want %q", got, tc.wantWarning)
				}
			}
			if tc.forbid == "get" {
				return
			}
			cm, err := kube.CoreV1().ConfigMaps(testLampyrNS).Get(context.Background(), contract.SealersConfigMap, metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				if tc.want != nil {
					t.Fatalf("ConfigMap missing, want %v", tc.want)
				}
				return
			}
			got := map[string][]string{}
			sealers, _ := seal.ParseSealers(cm.Data)
			for _, s := range sealers {
				got[s.Name] = s.Namespaces
			}
			if d := cmp.Diff(tc.want, got); d != "" {
				t.Errorf("identities (-want +got):\n%s", d)
			}
		})
	}
}

func TestDescribeSealers(t *testing.T) {
	mine := &Sealer{Key: newSealerKey(t)}
	other := newSealerKey(t)
	for _, tc := range []struct {
		name       string
		cm         *corev1.ConfigMap
		forbidden  bool
		mine       *Sealer
		readable   bool
		wantNote   string
		wantMine   string
		authorized map[string][2]bool // namespace -> authorized, known
	}{
		{name: "listed", mine: mine, readable: true, wantMine: "me",
			cm:         sealersCM(map[string]string{"me": sealerEntry(t, mine.Key.Public(), "team-a"), "ci": sealerEntry(t, other.Public(), "*")}),
			authorized: map[string][2]bool{"team-a": {true, true}, "team-b": {false, true}}},
		{name: "not listed", mine: mine, readable: true,
			cm:         sealersCM(map[string]string{"ci": sealerEntry(t, other.Public(), "*")}),
			authorized: map[string][2]bool{"team-a": {false, true}}},
		{name: "no ConfigMap", mine: mine, readable: true, wantNote: "no ly identity is authorized yet",
			authorized: map[string][2]bool{"team-a": {false, true}}},
		{name: "a tenant cannot read it", mine: mine, forbidden: true, wantNote: "readable only by administrators",
			authorized: map[string][2]bool{"team-a": {false, false}}},
		{name: "no identity yet", readable: true,
			cm:         sealersCM(map[string]string{"ci": sealerEntry(t, other.Public(), "*")}),
			authorized: map[string][2]bool{"team-a": {false, false}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var objs []runtime.Object
			if tc.cm != nil {
				objs = append(objs, tc.cm)
			}
			kube := fakekube.NewSimpleClientset(objs...)
			if tc.forbidden {
				forbid(kube, "get", "configmaps")
			}
			rep, err := DescribeSealers(context.Background(), &Cluster{Kube: kube, LampyrNamespace: testLampyrNS}, tc.mine)
			if err != nil {
				t.Fatal(err)
			}
			if rep.Readable != tc.readable || !strings.Contains(rep.Note, tc.wantNote) {
				t.Errorf("report %+v, want readable %v, note %q", rep, tc.readable, tc.wantNote)
			}
			var gotMine string
			for _, s := range rep.Sealers {
				if s.Mine {
					gotMine = s.Name
				}
			}
			if gotMine != tc.wantMine {
				t.Errorf("mine = %q, want %q", gotMine, tc.wantMine)
			}
			for ns, want := range tc.authorized {
				if a, k := rep.Authorized(ns); a != want[0] || k != want[1] {
					t.Errorf("Authorized(%s) = %v, %v; want %v", ns, a, k, want)
				}
			}
		})
	}
}

func fleetSecret(t *testing.T, k *seal.PrivateKey) *corev1.Secret {
	t.Helper()
	pem, err := k.MarshalPEM()
	if err != nil {
		t.Fatal(err)
	}
	return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: testLampyrNS, Name: contract.FleetKeyName}, Data: map[string][]byte{
		contract.FleetPrivateKeyKey: pem, contract.FleetPublicKeyKey: k.Public().MarshalPEM(), contract.FleetKeyIDKey: []byte(k.Public().KeyID()),
	}}
}

// TestRotateFleetKey rotates twice: each time the new key is current in
// the Secret and the public ConfigMap, and templates sealed to every
// earlier key still open with the Secret's keys (running Revisions keep
// running).
func TestRotateFleetKey(t *testing.T) {
	ctx := context.Background()
	first, err := seal.GenerateFleetKey()
	if err != nil {
		t.Fatal(err)
	}
	kube := fakekube.NewSimpleClientset(fleetSecret(t, first), &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: testLampyrNS, Name: contract.FleetKeyName},
		Data:       map[string]string{contract.FleetPublicKeyKey: string(first.Public().MarshalPEM()), contract.FleetKeyIDKey: first.Public().KeyID()},
	})
	c := &Cluster{Kube: kube, LampyrNamespace: testLampyrNS}
	sealer := newSealerKey(t)
	trust := seal.NewTrust(seal.TrustedSealer{Name: "me", Key: sealer.Public(), Namespaces: []string{"*"}})
	sealTo := func(pub *seal.PublicKey, rev string) []byte {
		t.Helper()
		b, err := seal.Seal(pub, sealer, seal.NewTemplate("team-a", rev, "sha256:"+strings.Repeat("a", 64), seal.ExecutionPolicy{Mode: "fresh"}, artifact.Config{Port: 8080}))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	templates := [][]byte{sealTo(first.Public(), "hello-00001")}
	oldID := first.Public().KeyID()
	for round := 1; round <= 2; round++ {
		rot, err := RotateFleetKey(ctx, c)
		if err != nil {
			t.Fatal(err)
		}
		if rot.OldKeyID != oldID || rot.NewKeyID == oldID || rot.RetiredAs != "retired-"+oldID[:16]+".pem" || len(rot.Retired) != round {
			t.Fatalf("round %d: rotation %+v (old %s)", round, rot, oldID)
		}
		sec, _ := kube.CoreV1().Secrets(testLampyrNS).Get(ctx, contract.FleetKeyName, metav1.GetOptions{})
		cur, err := seal.ParsePrivateKeyPEM(sec.Data[contract.FleetPrivateKeyKey])
		if err != nil || cur.Public().KeyID() != rot.NewKeyID || string(sec.Data[contract.FleetKeyIDKey]) != rot.NewKeyID || string(sec.Data[contract.FleetPublicKeyKey]) != string(cur.Public().MarshalPEM()) {
			t.Fatalf("round %d: Secret's current key %v %v, want %s", round, cur, err, rot.NewKeyID)
		}
		cm, _ := kube.CoreV1().ConfigMaps(testLampyrNS).Get(ctx, contract.FleetKeyName, metav1.GetOptions{})
		if cm.Data[contract.FleetKeyIDKey] != rot.NewKeyID || cm.Data[contract.FleetPublicKeyKey] != string(cur.Public().MarshalPEM()) {
			t.Fatalf("round %d: public ConfigMap %v, want key %s", round, cm.Data, rot.NewKeyID)
		}
		// The Secret's keys as the grant controller reads them: current,
		// then retired ones.
		keys := []*seal.PrivateKey{cur}
		for k, v := range sec.Data {
			if strings.HasPrefix(k, contract.RetiredFleetKeyPrefix) {
				r, err := seal.ParsePrivateKeyPEM(v)
				if err != nil {
					t.Fatalf("%s: %v", k, err)
				}
				keys = append(keys, r)
			}
		}
		templates = append(templates, sealTo(cur.Public(), "hello-0000"+string(rune('1'+round))))
		for i, tpl := range templates {
			if _, err := seal.Open(keys, trust, tpl); err != nil {
				t.Errorf("round %d: template %d no longer opens: %v", round, i, err)
			}
		}
		oldID = rot.NewKeyID
	}
}

func TestRotateFleetKeyRefuses(t *testing.T) {
	k, _ := seal.GenerateFleetKey()
	broken := fleetSecret(t, k)
	broken.Data[contract.FleetPrivateKeyKey] = []byte("garbage")
	for _, tc := range []struct {
		name    string
		objs    []runtime.Object
		forbid  [2]string
		wantErr []string
	}{
		{name: "no Secret", wantErr: []string{"Secret lampyr-system/lampyr-fleet-key does not exist", "grant controller creates", "nothing was changed"}},
		{name: "a key that does not parse", objs: []runtime.Object{broken}, wantErr: []string{"key private.pem", "nothing was changed"}},
		{name: "RBAC denial", forbid: [2]string{"get", "secrets"}, wantErr: []string{"reading Secret lampyr-system/lampyr-fleet-key: permission denied", "an administrator must run `ly cluster rotate-fleet-key`"}},
		{name: "RBAC denial on update", objs: []runtime.Object{fleetSecret(t, k)}, forbid: [2]string{"update", "secrets"}, wantErr: []string{"updating Secret lampyr-system/lampyr-fleet-key: permission denied"}},
		{name: "public ConfigMap not writable", objs: []runtime.Object{fleetSecret(t, k)}, forbid: [2]string{"create", "configmaps"},
			wantErr: []string{"the Secret now holds fleet key", "creating ConfigMap lampyr-system/lampyr-fleet-key: permission denied", "rollout restart deployment/lampyr-grant-controller"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			kube := fakekube.NewSimpleClientset(tc.objs...)
			if tc.forbid[0] != "" {
				forbid(kube, tc.forbid[0], tc.forbid[1])
			}
			_, err := RotateFleetKey(context.Background(), &Cluster{Kube: kube, LampyrNamespace: testLampyrNS})
			if err == nil {
				t.Fatal("RotateFleetKey succeeded, want an error")
			}
			for _, w := range tc.wantErr {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
			if tc.name == "no Secret" {
				if _, err := kube.CoreV1().Secrets(testLampyrNS).Get(context.Background(), contract.FleetKeyName, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
					t.Errorf("a Secret was created: %v", err)
				}
			}
		})
	}
}
