//go:build linux

// Package sockmap joins pairs of TCP sockets inside the kernel: whatever
// arrives on one is sent out of the other without waking any process. fiberd
// uses it for reuse-mode tunnels, so a request travels router -> fiber with
// no copy, no syscall and no context switch in fiberd.
//
// It is the BPF sockmap mechanism (BPF_MAP_TYPE_SOCKMAP with an SK_SKB
// stream-verdict program, as Cilium's socket-level proxying uses): each
// joined socket sits in a sockmap; a hash map maps each socket's cookie to
// its peer's slot; the verdict program looks the peer up and redirects the
// skb to the peer's egress. Sockets not in the hash map keep the normal path.
//
// Needs CAP_BPF and CAP_NET_ADMIN (fiberd runs privileged) and a kernel with
// CONFIG_BPF_STREAM_PARSER; New reports why when it cannot load, and fiberd
// then copies in user space.
package sockmap

import (
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"
)

// Splicer owns the maps and the attached verdict program.
type Splicer struct {
	socks *ebpf.Map // SOCKMAP: slot -> socket
	peers *ebpf.Map // HASH: socket cookie -> peer's slot
	prog  *ebpf.Program

	mu   sync.Mutex
	free []uint32
}

// New loads the program and maps for up to pairs joined pairs.
func New(pairs int) (*Splicer, error) {
	if pairs <= 0 {
		return nil, errors.New("sockmap: pairs must be > 0")
	}
	socks, err := ebpf.NewMap(&ebpf.MapSpec{Name: "lampyr_socks", Type: ebpf.SockMap, KeySize: 4, ValueSize: 4, MaxEntries: uint32(2 * pairs)})
	if err != nil {
		return nil, fmt.Errorf("sockmap: creating the socket map: %w", err)
	}
	peers, err := ebpf.NewMap(&ebpf.MapSpec{Name: "lampyr_peers", Type: ebpf.Hash, KeySize: 8, ValueSize: 4, MaxEntries: uint32(2 * pairs)})
	if err != nil {
		socks.Close()
		return nil, fmt.Errorf("sockmap: creating the peer map: %w", err)
	}
	const skPass = 1
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Name:    "lampyr_splice",
		Type:    ebpf.SkSKB,
		License: "Apache-2.0",
		Instructions: asm.Instructions{
			// r6 = skb
			asm.Mov.Reg(asm.R6, asm.R1),
			// cookie := bpf_get_socket_cookie(skb); *(fp-8) = cookie
			asm.FnGetSocketCookie.Call(),
			asm.StoreMem(asm.RFP, -8, asm.R0, asm.DWord),
			// slot := peers[cookie]
			asm.LoadMapPtr(asm.R1, peers.FD()),
			asm.Mov.Reg(asm.R2, asm.RFP),
			asm.Add.Imm(asm.R2, -8),
			asm.FnMapLookupElem.Call(),
			asm.JEq.Imm(asm.R0, 0, "pass"),
			asm.LoadMem(asm.R3, asm.R0, 0, asm.Word),
			// return bpf_sk_redirect_map(skb, socks, slot, 0 /* egress */)
			asm.Mov.Reg(asm.R1, asm.R6),
			asm.LoadMapPtr(asm.R2, socks.FD()),
			asm.Mov.Imm(asm.R4, 0),
			asm.FnSkRedirectMap.Call(),
			asm.Return(),
			// Not joined: the normal receive path.
			asm.Mov.Imm(asm.R0, skPass).WithSymbol("pass"),
			asm.Return(),
		},
	})
	if err != nil {
		socks.Close()
		peers.Close()
		return nil, fmt.Errorf("sockmap: loading the verdict program: %w", err)
	}
	if err := link.RawAttachProgram(link.RawAttachProgramOptions{Target: socks.FD(), Program: prog, Attach: ebpf.AttachSkSKBStreamVerdict}); err != nil {
		prog.Close()
		socks.Close()
		peers.Close()
		return nil, fmt.Errorf("sockmap: attaching the verdict program: %w", err)
	}
	s := &Splicer{socks: socks, peers: peers, prog: prog}
	for i := uint32(2 * pairs); i > 0; i-- {
		s.free = append(s.free, i-1)
	}
	return s, nil
}

// Close detaches and frees everything; joined sockets fall back to the
// normal path.
func (s *Splicer) Close() error {
	link.RawDetachProgram(link.RawDetachProgramOptions{Target: s.socks.FD(), Program: s.prog, Attach: ebpf.AttachSkSKBStreamVerdict})
	return errors.Join(s.prog.Close(), s.socks.Close(), s.peers.Close())
}

// Pair is two joined sockets.
type Pair struct {
	s       *Splicer
	slots   [2]uint32
	cookies [2]uint64
	conns   [2]*net.TCPConn
	once    sync.Once
}

// ErrFull means every slot is in use.
var ErrFull = errors.New("sockmap: all slots in use")

// Join makes bytes arriving on a leave through b and the other way round.
// Neither socket may have unread bytes: the kernel redirects what arrives
// from now on, not what already sits in a receive queue.
func (s *Splicer) Join(a, b *net.TCPConn) (*Pair, error) {
	p := &Pair{s: s, conns: [2]*net.TCPConn{a, b}}
	s.mu.Lock()
	if len(s.free) < 2 {
		s.mu.Unlock()
		return nil, ErrFull
	}
	n := len(s.free)
	p.slots = [2]uint32{s.free[n-1], s.free[n-2]}
	s.free = s.free[:n-2]
	s.mu.Unlock()
	for i, c := range p.conns {
		var fd int
		var serr error
		rc, err := c.SyscallConn()
		if err == nil {
			err = rc.Control(func(f uintptr) {
				fd = int(f)
				if serr = s.socks.Update(p.slots[i], uint32(fd), ebpf.UpdateAny); serr != nil {
					return
				}
				p.cookies[i], serr = unix.GetsockoptUint64(fd, unix.SOL_SOCKET, unix.SO_COOKIE)
			})
		}
		if err == nil {
			err = serr
		}
		if err != nil {
			p.Close()
			return nil, fmt.Errorf("sockmap: adding socket %d of the pair: %w", i, err)
		}
	}
	// Peers last: until both sockets are in the map, nothing is redirected.
	for i := range 2 {
		if err := s.peers.Update(p.cookies[i], p.slots[1-i], ebpf.UpdateAny); err != nil {
			p.Close()
			return nil, fmt.Errorf("sockmap: linking the pair: %w", err)
		}
	}
	return p, nil
}

// Close unjoins the pair (idempotent). It does not close the sockets.
func (p *Pair) Close() {
	p.once.Do(func() {
		for i := range 2 {
			if p.cookies[i] != 0 {
				p.s.peers.Delete(p.cookies[i])
			}
			p.s.socks.Delete(p.slots[i])
		}
		p.s.mu.Lock()
		p.s.free = append(p.s.free, p.slots[0], p.slots[1])
		p.s.mu.Unlock()
	})
}

// Idle is how long ago either socket last received data (TCP_INFO
// last_data_recv): the pair's bytes never reach user space, so this is how
// a caller sees activity.
func (p *Pair) Idle() (time.Duration, error) {
	idle := time.Duration(1<<63 - 1)
	for _, c := range p.conns {
		rc, err := c.SyscallConn()
		if err != nil {
			return 0, err
		}
		var info *unix.TCPInfo
		var ierr error
		if err := rc.Control(func(fd uintptr) { info, ierr = unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO) }); err != nil {
			return 0, err
		}
		if ierr != nil {
			return 0, ierr
		}
		idle = min(idle, time.Duration(info.Last_data_recv)*time.Millisecond)
	}
	return idle, nil
}

// Delivered reports whether everything the second socket received has been
// acknowledged by the first socket's peer, beyond base bytes the first
// socket sent by other means (a header written before the join, say). The
// kernel moves redirected bytes asynchronously: a socket that has seen its
// peer's end may still have bytes on their way out of the other, and a
// FIN or a close before they are out would lose them.
func (p *Pair) Delivered(base uint64) (bool, error) {
	var infos [2]*unix.TCPInfo
	for i, c := range p.conns {
		rc, err := c.SyscallConn()
		if err != nil {
			return false, err
		}
		var ierr error
		if err := rc.Control(func(fd uintptr) { infos[i], ierr = unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO) }); err != nil {
			return false, err
		}
		if ierr != nil {
			return false, ierr
		}
	}
	need := base + uint64(infos[1].Bytes_received)
	switch infos[1].State {
	case tcpCloseWait, tcpClosing, tcpLastAck, tcpTimeWait:
		need-- // the peer's FIN counts in bytes_received and is not redirected
	}
	return infos[0].Bytes_acked >= need, nil
}

// TCP states (include/net/tcp_states.h) after the peer's FIN arrived.
const (
	tcpTimeWait  = 6
	tcpCloseWait = 8
	tcpLastAck   = 9
	tcpClosing   = 11
)
