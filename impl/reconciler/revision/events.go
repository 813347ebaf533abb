package revision

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	"knative.dev/pkg/apis"
	"knative.dev/pkg/controller"
	v1 "knative.dev/serving/pkg/apis/serving/v1"
)

// recordEvent emits an Event on rev with the controller's recorder (the
// generated reconciler puts it in ctx), for what a person looking at
// `kubectl describe revision` needs to see: what was created for the
// Revision, and why it cannot run.
func recordEvent(ctx context.Context, rev *v1.Revision, eventType, reason, messageFormat string, args ...any) {
	controller.GetEventRecorder(ctx).Eventf(rev, eventType, reason, messageFormat, args...)
}

// failedConditions are the conditions whose turning False a person must
// hear about: the Revision will not serve until something changes.
var failedConditions = []apis.ConditionType{v1.RevisionConditionResourcesAvailable, v1.RevisionConditionContainerHealthy}

// conditionsBefore keeps the failed conditions' state before a reconcile.
func conditionsBefore(st *v1.RevisionStatus) map[apis.ConditionType]apis.Condition {
	out := map[apis.ConditionType]apis.Condition{}
	for _, t := range failedConditions {
		if c := st.GetCondition(t); c != nil {
			out[t] = *c
		}
	}
	return out
}

// recordRefusals emits a Warning for each of failedConditions that became
// False, or stayed False for another reason, in this reconcile: a grant
// refusal, a rejected template, a handler that exits. The Event's reason
// is the condition's; a condition that stays False for the same reason
// emits nothing again.
func recordRefusals(ctx context.Context, rev *v1.Revision, before map[apis.ConditionType]apis.Condition) {
	for _, t := range failedConditions {
		c := rev.Status.GetCondition(t)
		if !c.IsFalse() || c.Reason == v1.ReasonNotOwned {
			// NotOwned has its own Event per object (notOwnedBy).
			continue
		}
		if old, ok := before[t]; ok && old.IsFalse() && old.Reason == c.Reason {
			continue
		}
		recordEvent(ctx, rev, corev1.EventTypeWarning, c.Reason, "%s: %s", t, c.Message)
	}
}
