// Package trust holds, in its subpackages, the libraries on both sides of
// every trust boundary in Lampyr: the sealed template (seal), the signed
// grant (signedgrant), fiber-router's per-Home credential (routercred), the
// Home's TLS key fiber-router pins (homekey), the PEM encoding of their Ed25519 keys (edpem) and the fibers' egress policy
// (egresspolicy). The grant controller, the Revision reconciler,
// fiber-router, fiberd and ly import them; they import none of those
// (layering_test.go).
package trust
