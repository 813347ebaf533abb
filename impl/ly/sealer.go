package ly

import (
	"encoding/base64"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/user"
	"path/filepath"
	"strings"

	"lampyr.dev/serving/impl/trust/seal"
)

// Where `ly` keeps its sealer identity (docs/security.md "Keys and their
// rotation"): the Ed25519 key it signs templates with.
const (
	// SealerKeyEnv names a sealer key file; the --sealer-key flag wins.
	SealerKeyEnv = "LAMPYR_SEALER_KEY"
	// sealerKeyFile is the key's file below $XDG_CONFIG_HOME/lampyr (or
	// ~/.config/lampyr).
	sealerKeyFile = "sealer.pem"
)

// Sealer is this `ly`'s sealer identity.
type Sealer struct {
	Key *seal.SealerKey
	// Path is the key's file.
	Path string
	// Created is true when LoadSealer made the key just now.
	Created bool
	// Warning is set when the key file is readable by others than its owner.
	Warning string
}

// KeyID is the sealer's key id (what a sealed template's header names).
func (s *Sealer) KeyID() string { return s.Key.KeyID() }

// PublicKey is the base64 of the sealer's public key, the form
// `ly cluster authorize-sealer --public-key` takes.
func (s *Sealer) PublicKey() string { return base64.StdEncoding.EncodeToString(s.Key.Public()) }

// AuthorizeCommand is what an administrator runs to let this identity seal
// templates for namespaces ("*": every namespace).
func (s *Sealer) AuthorizeCommand(name string, namespaces ...string) string {
	ns := strings.Join(namespaces, ",")
	if ns == seal.AllNamespaces {
		ns = "'*'"
	}
	return fmt.Sprintf("ly cluster authorize-sealer %s --public-key %s --namespaces %s", name, s.PublicKey(), ns)
}

// CreatedMessage is the one line printed when the identity was created.
func (s *Sealer) CreatedMessage(namespace string) string {
	return fmt.Sprintf("created sealer identity %s (key id %s); until an administrator runs `%s`, the cluster refuses templates it seals",
		s.Path, s.KeyID(), s.AuthorizeCommand(DefaultSealerName(), namespace))
}

// SealerKeyPath is the sealer key file: flag (--sealer-key) if set, else
// $LAMPYR_SEALER_KEY, else $XDG_CONFIG_HOME/lampyr/sealer.pem, else
// ~/.config/lampyr/sealer.pem.
func SealerKeyPath(flag string) (string, error) {
	if flag != "" {
		return flag, nil
	}
	if p := os.Getenv(SealerKeyEnv); p != "" {
		return p, nil
	}
	// XDG: a relative $XDG_CONFIG_HOME is invalid and ignored.
	if dir := os.Getenv("XDG_CONFIG_HOME"); filepath.IsAbs(dir) {
		return filepath.Join(dir, "lampyr", sealerKeyFile), nil
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return "", fmt.Errorf("no home directory for the sealer key (%v): pass --sealer-key FILE or set %s", err, SealerKeyEnv)
	}
	return filepath.Join(home, ".config", "lampyr", sealerKeyFile), nil
}

// LoadSealer reads the sealer key at path. A missing key is created (mode
// 0600, its directory 0700) when create is set; otherwise LoadSealer returns
// an error satisfying errors.Is(err, fs.ErrNotExist).
func LoadSealer(path string, create bool) (*Sealer, error) {
	s := &Sealer{Path: path}
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) && create {
		if err := createSealerKey(path); err != nil {
			return nil, err
		}
		s.Created = true
		b, err = os.ReadFile(path)
	}
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("sealer key %s: %w (`ly sealer show` creates it)", path, err)
		}
		return nil, fmt.Errorf("sealer key %s: %w", path, err)
	}
	if s.Key, err = seal.ParseSealerKeyPEM(b); err != nil {
		return nil, fmt.Errorf("sealer key %s: %w (pass another file with --sealer-key, or move this one away to have a new identity created)", path, err)
	}
	if fi, err := os.Stat(path); err == nil && fi.Mode().Perm()&0o077 != 0 {
		s.Warning = fmt.Sprintf("sealer key %s is readable by others (mode %04o): anyone who reads it can seal templates as you; chmod 600 %s", path, fi.Mode().Perm(), path)
	}
	return s, nil
}

// createSealerKey writes a new key to path without ever replacing one: the
// key is written to a temporary file that is then linked into place, so a
// concurrent `ly` either wins or reads the winner's complete key.
func createSealerKey(path string) error {
	k, err := seal.GenerateSealerKey()
	if err != nil {
		return err
	}
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("creating the sealer key's directory: %w (pass --sealer-key FILE or set %s)", err, SealerKeyEnv)
	}
	tmp, err := os.CreateTemp(dir, ".sealer-*.pem")
	if err != nil {
		return fmt.Errorf("creating the sealer key in %s: %w", dir, err)
	}
	defer os.Remove(tmp.Name())
	// CreateTemp makes the file 0600.
	_, err = tmp.Write(k.MarshalPEM())
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("writing the sealer key: %w", err)
	}
	if err := os.Link(tmp.Name(), path); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("creating sealer key %s: %w", path, err)
	}
	return nil
}

// DefaultSealerName is the identity name suggested for this machine's `ly`:
// <user>-<host>, as a ConfigMap key.
func DefaultSealerName() string {
	name := "ly"
	if u, err := user.Current(); err == nil && u.Username != "" {
		name = u.Username
	} else if v := os.Getenv("USER"); v != "" {
		name = v
	}
	if h, err := os.Hostname(); err == nil && h != "" {
		h, _, _ = strings.Cut(h, ".")
		name += "-" + h
	}
	return sanitizeKey(name)
}

// sanitizeKey makes s a lower-case ConfigMap key of [a-z0-9-.].
func sanitizeKey(s string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(s) {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '-', r == '.':
			b.WriteRune(r)
		default:
			b.WriteByte('-')
		}
	}
	out := strings.Trim(b.String(), "-.")
	if out == "" {
		return "ly"
	}
	return out
}
