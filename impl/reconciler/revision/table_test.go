package revision

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrs "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation/field"
	clientgotesting "k8s.io/client-go/testing"
	"knative.dev/pkg/apis"
	"knative.dev/pkg/ptr"
	rtesting "knative.dev/pkg/reconciler/testing"
	v1 "knative.dev/serving/pkg/apis/serving/v1"

	fiberdv1alpha1 "lampyr.dev/serving/impl/apis/fiberd/v1alpha1"
	"lampyr.dev/serving/impl/contract"
	"lampyr.dev/serving/impl/contract/lampyrconfig"
	"lampyr.dev/serving/impl/internal/fetchq"
	"lampyr.dev/serving/impl/reconciler/revision/resources"
)

var (
	servicesGVR       = corev1.SchemeGroupVersion.WithResource("services")
	configMapsGVR     = corev1.SchemeGroupVersion.WithResource("configmaps")
	endpointSlicesGVR = discoveryv1.SchemeGroupVersion.WithResource("endpointslices")
	grantsGVR         = contract.CapacityGrants
)

func TestReconcile(t *testing.T) {
	tmpl := accepted()
	const refusal = "256Mi per fiber x 10 exceeds the 1Gi left (85% used); raise fiber-memory-capacity in config-lampyr"
	const tooMany = "maxFibers 500 is above max-fibers-per-grant 100"
	const notListening = "Container failed with: the handler did not listen on $PORT (8080) within the start-up timeout of 10s; last output:\nlistening nowhere"
	sliceStrategy := map[string]interface{}{lampyrConfigKey: testLampyr(lampyrconfig.BackendEndpointSlice)}

	table := rtesting.TableTest{{
		Name: "bad workqueue key",
		Key:  "too/many/parts",
	}, {
		Name: "revision gone",
		Key:  key(),
	}, {
		Name:    "first reconcile adds the finalizer and creates everything",
		Objects: []runtime.Object{rev(withoutFinalizer)},
		Key:     key(),
		WantPatches: []clientgotesting.PatchActionImpl{
			patchFinalizers(finalizerName),
		},
		WantEvents: []string{finalizerEvent(), grantCreatedEvent(), serviceCreatedEvent(corev1.ServiceTypeExternalName)},
		WantCreates: []runtime.Object{
			grant(tmpl),
			service(tmpl, lampyrconfig.BackendExternalName),
			metadata(tmpl, "", false),
		},
		WantStatusUpdates: []clientgotesting.UpdateActionImpl{
			statusUpdate(rev(withoutFinalizer, waitingForGrant())),
		},
	}, {
		Name:    "accepted revision: grant, ExternalName Service and unready metadata created",
		Objects: []runtime.Object{rev()},
		Key:     key(),
		WantEvents: []string{
			grantCreatedEvent(),
			serviceCreatedEvent(corev1.ServiceTypeExternalName),
		},
		WantCreates: []runtime.Object{
			grant(tmpl),
			service(tmpl, lampyrconfig.BackendExternalName),
			metadata(tmpl, "", false),
		},
		WantStatusUpdates: []clientgotesting.UpdateActionImpl{
			statusUpdate(rev(waitingForGrant())),
		},
	}, {
		Name: "grant admitted, Home starting",
		Objects: []runtime.Object{
			rev(waitingForGrant()),
			grant(tmpl, grantHomeNotReady(contract.ReasonHomePending, "the Home Pod is being scheduled")),
			service(tmpl, lampyrconfig.BackendExternalName),
			metadata(tmpl, "", false),
		},
		Key: key(),
		WantStatusUpdates: []clientgotesting.UpdateActionImpl{
			statusUpdate(rev(withConditions(
				healthy(corev1.ConditionUnknown, contract.ReasonWaitingForHome.String(), MessageWaitingForHome),
				available(corev1.ConditionUnknown, v1.ReasonDeploying, MessageWaitingForRouting),
				active(corev1.ConditionUnknown, v1.ReasonDeploying, MessageWaitingForRouting),
			), withContainerStatus("user-container", testImage))),
		},
	}, {
		Name: "grant ready: metadata published ready, Revision Ready",
		Objects: []runtime.Object{
			rev(waitingForGrant()),
			grant(tmpl, grantReady),
			service(tmpl, lampyrconfig.BackendExternalName),
			metadata(tmpl, "", false),
		},
		Key: key(),
		WantUpdates: []clientgotesting.UpdateActionImpl{
			update(metadata(tmpl, testHome, true)),
		},
		WantStatusUpdates: []clientgotesting.UpdateActionImpl{
			statusUpdate(rev(ready())),
		},
	}, {
		Name: "gvisor fibers start cold (checkpoint failed): said as Info, the Revision stays Ready",
		Objects: []runtime.Object{
			rev(ready()),
			grant(tmpl, grantReady, func(g *fiberdv1alpha1.CapacityGrant) {
				g.Status.MarkFibersStartCold("uid-1", "%s", "The Revision's fibers start cold: runsc checkpoint: exit status 128")
			}),
			service(tmpl, lampyrconfig.BackendExternalName),
			metadata(tmpl, testHome, true),
		},
		Key: key(),
		WantStatusUpdates: []clientgotesting.UpdateActionImpl{
			statusUpdate(rev(ready(), func(r *v1.Revision) {
				revisionConditions.Manage(&r.Status).MarkFalse(ConditionFibersPreinitialized, contract.ReasonCheckpointFailed.String(), "%s", "The Revision's fibers start cold: runsc checkpoint: exit status 128")
				if c := r.Status.GetCondition(ConditionFibersPreinitialized); c.Severity != apis.ConditionSeverityInfo || !r.IsReady() {
					panic(fmt.Sprintf("cold fibers made the Revision not Ready or are not Info: %+v", c))
				}
			})),
		},
	}, {
		Name: "gvisor fibers restored, then a Home on another backend: the condition follows the grant",
		Objects: []runtime.Object{
			rev(ready(), func(r *v1.Revision) {
				revisionConditions.Manage(&r.Status).MarkTrue(ConditionFibersPreinitialized)
			}),
			grant(tmpl, grantReady),
			service(tmpl, lampyrconfig.BackendExternalName),
			metadata(tmpl, testHome, true),
		},
		Key: key(),
		WantStatusUpdates: []clientgotesting.UpdateActionImpl{
			statusUpdate(rev(ready())),
		},
	}, {
		Name: "steady state after a restart: everything present, no writes",
		Objects: []runtime.Object{
			rev(ready()),
			grant(tmpl, grantReady),
			service(tmpl, lampyrconfig.BackendExternalName),
			metadata(tmpl, testHome, true),
		},
		Key: key(),
	}, {
		Name: "restart with status lost: converges to Ready without touching owned objects",
		Objects: []runtime.Object{
			rev(),
			grant(tmpl, grantReady),
			service(tmpl, lampyrconfig.BackendExternalName),
			metadata(tmpl, testHome, true),
		},
		Key: key(),
		WantStatusUpdates: []clientgotesting.UpdateActionImpl{
			statusUpdate(rev(ready())),
		},
	}, {
		Name: "grant refused: ResourcesAvailable False with the grant's reason and message",
		Objects: []runtime.Object{
			rev(waitingForGrant()),
			grant(tmpl, grantRefused(contract.ReasonInsufficientMemory, "256Mi per fiber x 10 exceeds the 1Gi left (85% used); raise fiber-memory-capacity in config-lampyr")),
			service(tmpl, lampyrconfig.BackendExternalName),
			metadata(tmpl, "", false),
		},
		Key: key(),
		WantEvents: []string{
			rtesting.Eventf(corev1.EventTypeWarning, "InsufficientMemory", "ResourcesAvailable: %s", refusal),
		},
		WantStatusUpdates: []clientgotesting.UpdateActionImpl{
			statusUpdate(refusedRev("InsufficientMemory", refusal)),
		},
	}, {
		Name: "grant still refused for the same reason: no second Event, no writes",
		Objects: []runtime.Object{
			refusedRev("InsufficientMemory", refusal),
			grant(tmpl, grantRefused(contract.ReasonInsufficientMemory, refusal)),
			service(tmpl, lampyrconfig.BackendExternalName),
			metadata(tmpl, "", false),
		},
		Key: key(),
	}, {
		Name: "grant refused for another reason: a new Event",
		Objects: []runtime.Object{
			refusedRev("InsufficientMemory", refusal),
			grant(tmpl, grantRefused(contract.ReasonTooManyFibers, tooMany)),
			service(tmpl, lampyrconfig.BackendExternalName),
			metadata(tmpl, "", false),
		},
		Key: key(),
		WantEvents: []string{
			rtesting.Eventf(corev1.EventTypeWarning, "TooManyFibers", "ResourcesAvailable: %s", tooMany),
		},
		WantStatusUpdates: []clientgotesting.UpdateActionImpl{
			statusUpdate(refusedRev("TooManyFibers", tooMany)),
		},
	}, {
		Name: "Home failed: ContainerHealthy False with the grant's HomeReady reason",
		Objects: []runtime.Object{
			rev(waitingForGrant()),
			grant(tmpl, grantHomeFailed(contract.ReasonHomeFailed, "fiberd: the template is not sealed to this cluster's fleet key")),
			service(tmpl, lampyrconfig.BackendExternalName),
			metadata(tmpl, "", false),
		},
		Key: key(),
		WantEvents: []string{
			rtesting.Eventf(corev1.EventTypeWarning, "HomeFailed", "ContainerHealthy: %s", "fiberd: the template is not sealed to this cluster's fleet key"),
		},
		WantStatusUpdates: []clientgotesting.UpdateActionImpl{
			statusUpdate(rev(withConditions(
				healthy(corev1.ConditionFalse, contract.ReasonHomeFailed.String(), "fiberd: the template is not sealed to this cluster's fleet key"),
				available(corev1.ConditionUnknown, v1.ReasonDeploying, MessageWaitingForRouting),
				active(corev1.ConditionUnknown, contract.ReasonHomeFailed.String(), "fiberd: the template is not sealed to this cluster's fleet key"),
			), withContainerStatus("user-container", testImage))),
		},
	}, {
		// As stock Knative reports a container that exits at start-up.
		Name: "handler exits at start-up: ContainerHealthy False ExitCode5 with its last output",
		Objects: []runtime.Object{
			rev(waitingForGrant()),
			grant(tmpl, grantHandlerFailed(fiberdv1alpha1.HandlerFailure{Reason: contract.ReasonHandlerExited, ExitCode: 5, Output: "Started...\nCrashed..."},
				"the handler exited with code 5 before it listened on $PORT (8080)")),
			service(tmpl, lampyrconfig.BackendExternalName),
			metadata(tmpl, "", false),
		},
		Key: key(),
		WantEvents: []string{
			rtesting.Eventf(corev1.EventTypeWarning, "ExitCode5", "ContainerHealthy: %s", "Container failed with: Started...\nCrashed..."),
		},
		WantStatusUpdates: []clientgotesting.UpdateActionImpl{
			statusUpdate(rev(withConditions(
				healthy(corev1.ConditionFalse, "ExitCode5", "Container failed with: Started...\nCrashed..."),
				available(corev1.ConditionUnknown, v1.ReasonDeploying, MessageWaitingForRouting),
				active(corev1.ConditionUnknown, "ExitCode5", "Container failed with: Started...\nCrashed..."),
			), withContainerStatus("user-container", testImage))),
		},
	}, {
		Name: "handler killed by a signal without output: ExitCode137 saying so",
		Objects: []runtime.Object{
			rev(waitingForGrant()),
			grant(tmpl, grantHandlerFailed(fiberdv1alpha1.HandlerFailure{Reason: contract.ReasonHandlerExited, ExitCode: 137, Signal: "SIGKILL"},
				"the handler was killed by signal SIGKILL (exit code 137) before it listened on $PORT (8080)")),
			service(tmpl, lampyrconfig.BackendExternalName),
			metadata(tmpl, "", false),
		},
		Key: key(),
		WantEvents: []string{
			rtesting.Eventf(corev1.EventTypeWarning, "ExitCode137", "ContainerHealthy: %s", "Container failed with: container was killed by signal SIGKILL and wrote no output"),
		},
		WantStatusUpdates: []clientgotesting.UpdateActionImpl{
			statusUpdate(rev(withConditions(
				healthy(corev1.ConditionFalse, "ExitCode137", "Container failed with: container was killed by signal SIGKILL and wrote no output"),
				available(corev1.ConditionUnknown, v1.ReasonDeploying, MessageWaitingForRouting),
				active(corev1.ConditionUnknown, "ExitCode137", "Container failed with: container was killed by signal SIGKILL and wrote no output"),
			), withContainerStatus("user-container", testImage))),
		},
	}, {
		Name: "handler never listens: ContainerHealthy False HandlerNotListening",
		Objects: []runtime.Object{
			rev(waitingForGrant()),
			grant(tmpl, grantHandlerFailed(fiberdv1alpha1.HandlerFailure{Reason: contract.ReasonHandlerNotListening, Output: "listening nowhere"},
				"the handler did not listen on $PORT (8080) within the start-up timeout of 10s")),
			service(tmpl, lampyrconfig.BackendExternalName),
			metadata(tmpl, "", false),
		},
		Key: key(),
		WantEvents: []string{
			rtesting.Eventf(corev1.EventTypeWarning, "HandlerNotListening", "ContainerHealthy: %s", notListening),
		},
		WantStatusUpdates: []clientgotesting.UpdateActionImpl{
			statusUpdate(rev(withConditions(
				healthy(corev1.ConditionFalse, contract.ReasonHandlerNotListening.String(), notListening),
				available(corev1.ConditionUnknown, v1.ReasonDeploying, MessageWaitingForRouting),
				active(corev1.ConditionUnknown, contract.ReasonHandlerNotListening.String(), notListening),
			), withContainerStatus("user-container", testImage))),
		},
	}, {
		Name: "handler starts again (the grant's Home is ready): ContainerHealthy True, nothing of the failure left",
		Objects: []runtime.Object{
			rev(withConditions(
				healthy(corev1.ConditionFalse, "ExitCode5", "Container failed with: Crashed..."),
				available(corev1.ConditionUnknown, v1.ReasonDeploying, MessageWaitingForRouting),
				active(corev1.ConditionUnknown, "ExitCode5", "Container failed with: Crashed..."),
			), withContainerStatus("user-container", testImage)),
			grant(tmpl, grantReady),
			service(tmpl, lampyrconfig.BackendExternalName),
			metadata(tmpl, testHome, true),
		},
		Key: key(),
		WantStatusUpdates: []clientgotesting.UpdateActionImpl{
			statusUpdate(rev(ready())),
		},
	}, {
		Name: "Ready Revision whose Home went away is withdrawn from fiber-router",
		Objects: []runtime.Object{
			rev(ready()),
			grant(tmpl, grantHomeFailed(contract.ReasonHomeFailed, "the Home Pod was evicted")),
			service(tmpl, lampyrconfig.BackendExternalName),
			metadata(tmpl, testHome, true),
		},
		Key: key(),
		WantEvents: []string{
			rtesting.Eventf(corev1.EventTypeWarning, "HomeFailed", "ContainerHealthy: %s", "the Home Pod was evicted"),
		},
		WantUpdates: []clientgotesting.UpdateActionImpl{
			update(metadata(tmpl, "", false)),
		},
		WantStatusUpdates: []clientgotesting.UpdateActionImpl{
			statusUpdate(rev(withConditions(
				healthy(corev1.ConditionFalse, contract.ReasonHomeFailed.String(), "the Home Pod was evicted"),
				available(corev1.ConditionUnknown, v1.ReasonDeploying, MessageWaitingForRouting),
				active(corev1.ConditionUnknown, contract.ReasonHomeFailed.String(), "the Home Pod was evicted"),
			), withContainerStatus("user-container", testImage))),
		},
	}, {
		Name: "grant spec drifted: put back, status not trusted until the grant controller re-reports",
		Objects: []runtime.Object{
			rev(ready()),
			grant(tmpl, grantReady, func(g *fiberdv1alpha1.CapacityGrant) { g.Spec.MaxFibers = 99 }),
			service(tmpl, lampyrconfig.BackendExternalName),
			metadata(tmpl, testHome, true),
		},
		Key: key(),
		WantEvents: []string{
			grantUpdatedEvent(),
		},
		WantUpdates: []clientgotesting.UpdateActionImpl{
			update(grant(tmpl, grantReady)),
			update(metadata(tmpl, "", false)),
		},
		WantStatusUpdates: []clientgotesting.UpdateActionImpl{
			statusUpdate(rev(waitingForGrant())),
		},
	}, {
		Name: "grant status from before its last spec change is not trusted",
		Objects: []runtime.Object{
			rev(waitingForGrant()),
			grant(tmpl, grantReady, func(g *fiberdv1alpha1.CapacityGrant) { g.Generation = 2; g.Status.ObservedGeneration = 1 }),
			service(tmpl, lampyrconfig.BackendExternalName),
			metadata(tmpl, "", false),
		},
		Key: key(),
	}, {
		Name: "h2c template: Service port 81 http2 with appProtocol kubernetes.io/h2c",
		Objects: []runtime.Object{rev(container(func(c *corev1.Container) {
			c.Ports = []corev1.ContainerPort{{Name: "h2c", ContainerPort: 50051}}
		}))},
		Key: key(),
		WantEvents: []string{
			grantCreatedEvent(),
			serviceCreatedEvent(corev1.ServiceTypeExternalName),
		},
		WantCreates: []runtime.Object{
			grant(accepted(h2c)),
			service(accepted(h2c), lampyrconfig.BackendExternalName),
			metadata(accepted(h2c), "", false),
		},
		WantStatusUpdates: []clientgotesting.UpdateActionImpl{
			statusUpdate(rev(container(func(c *corev1.Container) {
				c.Ports = []corev1.ContainerPort{{Name: "h2c", ContainerPort: 50051}}
			}), waitingForGrant())),
		},
	}, {
		Name: "scaling and execution policy are translated into the grant",
		Objects: []runtime.Object{rev(
			annotation("autoscaling.knative.dev/max-scale", "7"),
			annotation("autoscaling.knative.dev/min-scale", "0"),
			annotation(contract.ExecutionModeAnnotation, "reuse"),
			annotation(contract.IdleTimeoutAnnotation, "30s"),
			annotation(contract.IdleActionAnnotation, "release"),
			func(r *v1.Revision) { r.Spec.TimeoutSeconds = ptr.Int64(900) },
			container(func(c *corev1.Container) {
				c.Resources.Requests = corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("512Mi")}
			}),
		)},
		Key: key(),
		WantEvents: []string{
			grantCreatedEvent(),
			serviceCreatedEvent(corev1.ServiceTypeExternalName),
		},
		WantCreates: []runtime.Object{
			grant(accepted(), func(g *fiberdv1alpha1.CapacityGrant) {
				g.Spec.MaxFibers = 7
				g.Spec.MaxRequestSeconds = 900
				g.Spec.MemoryPerFiber = resource.MustParse("512Mi")
				g.Spec.Execution = fiberdv1alpha1.ExecutionPolicy{Mode: fiberdv1alpha1.ExecutionReuse, IdleTimeoutSeconds: 30, IdleAction: "release"}
			}),
			service(tmpl, lampyrconfig.BackendExternalName),
			resources.MakeRouterMetadata(rev(), accepted(func(t *resources.Template) {
				t.MaxFibers = 7
				t.TimeoutSeconds = 900
				t.Execution = fiberdv1alpha1.ExecutionPolicy{Mode: fiberdv1alpha1.ExecutionReuse, IdleTimeoutSeconds: 30, IdleAction: "release"}
			}), "lampyr-system", resources.Home{}, false),
		},
		WantStatusUpdates: []clientgotesting.UpdateActionImpl{
			statusUpdate(rev(
				annotation("autoscaling.knative.dev/max-scale", "7"),
				annotation("autoscaling.knative.dev/min-scale", "0"),
				annotation(contract.ExecutionModeAnnotation, "reuse"),
				annotation(contract.IdleTimeoutAnnotation, "30s"),
				annotation(contract.IdleActionAnnotation, "release"),
				func(r *v1.Revision) { r.Spec.TimeoutSeconds = ptr.Int64(900) },
				container(func(c *corev1.Container) {
					c.Resources.Requests = corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("512Mi")}
				}),
				waitingForGrant())),
		},
	}, {
		Name:          "endpointslice strategy: selectorless ClusterIP Service and a mirror of fiber-router's ready endpoints",
		OtherTestData: sliceStrategy,
		Objects: []runtime.Object{
			rev(),
			routerSlice("fiber-router-abcde",
				endpoint("10.244.0.12", ptr.Bool(true)),
				endpoint("10.244.0.11", nil),
				endpoint("10.244.0.13", ptr.Bool(false)),
			),
		},
		Key: key(),
		WantEvents: []string{
			grantCreatedEvent(),
			serviceCreatedEvent(corev1.ServiceTypeClusterIP),
		},
		WantCreates: []runtime.Object{
			grant(tmpl),
			service(tmpl, lampyrconfig.BackendEndpointSlice),
			mirror(tmpl, "10.244.0.11", "10.244.0.12"),
			metadata(tmpl, "", false),
		},
		WantStatusUpdates: []clientgotesting.UpdateActionImpl{
			statusUpdate(rev(waitingForGrant())),
		},
	}, {
		Name:          "endpointslice strategy: Ready, API-server defaults on the Service are left alone",
		OtherTestData: sliceStrategy,
		Objects: []runtime.Object{
			rev(ready()),
			grant(tmpl, grantReady),
			apiServerDefaults(service(tmpl, lampyrconfig.BackendEndpointSlice)),
			routerSlice("fiber-router-abcde", endpoint("10.244.0.11", ptr.Bool(true))),
			mirror(tmpl, "10.244.0.11"),
			metadata(tmpl, testHome, true),
		},
		Key: key(),
	}, {
		Name:          "endpointslice strategy: fiber-router replaced, mirror follows",
		OtherTestData: sliceStrategy,
		Objects: []runtime.Object{
			rev(ready()),
			grant(tmpl, grantReady),
			apiServerDefaults(service(tmpl, lampyrconfig.BackendEndpointSlice)),
			routerSlice("fiber-router-fghij", endpoint("10.244.0.21", ptr.Bool(true)), endpoint("10.244.0.11", ptr.Bool(false))),
			mirror(tmpl, "10.244.0.11"),
			metadata(tmpl, testHome, true),
		},
		Key: key(),
		WantUpdates: []clientgotesting.UpdateActionImpl{
			update(mirror(tmpl, "10.244.0.21")),
		},
	}, {
		Name:          "endpointslice strategy: fiber-router has no ready endpoints, the mirror is empty and stays put",
		OtherTestData: sliceStrategy,
		Objects: []runtime.Object{
			rev(ready()),
			grant(tmpl, grantReady),
			apiServerDefaults(service(tmpl, lampyrconfig.BackendEndpointSlice)),
			routerSlice("fiber-router-abcde", endpoint("10.244.0.11", ptr.Bool(false))),
			func() *discoveryv1.EndpointSlice {
				s := mirror(tmpl)
				s.Endpoints = []discoveryv1.Endpoint{} // as read back from the API server
				return s
			}(),
			metadata(tmpl, testHome, true),
		},
		Key: key(),
	}, {
		Name:          "strategy switched to endpointslice: Service becomes ClusterIP",
		OtherTestData: sliceStrategy,
		Objects: []runtime.Object{
			rev(ready()),
			grant(tmpl, grantReady),
			service(tmpl, lampyrconfig.BackendExternalName),
			routerSlice("fiber-router-abcde", endpoint("10.244.0.11", ptr.Bool(true))),
			mirror(tmpl, "10.244.0.11"),
			metadata(tmpl, testHome, true),
		},
		Key: key(),
		WantUpdates: []clientgotesting.UpdateActionImpl{
			update(service(tmpl, lampyrconfig.BackendEndpointSlice)),
		},
	}, {
		Name: "strategy switched to externalname: Service becomes ExternalName, mirror deleted",
		Objects: []runtime.Object{
			rev(ready()),
			grant(tmpl, grantReady),
			apiServerDefaults(service(tmpl, lampyrconfig.BackendEndpointSlice)),
			mirror(tmpl, "10.244.0.11"),
			metadata(tmpl, testHome, true),
		},
		Key: key(),
		WantUpdates: []clientgotesting.UpdateActionImpl{
			update(service(tmpl, lampyrconfig.BackendExternalName)),
		},
		WantDeletes: []clientgotesting.DeleteActionImpl{
			deleteAction(endpointSlicesGVR, testRevName),
		},
	}, {
		Name: "a Service of the same name that the Revision does not own",
		Objects: []runtime.Object{
			rev(waitingForGrant()),
			grant(tmpl, grantReady),
			notOwned(service(tmpl, lampyrconfig.BackendExternalName)),
			metadata(tmpl, "", false),
		},
		Key: key(),
		WantEvents: []string{
			notOwnedEvent("Service", testRevName),
		},
		// The Home is ready, so its endpoint is published, but not ready.
		WantUpdates: []clientgotesting.UpdateActionImpl{
			update(metadata(tmpl, testHome, false)),
		},
		WantStatusUpdates: []clientgotesting.UpdateActionImpl{
			statusUpdate(rev(withConditions(
				healthy(corev1.ConditionTrue, "", ""),
				available(corev1.ConditionFalse, v1.ReasonNotOwned, v1.ResourceNotOwnedMessage("Service", testRevName)),
				active(corev1.ConditionUnknown, v1.ReasonNotOwned, v1.ResourceNotOwnedMessage("Service", testRevName)),
			), withContainerStatus("user-container", testImage))),
		},
	}, {
		Name: "the Service is missing a port: repaired",
		Objects: []runtime.Object{
			rev(ready()),
			grant(tmpl, grantReady),
			func() *corev1.Service {
				s := service(tmpl, lampyrconfig.BackendExternalName)
				s.Spec.Ports[0].TargetPort = intstr.FromInt32(8080)
				return s
			}(),
			metadata(tmpl, testHome, true),
		},
		Key: key(),
		WantUpdates: []clientgotesting.UpdateActionImpl{
			update(service(tmpl, lampyrconfig.BackendExternalName)),
		},
	}, {
		Name:          "artifact verification on: missing artifact is ContainerHealthy False ContainerMissing, looked at again after the backoff",
		OtherTestData: map[string]interface{}{lampyrConfigKey: verifying(), verifierKey: fakeRegistry{}},
		Objects: []runtime.Object{
			rev(waitingForGrant()),
			grant(tmpl, grantReady),
			service(tmpl, lampyrconfig.BackendExternalName),
			metadata(tmpl, "", false),
		},
		Key:     key(),
		WantErr: true, // the requeue-after "error", which emits no event
		WantEvents: []string{
			rtesting.Eventf(corev1.EventTypeWarning, v1.ReasonContainerMissing, "ContainerHealthy: %s", missingMessage),
		},
		// The Home is ready, so its endpoint is published, but not ready.
		WantUpdates: []clientgotesting.UpdateActionImpl{
			update(metadata(tmpl, testHome, false)),
		},
		WantStatusUpdates: []clientgotesting.UpdateActionImpl{
			statusUpdate(rev(artifactMissing())),
		},
	}, {
		Name:          "artifact verification on: missing last time and checked again, the status holds still",
		OtherTestData: map[string]interface{}{lampyrConfigKey: verifying(), verifierKey: checkRecheck},
		Objects: []runtime.Object{
			rev(artifactMissing()),
			grant(tmpl, grantReady),
			service(tmpl, lampyrconfig.BackendExternalName),
			metadata(tmpl, testHome, false),
		},
		Key: key(),
	}, {
		Name:          "artifact verification on: present artifact, Ready",
		OtherTestData: map[string]interface{}{lampyrConfigKey: verifying(), verifierKey: fakeRegistry{testArtifact: true}},
		Objects: []runtime.Object{
			rev(ready()),
			grant(tmpl, grantReady),
			service(tmpl, lampyrconfig.BackendExternalName),
			metadata(tmpl, testHome, true),
		},
		Key: key(),
	}, {
		Name:          "artifact verification on: first reconcile while the check runs: everything created, the Revision waits VerifyingArtifact",
		OtherTestData: map[string]interface{}{lampyrConfigKey: verifying(), verifierKey: checkPending},
		Objects:       []runtime.Object{rev()},
		Key:           key(),
		WantEvents: []string{
			grantCreatedEvent(),
			serviceCreatedEvent(corev1.ServiceTypeExternalName),
		},
		WantCreates: []runtime.Object{
			grant(tmpl),
			service(tmpl, lampyrconfig.BackendExternalName),
			metadata(tmpl, "", false),
		},
		WantStatusUpdates: []clientgotesting.UpdateActionImpl{
			statusUpdate(rev(verifyingArtifact(checkingMessage, contract.ReasonWaitingForGrant.String(), MessageWaitingForGrant))),
		},
	}, {
		Name:          "artifact verification on: Home ready but the check queued behind the namespace's others: not routed",
		OtherTestData: map[string]interface{}{lampyrConfigKey: verifying(), verifierKey: checkQueued},
		Objects: []runtime.Object{
			rev(waitingForGrant()),
			grant(tmpl, grantReady),
			service(tmpl, lampyrconfig.BackendExternalName),
			metadata(tmpl, "", false),
		},
		Key: key(),
		WantUpdates: []clientgotesting.UpdateActionImpl{
			update(metadata(tmpl, testHome, false)),
		},
		WantStatusUpdates: []clientgotesting.UpdateActionImpl{
			statusUpdate(rev(verifyingArtifact(queuedMessage, v1.ReasonDeploying, MessageWaitingForRouting))),
		},
	}, {
		Name:          "artifact verification on: registry unreachable waits with its error and is looked at again after the backoff, not a failure",
		OtherTestData: map[string]interface{}{lampyrConfigKey: verifying(), verifierKey: checkUnreachable},
		Objects: []runtime.Object{
			rev(waitingForGrant()),
			grant(tmpl, grantReady),
			service(tmpl, lampyrconfig.BackendExternalName),
			metadata(tmpl, "", false),
		},
		Key:     key(),
		WantErr: true, // requeue after the backoff; no InternalError event
		WantUpdates: []clientgotesting.UpdateActionImpl{
			update(metadata(tmpl, testHome, false)),
		},
		WantStatusUpdates: []clientgotesting.UpdateActionImpl{
			statusUpdate(rev(verifyingArtifact(unreachableMessage, v1.ReasonDeploying, MessageWaitingForRouting))),
		},
	}, {
		Name:          "artifact verification on: the check runs again after an unreachable registry, the message holds still",
		OtherTestData: map[string]interface{}{lampyrConfigKey: verifying(), verifierKey: checkRetrying},
		Objects: []runtime.Object{
			rev(verifyingArtifact(unreachableMessage, v1.ReasonDeploying, MessageWaitingForRouting)),
			grant(tmpl, grantReady),
			service(tmpl, lampyrconfig.BackendExternalName),
			metadata(tmpl, testHome, false),
		},
		Key: key(),
	}, {
		Name:          "artifact verification on: a Ready Revision whose check runs again (controller restart) stays Ready and routed",
		OtherTestData: map[string]interface{}{lampyrConfigKey: verifying(), verifierKey: checkPending},
		Objects: []runtime.Object{
			rev(ready()),
			grant(tmpl, grantReady),
			service(tmpl, lampyrconfig.BackendExternalName),
			metadata(tmpl, testHome, true),
		},
		Key: key(),
	}, {
		Name:          "artifact verification on: a Ready Revision whose registry is unreachable stays Ready, looked at again after the backoff",
		OtherTestData: map[string]interface{}{lampyrConfigKey: verifying(), verifierKey: checkUnreachable},
		Objects: []runtime.Object{
			rev(ready()),
			grant(tmpl, grantReady),
			service(tmpl, lampyrconfig.BackendExternalName),
			metadata(tmpl, testHome, true),
		},
		Key:     key(),
		WantErr: true, // the requeue-after "error"
	}, {
		Name: "API error creating the Service is returned for a retry",
		Objects: []runtime.Object{
			rev(waitingForGrant()),
			grant(tmpl),
		},
		Key:          key(),
		WithReactors: []clientgotesting.ReactionFunc{rtesting.InduceFailure("create", "services")},
		WantErr:      true,
		WantCreates:  []runtime.Object{service(tmpl, lampyrconfig.BackendExternalName)},
		WantEvents: []string{
			rtesting.Eventf(corev1.EventTypeWarning, "InternalError", "creating Service %s: inducing failure for create services", testRevName),
		},
	}, {
		Name:    "the API server refuses the grant: ResourcesAvailable False, no endless retry",
		Objects: []runtime.Object{rev()},
		Key:     key(),
		WantEvents: []string{
			serviceCreatedEvent(corev1.ServiceTypeExternalName),
			rtesting.Eventf(corev1.EventTypeWarning, contract.ReasonInvalidCapacityGrant.String(), "ResourcesAvailable: %s", invalidGrantErr.Error()),
		},
		WithReactors: []clientgotesting.ReactionFunc{refuseGrantCreate},
		WantCreates: []runtime.Object{
			grant(tmpl),
			service(tmpl, lampyrconfig.BackendExternalName),
			metadata(tmpl, "", false),
		},
		WantStatusUpdates: []clientgotesting.UpdateActionImpl{
			statusUpdate(rev(withConditions(
				healthy(corev1.ConditionUnknown, contract.ReasonWaitingForHome.String(), MessageWaitingForHome),
				available(corev1.ConditionFalse, contract.ReasonInvalidCapacityGrant.String(), invalidGrantErr.Error()),
				active(corev1.ConditionUnknown, contract.ReasonInvalidCapacityGrant.String(), invalidGrantErr.Error()),
			), withContainerStatus("user-container", testImage))),
		},
	}, {
		Name:    "rejected template after a Lampyr upgrade: published metadata is withdrawn",
		Objects: []runtime.Object{rev(container(func(c *corev1.Container) { c.Command = []string{"/bin/sh"} })), metadata(tmpl, testHome, true)},
		Key:     key(),
		WantEvents: []string{
			refusalEvent(rev(container(func(c *corev1.Container) { c.Command = []string{"/bin/sh"} }),
				rejected("UnsupportedCommand", "spec.containers[0].command", detailFor("command"))), v1.RevisionConditionResourcesAvailable),
		},
		WantUpdates: []clientgotesting.UpdateActionImpl{
			update(metadata(tmpl, testHome, false)),
		},
		WantStatusUpdates: []clientgotesting.UpdateActionImpl{
			statusUpdate(rev(container(func(c *corev1.Container) { c.Command = []string{"/bin/sh"} }),
				rejected("UnsupportedCommand", "spec.containers[0].command", detailFor("command")))),
		},
	}, {
		Name: "finalization deletes metadata, EndpointSlice, Service and grant, then the finalizer",
		Objects: []runtime.Object{
			rev(deleted, ready()),
			grant(tmpl, grantReady),
			apiServerDefaults(service(tmpl, lampyrconfig.BackendEndpointSlice)),
			mirror(tmpl, "10.244.0.11"),
			metadata(tmpl, testHome, true),
		},
		Key: key(),
		WantDeletes: []clientgotesting.DeleteActionImpl{
			deleteActionIn("lampyr-system", configMapsGVR, "route."+testNS+"."+testRevName),
			deleteAction(endpointSlicesGVR, testRevName),
			deleteAction(servicesGVR, testRevName),
			deleteAction(grantsGVR, testRevName),
		},
		WantPatches: []clientgotesting.PatchActionImpl{patchFinalizers()},
		WantEvents:  []string{finalizerEvent()},
	}, {
		Name: "finalization leaves objects it does not own",
		Objects: []runtime.Object{
			rev(deleted, ready()),
			notOwned(grant(tmpl, grantReady)),
			notOwned(service(tmpl, lampyrconfig.BackendExternalName)),
		},
		Key:         key(),
		WantPatches: []clientgotesting.PatchActionImpl{patchFinalizers()},
		WantEvents:  []string{finalizerEvent()},
	}, {
		Name:        "finalization after everything is already gone",
		Objects:     []runtime.Object{rev(deleted, ready())},
		Key:         key(),
		WantPatches: []clientgotesting.PatchActionImpl{patchFinalizers()},
		WantEvents:  []string{finalizerEvent()},
	}, {
		Name:         "finalization retries when a delete fails, keeping the finalizer",
		Objects:      []runtime.Object{rev(deleted, ready()), service(tmpl, lampyrconfig.BackendExternalName)},
		Key:          key(),
		WithReactors: []clientgotesting.ReactionFunc{rtesting.InduceFailure("delete", "services")},
		WantErr:      true,
		WantDeletes:  []clientgotesting.DeleteActionImpl{deleteAction(servicesGVR, testRevName)},
		WantEvents: []string{
			rtesting.Eventf(corev1.EventTypeWarning, "InternalError", "inducing failure for delete services"),
		},
	}}

	table = append(table, probeRows()...)
	table = append(table, imageMappedRows(t)...)
	table = append(table, rejectionRows()...)
	// Router metadata is written in the Lampyr namespace, not the
	// Revision's: the table's check that every write lands in the key's
	// namespace does not apply (each row states its objects' namespaces).
	for i := range table {
		table[i].SkipNamespaceValidation = true
	}
	table.Test(t, makeFactory())
}

// rejectionRows: one row per unsupported field. Each Revision differs from
// the accepted rev() in exactly that field, is refused with the reason
// naming it, and gets nothing created.
func rejectionRows() rtesting.TableTest {
	var rows rtesting.TableTest
	for _, c := range rejectionCases() {
		want := rev(append(c.opts, rejected(c.reason, c.field, c.detail))...)
		rows = append(rows, rtesting.TableRow{
			Name:    "rejects " + c.name,
			Objects: []runtime.Object{rev(c.opts...)},
			Key:     key(),
			WantStatusUpdates: []clientgotesting.UpdateActionImpl{
				statusUpdate(want),
			},
			WantEvents: []string{refusalEvent(want, v1.RevisionConditionResourcesAvailable)},
		})
	}
	return rows
}

// refusedRev is the Revision whose grant was refused for reason.
func refusedRev(reason, msg string) *v1.Revision {
	return rev(withConditions(
		healthy(corev1.ConditionUnknown, contract.ReasonNotAdmitted.String(), MessageNotAdmitted),
		available(corev1.ConditionFalse, reason, msg),
		active(corev1.ConditionUnknown, reason, msg),
	), withContainerStatus("user-container", testImage))
}

func mirror(t *resources.Template, ips ...string) *discoveryv1.EndpointSlice {
	var eps []discoveryv1.Endpoint
	for _, ip := range ips {
		eps = append(eps, endpoint(ip, ptr.Bool(true)))
	}
	return resources.MakeEndpointSlice(rev(), t, []*discoveryv1.EndpointSlice{routerSlice("fiber-router", eps...)})
}

func verifying() *lampyrconfig.Config {
	l := testLampyr(lampyrconfig.BackendExternalName)
	l.VerifyArtifacts = true
	return l
}

var (
	missingMessage     = v1.RevisionContainerMissingMessage(testArtifact, "not found in the registry")
	checkingMessage    = fmt.Sprintf("Checking snapshot artifact %q in its registry.", testArtifact)
	queuedMessage      = fmt.Sprintf("Checking snapshot artifact %q in its registry, after other checks of this namespace.", testArtifact)
	unreachableMessage = fmt.Sprintf("Could not check snapshot artifact %q in its registry: %v; checking again.", testArtifact, unreachable)
)

// artifactMissing is the status of a Revision whose Home is ready and whose
// artifact the registry does not hold.
func artifactMissing() revOption {
	return func(r *v1.Revision) {
		withConditions(
			healthy(corev1.ConditionFalse, v1.ReasonContainerMissing, missingMessage),
			available(corev1.ConditionUnknown, v1.ReasonDeploying, MessageWaitingForRouting),
			active(corev1.ConditionUnknown, v1.ReasonContainerMissing, missingMessage),
		)(r)
		withContainerStatus("user-container", testImage)(r)
	}
}

// verifyingArtifact is the status of a Revision whose artifact check has
// not succeeded yet (msg), with ResourcesAvailable Unknown (reason, why).
func verifyingArtifact(msg, reason, why string) revOption {
	return func(r *v1.Revision) {
		withConditions(
			healthy(corev1.ConditionUnknown, contract.ReasonVerifyingArtifact.String(), msg),
			available(corev1.ConditionUnknown, reason, why),
			// Marked again, as markConditions does, so Ready says it.
			healthy(corev1.ConditionUnknown, contract.ReasonVerifyingArtifact.String(), msg),
			active(corev1.ConditionUnknown, contract.ReasonVerifyingArtifact.String(), msg),
		)(r)
		withContainerStatus("user-container", testImage)(r)
	}
}

// fakeRegistry answers from a set of present references, as a finished
// check would. (The real checks run against in-process registries in
// artifact_test.go.)
type fakeRegistry map[string]bool

func (f fakeRegistry) Get(_ types.NamespacedName, ref string) fetchq.Result[struct{}] {
	if f[ref] {
		return fetchq.Result[struct{}]{State: fetchq.Done}
	}
	return fetchq.Result[struct{}]{State: fetchq.Failed, RetryAt: time.Now().Add(time.Minute),
		Err: &ArtifactMissingError{Ref: ref, Detail: "not found in the registry"}}
}

// checkResult answers every check with one result.
type checkResult fetchq.Result[struct{}]

func (c checkResult) Get(types.NamespacedName, string) fetchq.Result[struct{}] {
	return fetchq.Result[struct{}](c)
}

var (
	checkPending     = checkResult{State: fetchq.Pending}
	checkQueued      = checkResult{State: fetchq.Pending, Ahead: 2}
	unreachable      = errors.New("Get \"https://registry.example/v2/\": dial tcp: connection refused")
	checkUnreachable = checkResult{State: fetchq.Failed, Err: unreachable, RetryAt: time.Now().Add(time.Minute)}
	checkRetrying    = checkResult{State: fetchq.Pending, Err: unreachable}
	checkRecheck     = checkResult{State: fetchq.Pending, Err: &ArtifactMissingError{Ref: testArtifact, Detail: "not found in the registry"}}
)

var invalidGrantErr = apierrs.NewInvalid(schema.GroupKind{Group: "fiberd.io", Kind: "CapacityGrant"}, testRevName,
	field.ErrorList{field.Invalid(field.NewPath("spec", "memoryPerFiber"), "1", "must be at least 1Mi")})

// refuseGrantCreate makes the API server refuse the grant as its CRD
// validation would.
func refuseGrantCreate(action clientgotesting.Action) (bool, runtime.Object, error) {
	if action.GetVerb() == "create" && action.GetResource().Resource == "capacitygrants" {
		return true, nil, invalidGrantErr
	}
	return false, nil, nil
}

const testSealed = "registry.example/lampyr/templates@sha256:4444444444444444444444444444444444444444444444444444444444444444"

// mapping is config-lampyr with testImage mapped to testArtifact.
func mapping() *lampyrconfig.Config {
	l := testLampyr(lampyrconfig.BackendExternalName)
	k, _ := lampyrconfig.ImageKey(testImage)
	l.ImageSnapshots = map[string]string{k: testArtifact}
	l.TemplateRepository = "registry.example/lampyr/templates"
	l.RegistryMirrors = []string{"registry.example=lampyr-registry:5000"}
	return l
}

// fakeSealer checks it is asked for exactly want and answers ref or err.
type fakeSealer struct {
	want SealRequest
	ref  string
	err  error
}

func (f *fakeSealer) Seal(_ context.Context, req SealRequest) (string, error) {
	if diff := cmp.Diff(f.want, req); diff != "" {
		return "", fmt.Errorf("unexpected seal request (-want +got):\n%s", diff)
	}
	return f.ref, f.err
}

// imageMappedRows: Revisions without Lampyr annotations whose image digest
// config-lampyr image-snapshots maps to a snapshot artifact.
func imageMappedRows(t *testing.T) rtesting.TableTest {
	plain := []revOption{withoutAnnotation(contract.SnapshotArtifactAnnotation), withoutAnnotation(contract.FiberdTemplateAnnotation)}
	mapped := accepted(func(t *resources.Template) { t.FiberdTemplate = testSealed; t.SealByController = true })
	req := SealRequest{
		Namespace: "lampyr-system", RevisionNamespace: testNS, Revision: testRevName, Snapshot: testArtifact,
		Execution:  fiberdv1alpha1.ExecutionPolicy{Mode: fiberdv1alpha1.ExecutionFresh},
		Repository: "registry.example/lampyr/templates", Mirrors: []string{"registry.example=lampyr-registry:5000"},
	}
	missing := v1.RevisionContainerMissingMessage(testArtifact, "not found in the registry")
	return rtesting.TableTest{{
		Name:          "image-mapped Revision: the controller seals its template and creates the grant with it",
		OtherTestData: map[string]interface{}{lampyrConfigKey: mapping(), sealerKey: &fakeSealer{want: req, ref: testSealed}},
		Objects:       []runtime.Object{rev(plain...)},
		Key:           key(),
		WantEvents: []string{
			rtesting.Eventf(corev1.EventTypeNormal, "TemplateSealed", "Sealed the fiberd template of image %s: %s", testImage, testSealed),
			grantCreatedEvent(),
			serviceCreatedEvent(corev1.ServiceTypeExternalName),
		},
		WantCreates: []runtime.Object{
			grant(mapped),
			service(mapped, lampyrconfig.BackendExternalName),
			metadata(mapped, "", false),
		},
		WantStatusUpdates: []clientgotesting.UpdateActionImpl{
			statusUpdate(rev(append(plain, waitingForGrant())...)),
		},
	}, {
		Name: "image-mapped Revision whose grant records its template: not sealed again",
		OtherTestData: map[string]interface{}{lampyrConfigKey: mapping(),
			sealerKey: &fakeSealer{err: errors.New("must not seal again")}},
		Objects: []runtime.Object{
			rev(append(plain, waitingForGrant())...),
			grant(mapped, grantReady),
			service(mapped, lampyrconfig.BackendExternalName),
			metadata(mapped, "", false),
		},
		Key: key(),
		WantUpdates: []clientgotesting.UpdateActionImpl{
			update(metadata(mapped, testHome, true)),
		},
		WantStatusUpdates: []clientgotesting.UpdateActionImpl{
			statusUpdate(rev(append(plain, ready())...)),
		},
	}, {
		Name: "image-mapped snapshot absent from the registry: ContainerMissing, no grant",
		OtherTestData: map[string]interface{}{lampyrConfigKey: mapping(),
			sealerKey: &fakeSealer{want: req, err: &ArtifactMissingError{Ref: testArtifact, Detail: "not found in the registry"}}},
		Objects: []runtime.Object{rev(plain...)},
		Key:     key(),
		WantEvents: []string{
			serviceCreatedEvent(corev1.ServiceTypeExternalName),
			rtesting.Eventf(corev1.EventTypeWarning, v1.ReasonContainerMissing, "ContainerHealthy: %s", missing),
		},
		WantCreates: []runtime.Object{
			service(accepted(func(t *resources.Template) { t.FiberdTemplate = ""; t.SealByController = true }), lampyrconfig.BackendExternalName),
			metadata(accepted(func(t *resources.Template) { t.FiberdTemplate = ""; t.SealByController = true }), "", false),
		},
		WantStatusUpdates: []clientgotesting.UpdateActionImpl{
			statusUpdate(rev(append(plain, withConditions(
				healthy(corev1.ConditionFalse, v1.ReasonContainerMissing, missing),
				// No grant exists: nothing could be sealed for it.
				available(corev1.ConditionUnknown, contract.ReasonWaitingForGrant.String(), MessageWaitingForGrant),
				active(corev1.ConditionUnknown, v1.ReasonContainerMissing, missing),
			), withContainerStatus("user-container", testImage))...)),
		},
	}, {
		Name: "image-mapped Revision, fleet key not published yet: retried",
		OtherTestData: map[string]interface{}{lampyrConfigKey: mapping(),
			sealerKey: &fakeSealer{want: req, err: errors.New("the fleet public key is not published yet")}},
		Objects: []runtime.Object{rev(append(plain, waitingForGrant())...)},
		Key:     key(),
		WantErr: true,
		WantEvents: []string{
			rtesting.Eventf(corev1.EventTypeWarning, "InternalError", "sealing the fiberd template of image-mapped Revision %s: the fleet public key is not published yet", testRevName),
		},
	}, {
		Name:          "annotations win over the mapping: the Revision runs what ly deploy sealed",
		OtherTestData: map[string]interface{}{lampyrConfigKey: mapping(), sealerKey: &fakeSealer{err: errors.New("must not seal")}},
		Objects:       []runtime.Object{rev()},
		Key:           key(),
		WantEvents: []string{
			grantCreatedEvent(),
			serviceCreatedEvent(corev1.ServiceTypeExternalName),
		},
		WantCreates: []runtime.Object{
			grant(accepted()),
			service(accepted(), lampyrconfig.BackendExternalName),
			metadata(accepted(), "", false),
		},
		WantStatusUpdates: []clientgotesting.UpdateActionImpl{
			statusUpdate(rev(waitingForGrant())),
		},
	}}
}

// fakeProber answers from a set of reachable addresses.
type fakeProber map[string]bool

func (f fakeProber) Reachable(_ context.Context, addr string) bool { return f[addr] }

// probeRows: in the endpointslice strategy a Revision is routable only once
// its backend Service's cluster IP accepts connections.
func probeRows() rtesting.TableTest {
	tmpl := accepted()
	with := func(p BackendProber) map[string]interface{} {
		return map[string]interface{}{lampyrConfigKey: testLampyr(lampyrconfig.BackendEndpointSlice), proberKey: p}
	}
	objects := func(r *v1.Revision, meta *corev1.ConfigMap) []runtime.Object {
		return []runtime.Object{
			r,
			grant(tmpl, grantReady),
			apiServerDefaults(service(tmpl, lampyrconfig.BackendEndpointSlice)),
			routerSlice("fiber-router-abcde", endpoint("10.244.0.11", ptr.Bool(true))),
			mirror(tmpl, "10.244.0.11"),
			meta,
		}
	}
	return rtesting.TableTest{{
		Name:          "endpointslice strategy: cluster IP not programmed yet, not routable, looked at again",
		OtherTestData: with(fakeProber{}),
		Objects:       objects(rev(waitingForGrant()), metadata(tmpl, "", false)),
		Key:           key(),
		WantErr:       true, // the requeue-after "error", which emits no event
		WantUpdates: []clientgotesting.UpdateActionImpl{
			update(metadata(tmpl, testHome, false)),
		},
		WantStatusUpdates: []clientgotesting.UpdateActionImpl{
			statusUpdate(rev(withConditions(
				healthy(corev1.ConditionTrue, "", ""),
				available(corev1.ConditionUnknown, v1.ReasonDeploying, MessageWaitingForBackend),
				active(corev1.ConditionUnknown, v1.ReasonDeploying, MessageWaitingForBackend),
			), withContainerStatus("user-container", testImage))),
		},
	}, {
		// backend-cluster-ip-probe false: the gateway dials the
		// EndpointSlice's addresses (Traefik's Gateway API provider), so
		// the Revision does not wait for kube-proxy.
		Name: "endpointslice strategy without the cluster IP probe: Ready before the cluster IP answers",
		OtherTestData: func() map[string]interface{} {
			d := with(fakeProber{})
			l := testLampyr(lampyrconfig.BackendEndpointSlice)
			l.BackendClusterIPProbe = false
			d[lampyrConfigKey] = l
			return d
		}(),
		Objects: objects(rev(waitingForGrant()), metadata(tmpl, "", false)),
		Key:     key(),
		WantUpdates: []clientgotesting.UpdateActionImpl{
			update(metadata(tmpl, testHome, true)),
		},
		WantStatusUpdates: []clientgotesting.UpdateActionImpl{
			statusUpdate(rev(ready())),
		},
	}, {
		Name:          "endpointslice strategy: cluster IP answers, Ready",
		OtherTestData: with(fakeProber{"10.96.0.42:80": true}),
		Objects:       objects(rev(waitingForGrant()), metadata(tmpl, "", false)),
		Key:           key(),
		WantUpdates: []clientgotesting.UpdateActionImpl{
			update(metadata(tmpl, testHome, true)),
		},
		WantStatusUpdates: []clientgotesting.UpdateActionImpl{
			statusUpdate(rev(ready())),
		},
	}}
}
