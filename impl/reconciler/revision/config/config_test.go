package config

import (
	"context"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"knative.dev/pkg/configmap"
	logtesting "knative.dev/pkg/logging/testing"
	apisconfig "knative.dev/serving/pkg/apis/config"
	asconfig "knative.dev/serving/pkg/autoscaler/config"
	"lampyr.dev/serving/impl/contract"
	"lampyr.dev/serving/impl/contract/lampyrconfig"
)

func TestNewLampyrFromMap(t *testing.T) {
	tests := []struct {
		name    string
		data    map[string]string
		want    *lampyrconfig.Config
		wantErr bool
	}{{
		name: "absent keys keep the defaults",
		data: map[string]string{"template-repository": "localhost:5002/lampyr/templates"},
		want: DefaultLampyr(),
	}, {
		name: "endpointslice, memory and verification",
		data: map[string]string{lampyrconfig.KeyBackendStrategy: " EndpointSlice ", lampyrconfig.KeyDefaultMemoryPerFiber: "512Mi", lampyrconfig.KeyVerifyArtifacts: "true"},
		want: func() *lampyrconfig.Config {
			l := DefaultLampyr()
			l.BackendStrategy = lampyrconfig.BackendEndpointSlice
			l.DefaultMemoryPerFiber = resource.MustParse("512Mi")
			l.VerifyArtifacts = true
			return l
		}(),
	}, {
		name: "image snapshots, template repository, mirrors from the Home setting",
		data: map[string]string{
			lampyrconfig.KeyImageSnapshots:      "localhost:5002/hello@sha256:" + hex64("a") + ": localhost:5002/lampyr/snapshots/hello@sha256:" + hex64("b") + "\n",
			lampyrconfig.KeyTemplateRepository:  "lampyr-registry:5000/tpl",
			lampyrconfig.KeyHomeRegistryMirrors: "localhost:5002=lampyr-registry:5000, ",
		},
		want: func() *lampyrconfig.Config {
			l := DefaultLampyr()
			l.ImageSnapshots = map[string]string{"localhost:5002/hello@sha256:" + hex64("a"): "localhost:5002/lampyr/snapshots/hello@sha256:" + hex64("b")}
			l.TemplateRepository = "lampyr-registry:5000/tpl"
			l.RegistryMirrors = []string{"localhost:5002=lampyr-registry:5000"}
			l.HomeRegistryMirrors = l.RegistryMirrors // the key's own field (lampyrconfig)
			return l
		}(),
	}, {
		name: "registry-mirrors wins over home-registry-mirrors",
		data: map[string]string{lampyrconfig.KeyRegistryMirrors: "a:1=b:2", lampyrconfig.KeyHomeRegistryMirrors: "localhost:5002=lampyr-registry:5000"},
		want: func() *lampyrconfig.Config {
			l := DefaultLampyr()
			l.RegistryMirrors = []string{"a:1=b:2"}
			l.HomeRegistryMirrors = []string{"localhost:5002=lampyr-registry:5000"}
			return l
		}(),
	}, {
		name:    "image snapshot key is not a digest",
		data:    map[string]string{lampyrconfig.KeyImageSnapshots: "localhost:5002/hello:latest: localhost:5002/s@sha256:" + hex64("b")},
		wantErr: true,
	}, {
		name:    "image snapshot value is not pinned",
		data:    map[string]string{lampyrconfig.KeyImageSnapshots: "localhost:5002/hello@sha256:" + hex64("a") + ": localhost:5002/s:latest"},
		wantErr: true,
	}, {
		name:    "image snapshot key is a bare digest (any repository)",
		data:    map[string]string{lampyrconfig.KeyImageSnapshots: "sha256:" + hex64("a") + ": localhost:5002/s@sha256:" + hex64("b")},
		wantErr: true,
	}, {
		name:    "bad mirror",
		data:    map[string]string{lampyrconfig.KeyRegistryMirrors: "localhost:5002"},
		wantErr: true,
	}, {
		name:    "unknown strategy",
		data:    map[string]string{lampyrconfig.KeyBackendStrategy: "nodeport"},
		wantErr: true,
	}, {
		name:    "zero memory",
		data:    map[string]string{lampyrconfig.KeyDefaultMemoryPerFiber: "0"},
		wantErr: true,
	}, {
		name:    "bad bool",
		data:    map[string]string{lampyrconfig.KeyVerifyArtifacts: "maybe"},
		wantErr: true,
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := NewLampyrFromMap(tc.data)
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v, wantErr %v", err, tc.wantErr)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

func TestRouterHost(t *testing.T) {
	if got, want := DefaultLampyr().RouterHost(), "fiber-router.lampyr-system.svc.cluster.local"; got != want {
		t.Errorf("RouterHost() = %q, want %q", got, want)
	}
}

// defaultingWatcher records WatchWithDefault so the store can be driven.
type defaultingWatcher struct {
	cm        corev1.ConfigMap
	observers []configmap.Observer
}

func (w *defaultingWatcher) WatchWithDefault(cm corev1.ConfigMap, o ...configmap.Observer) {
	w.cm, w.observers = cm, o
}

func TestStore(t *testing.T) {
	store := NewStore(logtesting.TestLogger(t))
	serving := configmap.NewStaticWatcher(
		&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: apisconfig.DefaultsConfigName}, Data: map[string]string{"revision-timeout-seconds": "123"}},
		&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: apisconfig.FeaturesConfigName}},
		&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: asconfig.ConfigName}},
	)
	lampyr := &defaultingWatcher{}
	store.WatchConfigs(serving, lampyr)
	if lampyr.cm.Name != contract.ConfigMapName || lampyr.cm.Namespace != contract.SystemNamespace {
		t.Fatalf("watching %s/%s, want %s/%s", lampyr.cm.Namespace, lampyr.cm.Name, contract.SystemNamespace, contract.ConfigMapName)
	}

	// While config-lampyr is absent the watcher delivers the empty default.
	for _, o := range lampyr.observers {
		o(&lampyr.cm)
	}
	cfg := FromContext(store.ToContext(context.Background()))
	if cfg.Lampyr.BackendStrategy != lampyrconfig.BackendExternalName {
		t.Errorf("strategy = %q, want the default", cfg.Lampyr.BackendStrategy)
	}
	if got := cfg.Serving.Defaults.RevisionTimeoutSeconds; got != 123 {
		t.Errorf("serving defaults not loaded: revision timeout %d", got)
	}
	// The serving config is also where upstream defaulting looks for it.
	if got := apisconfig.FromContextOrDefaults(store.ToContext(context.Background())).Defaults.RevisionTimeoutSeconds; got != 123 {
		t.Errorf("apisconfig.FromContext revision timeout = %d, want 123", got)
	}

	cm := lampyr.cm.DeepCopy()
	cm.Data = map[string]string{lampyrconfig.KeyBackendStrategy: "endpointslice"}
	for _, o := range lampyr.observers {
		o(cm)
	}
	if got := store.Load().Lampyr.BackendStrategy; got != lampyrconfig.BackendEndpointSlice {
		t.Errorf("after update strategy = %q, want endpointslice", got)
	}
}

func hex64(c string) string {
	out := ""
	for len(out) < 64 {
		out += c
	}
	return out
}

func TestParseImageSnapshotsErrorsNameTheEntry(t *testing.T) {
	_, err := lampyrconfig.ParseImageSnapshots("localhost:5002/app@sha256:" + hex64("a") + ": localhost:5002/s:latest")
	if err == nil || !strings.Contains(err.Error(), "image-snapshots[localhost:5002/app@sha256:"+hex64("a")+"]") || !strings.Contains(err.Error(), "repository@sha256") {
		t.Fatalf("err = %v, want it to name the entry and the fix", err)
	}
	_, err = lampyrconfig.ParseImageSnapshots("sha256:" + hex64("a") + ": localhost:5002/s@sha256:" + hex64("b"))
	if err == nil || !strings.Contains(err.Error(), "bare digest") || !strings.Contains(err.Error(), "repository@sha256:"+hex64("a")) {
		t.Fatalf("bare digest key: err = %v, want it to say so and give the fix", err)
	}
	// Normalized keys: docker.io's defaults spelled out.
	m, err := lampyrconfig.ParseImageSnapshots("ubuntu@sha256:" + hex64("a") + ": localhost:5002/snap@sha256:" + hex64("b"))
	if err != nil || m["index.docker.io/library/ubuntu@sha256:"+hex64("a")] == "" {
		t.Fatalf("normalized keys: %v %v", m, err)
	}
}
