// Package edpem encodes Ed25519 keys as PEM: private keys as PKCS#8
// ("PRIVATE KEY"), public keys as PKIX ("PUBLIC KEY"). The grant signing key
// (impl/fiberd/signedgrant) and the router key (impl/fiberd/routercred) are
// both kept this way; what differs is only what the errors call the key.
package edpem

import (
	"crypto/ed25519"
	"crypto/x509"
	"encoding/pem"
	"fmt"
)

// PEM block types.
const (
	PrivateKeyType = "PRIVATE KEY"
	PublicKeyType  = "PUBLIC KEY"
)

// MarshalPrivateKey encodes k as PKCS#8 PEM.
func MarshalPrivateKey(k ed25519.PrivateKey) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: PrivateKeyType, Bytes: der}), nil
}

// MarshalPublicKey encodes k as PKIX PEM.
func MarshalPublicKey(k ed25519.PublicKey) ([]byte, error) {
	der, err := x509.MarshalPKIXPublicKey(k)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: PublicKeyType, Bytes: der}), nil
}

// ParsePrivateKey decodes the first PEM block of data as a PKCS#8 Ed25519
// key; errors start with what (e.g. "router key").
func ParsePrivateKey(what string, data []byte) (ed25519.PrivateKey, error) {
	blk, _ := pem.Decode(data)
	if blk == nil || blk.Type != PrivateKeyType {
		return nil, fmt.Errorf("%s: want a PEM %q block (PKCS#8 Ed25519)", what, PrivateKeyType)
	}
	k, err := x509.ParsePKCS8PrivateKey(blk.Bytes)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	ek, ok := k.(ed25519.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("%s is %T; want Ed25519", what, k)
	}
	return ek, nil
}

// ParsePublicKeys decodes every PEM block of data as a PKIX Ed25519 public
// key (at least one); errors start with what.
func ParsePublicKeys(what string, data []byte) ([]ed25519.PublicKey, error) {
	var out []ed25519.PublicKey
	for {
		var blk *pem.Block
		blk, data = pem.Decode(data)
		if blk == nil {
			break
		}
		if blk.Type != PublicKeyType {
			return nil, fmt.Errorf("%s: PEM block %q, want %q (PKIX Ed25519)", what, blk.Type, PublicKeyType)
		}
		k, err := x509.ParsePKIXPublicKey(blk.Bytes)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", what, err)
		}
		ek, ok := k.(ed25519.PublicKey)
		if !ok {
			return nil, fmt.Errorf("%s is %T; want Ed25519", what, k)
		}
		out = append(out, ek)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s: no PEM %q block found", what, PublicKeyType)
	}
	return out, nil
}
