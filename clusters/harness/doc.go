// Package harness is the one setup every cluster suite runs on: it creates
// or reuses the Kind clusters a suite declares (or connects to a third
// party's installation), installs each with the profile and networking
// provider stated for it, builds the fixture images once per run, and at the
// end dumps what a person needs when the setup failed, keeps or deletes what
// this run created, and runs the suite's own finish steps.
//
// It follows sigs.k8s.io/e2e-framework's lifecycle model: every step is an
// env.Func (func(context.Context, *envconf.Config) (context.Context, error)),
// setup steps pass state on in the context, and the state a spec reads is a
// Target per cluster (clients, gateway URL, registry, kubeconfig, the Lampyr
// installation, profile, provider, whether this run created it), found in
// the context through Suite.Target. Nothing lives in package globals but the
// Suite value each suite declares for Ginkgo.
//
// # Why the steps run inside BeforeSuite and AfterSuite, not env.Run(m)
//
// e2e-framework's own runner, Environment.Run(m) in a TestMain, runs the
// setup steps before m.Run and the finish steps after it. Read against
// v0.7.0's pkg/env/env.go that is the wrong place for these suites:
//   - a setup failure is logged with klog and Run returns exit code 1: no
//     spec fails, so the Ginkgo JUnit and JSON reports CI keeps show a run
//     with nothing wrong in it;
//   - a finish step's error is logged at klog verbosity 2 only, so a cluster
//     that could not be deleted goes unnoticed;
//   - the context the setup steps return stays inside the Environment, where
//     a Ginkgo spec (run by m.Run through RunSpecs) cannot reach it.
//
// So the harness calls the same env.Funcs from Ginkgo's BeforeSuite (each
// step's error fails it, named, in the reports; Ginkgo then skips the specs)
// and AfterSuite (Ginkgo runs it after a failed setup and on an interrupt
// too; every finish step runs even when an earlier one fails, and their
// errors fail it, named). The context is kept by the Suite between the two,
// its values detached from the Ginkgo node that made them.
//
// # A suite
//
//	var suite = harness.New(harness.Config{
//		Name: "portability", Recipe: "just test-knative-portability",
//		Clusters: harness.Paired(), // or []harness.Cluster{{Name: "lampyr", Profile: clusters.ProfileLampyr}}
//		Knobs:    []string{"LAMPYR_UNREAD_BODY_REQUESTS"},
//	})
//
//	func TestPortability(t *testing.T) { suite.Run(t) }
//
//	var _ = suite.Setup("sealing and applying the Services", setupProof) // an env.Func
//	var _ = suite.Finish("writing the report", finishProof)
//
//	func the() *proof { return harness.State[*proof](suite) } // put by setupProof with harness.With
//
// A declared Cluster may state its own networking provider (Provider: one
// run compares clusters behind different gateways) or name an External
// installation (kubeconfig and context, gateway, registry to push to and
// pull from): external ones are connected and checked first
// (ConnectExternals, Preflight: an API server, Knative, Lampyr on a lampyr
// target, a gateway that accepts connections, a registry the host pushes
// to and the cluster pulls from), and the run stops in seconds naming
// what each lacks; nothing is created, installed or deleted there.
//
// A spec reads suite.Target("lampyr") (or its own state through the()),
// and calls the harness's funcs (Image, Reinstall) with suite.In(ctx).
// A failed spec's dump goes to <artifacts>/<suite>/dump/<spec>/<cluster>;
// Suite.OnFailure adds to it.
//
// The environment variables are read once, by New (through
// clusters/environ); docs/environment.md lists them.
package harness
