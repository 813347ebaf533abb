//go:build tools

// Package hack pins, in go.mod, the versions of the libraries the project is
// built on before every one of them is imported by product code, so that
// parallel work on impl/ and the suites resolves the same versions.
package hack

import (
	_ "github.com/google/go-containerregistry/pkg/v1/remote"
	_ "github.com/gorilla/websocket"
	_ "github.com/onsi/ginkgo/v2"
	_ "github.com/onsi/gomega"
	_ "github.com/prometheus/client_golang/prometheus"
	_ "golang.org/x/net/http2/h2c"
	_ "k8s.io/client-go/kubernetes"
	_ "knative.dev/networking/pkg/apis/networking/v1alpha1"
	_ "knative.dev/pkg/injection/sharedmain"
	_ "knative.dev/serving/pkg/reconciler/route"
	_ "sigs.k8s.io/e2e-framework/pkg/env"
	_ "sigs.k8s.io/kind/pkg/cluster"
)
