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
	var mounted bool
	for _, m := range c.VolumeMounts {
		if strings.HasPrefix(o.tokenFile, m.MountPath+"/") {
			mounted = true
		}
	}
	if !mounted {
		t.Fatalf("--token-file %s is not under any volume mount", o.tokenFile)
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

func TestRBACIsReadOnlyConfigMaps(t *testing.T) {
	docs := loadDocs(t)
	var r rbacv1.ClusterRole
	decodeStrict(t, docs["ClusterRole/lampyr-fiber-router"], &r)
	if len(r.Rules) != 1 || !slices.Equal(r.Rules[0].Resources, []string{"configmaps"}) {
		t.Fatalf("rules %+v", r.Rules)
	}
	for _, v := range r.Rules[0].Verbs {
		if v != "get" && v != "list" && v != "watch" {
			t.Fatalf("verb %q: the router only reads", v)
		}
	}
	var b rbacv1.ClusterRoleBinding
	decodeStrict(t, docs["ClusterRoleBinding/lampyr-fiber-router"], &b)
	if b.RoleRef.Name != r.Name || len(b.Subjects) != 1 || b.Subjects[0].Name != "fiber-router" || b.Subjects[0].Namespace != "lampyr-system" {
		t.Fatalf("binding %+v", b)
	}
	var sa corev1.ServiceAccount
	decodeStrict(t, docs["ServiceAccount/fiber-router"], &sa)
}
