// Package fake registers the Homes informers with injection.Fake, over the
// fake Kubernetes client (knative.dev/pkg/client/injection/kube/client/fake).
package fake

import (
	_ "knative.dev/pkg/client/injection/kube/client/fake"
	"knative.dev/pkg/injection"

	"lampyr.dev/serving/impl/grant/homes"
)

func init() {
	injection.Fake.RegisterInformerFactory(homes.WithInformerFactory)
	injection.Fake.RegisterInformer(homes.WithPods)
	injection.Fake.RegisterInformer(homes.WithServices)
	injection.Fake.RegisterInformer(homes.WithSecrets)
}
