// Package contract holds what Lampyr's components agree on: every name,
// label, annotation, GroupVersionResource, condition reason and wire-format
// constant shared between the Revision controller
// (impl/reconciler/revision), the grant controller (impl/grant),
// fiber-router (impl/router), fiberd (impl/fiberd) and ly (impl/ly).
//
// A value lives here when two of them must spell it the same way: one side
// writes it and another reads it (a Secret's name, a ConfigMap key, an
// annotation, a reason in a JSON answer or a condition). Changing one is a
// change of the contract between components, documented in
// docs/contracts.md, and every component ships with the new value at once.
//
// The package has no logic and imports nothing of Lampyr, so every
// component, ly and the test suites can import it without pulling in
// another component's dependencies.
package contract
