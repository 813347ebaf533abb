//go:build !linux

package sockmap

import (
	"errors"
	"net"
	"time"
)

// Splicer is Linux-only; New always fails elsewhere.
type Splicer struct{}

// Pair is Linux-only.
type Pair struct{}

// ErrFull means every slot is in use.
var ErrFull = errors.New("sockmap: all slots in use")

// New fails: BPF sockmaps are a Linux facility.
func New(pairs int) (*Splicer, error) { return nil, errors.New("sockmap: Linux only") }

// Close does nothing.
func (s *Splicer) Close() error { return nil }

// Join fails.
func (s *Splicer) Join(a, b *net.TCPConn) (*Pair, error) {
	return nil, errors.New("sockmap: Linux only")
}

// Close does nothing.
func (p *Pair) Close() {}

// Idle reports nothing.
func (p *Pair) Idle() (time.Duration, error) { return 0, errors.New("sockmap: Linux only") }

// Delivered reports nothing.
func (p *Pair) Delivered(base uint64) (bool, error) { return false, errors.New("sockmap: Linux only") }
