package server

import (
	"bytes"
	"crypto/ed25519"
	"crypto/tls"
	"errors"
	"fmt"
	"os"

	"lampyr.dev/serving/impl/trust/homekey"
	"lampyr.dev/serving/impl/trust/signedgrant"
)

// loadTLSKey reads the Home key (Config.TLSKeyFile) and makes the
// certificate fiberd serves with, unless the key is unchanged. The Home
// Secret holds it for the Secret's life; a Secret made anew (a new Home)
// brings a new key, and its grant names that key.
func (s *Server) loadTLSKey() error {
	b, err := os.ReadFile(s.cfg.TLSKeyFile)
	if err != nil {
		return fmt.Errorf("home key (--tls-key-file): %w", err)
	}
	s.mu.Lock()
	same := bytes.Equal(b, s.tlsKeyPEM)
	s.mu.Unlock()
	if same {
		return nil
	}
	key, err := homekey.ParsePrivateKey(b)
	if err != nil {
		return fmt.Errorf("home key %s: %w", s.cfg.TLSKeyFile, err)
	}
	cert, err := homekey.Certificate(key, "fiberd")
	if err != nil {
		return err
	}
	fp := homekey.Fingerprint(key.Public().(ed25519.PublicKey))
	s.mu.Lock()
	s.tlsCert, s.tlsKeyPEM, s.tlsKeySHA256 = &cert, b, fp
	s.mu.Unlock()
	s.cfg.Logf("serving the API over TLS with home key %s…", fp[:16])
	return nil
}

// certificate is TLSConfig.GetCertificate's source.
func (s *Server) certificate() (*tls.Certificate, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.tlsCert == nil {
		return nil, errors.New("no home key loaded")
	}
	return s.tlsCert, nil
}

// checkHomeKey refuses a grant issued for another Home key than the one
// fiberd serves with: fiber-router would refuse every connection, and
// fiberd must not report ready under a key its grant does not bind. A
// grant that names no key comes from a grant controller that predates
// Home keys and is used as before.
func (s *Server) checkHomeKey(c signedgrant.Claims) error {
	if s.cfg.TLSKeyFile == "" || c.HomeKeySHA256 == "" {
		return nil
	}
	s.mu.Lock()
	have := s.tlsKeySHA256
	s.mu.Unlock()
	if c.HomeKeySHA256 != have {
		return fmt.Errorf("the grant names home key %s… but fiberd serves with %s… (%s): the Home Secret is being replaced; the next grant or key read settles it",
			c.HomeKeySHA256[:16], have[:min(16, len(have))], s.cfg.TLSKeyFile)
	}
	return nil
}
