package main

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"sigs.k8s.io/yaml"

	"lampyr.dev/serving/impl/trust/routercred"
)

// The manifests are what an installer applies; these checks keep them in
// step with the binary (flags), the contracts (ports 80/81, h2c, admin) and
// the least privilege the router needs.

func loadDocs(t *testing.T) map[string][]byte {
	t.Helper()
	files, err := filepath.Glob("../../config/router/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests: %v", err)
	}
	docs := map[string][]byte{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range strings.Split(string(b), "\n---\n") {
			var meta struct {
				Kind     string `json:"kind"`
				Metadata struct {
					Name string `json:"name"`
				} `json:"metadata"`
			}
			if err := yaml.Unmarshal([]byte(d), &meta); err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			docs[meta.Kind+"/"+meta.Metadata.Name] = []byte(d)
		}
	}
	return docs
}

func decodeStrict(t *testing.T, b []byte, into any) {
	t.Helper()
	if err := yaml.UnmarshalStrict(b, into); err != nil {
		t.Fatalf("%T: %v", into, err)
	}
}

func TestDeploymentMatchesBinaryAndContracts(t *testing.T) {
	docs := loadDocs(t)
	var d appsv1.Deployment
	decodeStrict(t, docs["Deployment/fiber-router"], &d)
	if d.Namespace != "lampyr-system" || d.Spec.Replicas == nil || *d.Spec.Replicas != 2 {
		t.Fatalf("deployment %s/%s replicas %v", d.Namespace, d.Name, d.Spec.Replicas)
	}
	c := d.Spec.Template.Spec.Containers[0]
	if c.Image != "ko://lampyr.dev/serving/impl/cmd/fiber-router" {
		t.Fatalf("image %q", c.Image)
	}
	o, err := parseFlags(c.Args)
	if err != nil {
		t.Fatalf("the Deployment's args are not valid flags: %v", err)
	}
	if o.httpPort != 80 || o.h2cPort != 81 || o.adminPort != 9091 {
		t.Fatalf("ports %d/%d/%d, contracts §3 want 80/81 and admin 9091", o.httpPort, o.h2cPort, o.adminPort)
	}
	ports := map[string]int32{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
	}
	if ports["http"] != 80 || ports["http2"] != 81 || ports["admin"] != 9091 {
		t.Fatalf("container ports %v", ports)
	}
	if c.ReadinessProbe == nil || c.ReadinessProbe.HTTPGet == nil || c.ReadinessProbe.HTTPGet.Path != "/readyz" || c.ReadinessProbe.HTTPGet.Port.String() != "admin" {
		t.Fatalf("readiness probe %+v, want /readyz on the admin port", c.ReadinessProbe)
	}
	if o.metadataNamespace != "lampyr-system" || o.homesNamespace != "lampyr-homes" {
		t.Fatalf("metadata namespace %q, homes namespace %q: want lampyr-system (the Role's) and lampyr-homes", o.metadataNamespace, o.homesNamespace)
	}
	var keyVolume string
	for _, m := range c.VolumeMounts {
		if strings.HasPrefix(o.routerKeyFile, m.MountPath+"/") {
			keyVolume = m.Name
		}
	}
	var keySecret string
	for _, v := range d.Spec.Template.Spec.Volumes {
		if v.Name == keyVolume && v.Secret != nil {
			keySecret = v.Secret.SecretName
		}
	}
	if keySecret != "fiber-router-key" || filepath.Base(o.routerKeyFile) != "private.pem" {
		t.Fatalf("--router-key-file %s is in volume %q of Secret %q, want key private.pem of Secret fiber-router-key", o.routerKeyFile, keyVolume, keySecret)
	}
	grace := d.Spec.Template.Spec.TerminationGracePeriodSeconds
	if grace == nil || float64(*grace) <= (o.drainDelay+o.drainTimeout).Seconds() {
		t.Fatalf("terminationGracePeriodSeconds %v does not cover drain-delay %s + drain-timeout %s", grace, o.drainDelay, o.drainTimeout)
	}
	if d.Spec.Template.Spec.ServiceAccountName != "fiber-router" {
		t.Fatal("service account")
	}
}

func TestServicePorts(t *testing.T) {
	var s corev1.Service
	decodeStrict(t, loadDocs(t)["Service/fiber-router"], &s)
	if s.Namespace != "lampyr-system" {
		t.Fatal(s.Namespace)
	}
	byName := map[string]corev1.ServicePort{}
	for _, p := range s.Spec.Ports {
		byName[p.Name] = p
	}
	if p := byName["http"]; p.Port != 80 || p.TargetPort.IntValue() != 80 {
		t.Fatalf("http %+v", p)
	}
	if p := byName["http2"]; p.Port != 81 || p.TargetPort.IntValue() != 81 || p.AppProtocol == nil || *p.AppProtocol != "kubernetes.io/h2c" {
		t.Fatalf("http2 %+v", p)
	}
	if p := byName["admin"]; p.Port != 9091 {
		t.Fatalf("admin %+v", p)
	}
}

// The router reads ConfigMaps of lampyr-system only: a Role there, nothing
// cluster-wide (docs/security.md §4, §6).
func TestRBACIsReadOnlyConfigMapsInLampyrSystem(t *testing.T) {
	docs := loadDocs(t)
	for k := range docs {
		if strings.HasPrefix(k, "ClusterRole") {
			t.Fatalf("%s: fiber-router must hold no cluster-wide permission", k)
		}
	}
	var r rbacv1.Role
	decodeStrict(t, docs["Role/lampyr-fiber-router"], &r)
	if r.Namespace != "lampyr-system" || len(r.Rules) != 1 || !slices.Equal(r.Rules[0].Resources, []string{"configmaps"}) || !slices.Equal(r.Rules[0].APIGroups, []string{""}) {
		t.Fatalf("role %s rules %+v", r.Namespace, r.Rules)
	}
	for _, v := range r.Rules[0].Verbs {
		if v != "get" && v != "list" && v != "watch" {
			t.Fatalf("verb %q: the router only reads", v)
		}
	}
	var b rbacv1.RoleBinding
	decodeStrict(t, docs["RoleBinding/lampyr-fiber-router"], &b)
	if b.Namespace != "lampyr-system" || b.RoleRef.Kind != "Role" || b.RoleRef.Name != r.Name ||
		len(b.Subjects) != 1 || b.Subjects[0].Name != "fiber-router" || b.Subjects[0].Namespace != "lampyr-system" {
		t.Fatalf("binding %+v", b)
	}
	var sa corev1.ServiceAccount
	decodeStrict(t, docs["ServiceAccount/fiber-router"], &sa)
}

func TestFlagDefaultsAndRefusals(t *testing.T) {
	t.Setenv("SYSTEM_NAMESPACE", "")
	o, err := parseFlags(nil)
	if err != nil {
		t.Fatal(err)
	}
	if o.metadataNamespace != "lampyr-system" || o.homesNamespace != "lampyr-homes" || o.maxRevisions != 10000 ||
		o.maxRevisionsPerNamespace != 1000 || o.allowUnauthenticatedHomes || o.routerKeyFile != "/var/run/lampyr/fiber-router-key/private.pem" {
		t.Fatalf("defaults %+v", o)
	}
	t.Setenv("SYSTEM_NAMESPACE", "lampyr-dev")
	if o, err := parseFlags(nil); err != nil || o.metadataNamespace != "lampyr-dev" {
		t.Fatalf("with SYSTEM_NAMESPACE: %q, %v", o.metadataNamespace, err)
	}
	for _, args := range [][]string{
		{"--metadata-namespace="}, // "" would make the informer watch every namespace
		{"--homes-namespace="},
		{"--max-revisions=0"},
		{"--max-revisions-per-namespace=0"},
		{"--max-revisions=10", "--max-revisions-per-namespace=11"},
		{"--router-key-file="},
		{"--token-file=/x"}, // the shared token is gone
	} {
		if _, err := parseFlags(args); err == nil {
			t.Errorf("%q accepted", args)
		}
	}
}

func TestReadRouterKey(t *testing.T) {
	_, key, err := routercred.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	pemKey, err := routercred.MarshalPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	good := filepath.Join(dir, "private.pem")
	if err := os.WriteFile(good, pemKey, 0o600); err != nil {
		t.Fatal(err)
	}
	if got, err := readRouterKey(good); err != nil || !got.Equal(key) {
		t.Fatalf("read back %v, %v", got, err)
	}
	bad := filepath.Join(dir, "bad.pem")
	if err := os.WriteFile(bad, []byte("not a key"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{bad, filepath.Join(dir, "missing.pem")} {
		if _, err := readRouterKey(p); err == nil || !strings.Contains(err.Error(), "--router-key-file") {
			t.Errorf("%s: %v, want an error naming --router-key-file", p, err)
		}
	}
}
