//go:build linux

// Package netstack is a fiber's egress link: a TUN interface in the
// fiber's network namespace read by gVisor's user-space TCP/IP stack in
// fiberd, which serves the fiber's resolver (egress.Guard) and forwards
// the TCP connections the guard allows through its Dialer (package egress
// has the policy; package egress/proxy the tenant namespace's egress Pod).
package netstack

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"runtime"
	"sync"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/buffer"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/link/channel"
	"gvisor.dev/gvisor/pkg/tcpip/link/tun"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
	"gvisor.dev/gvisor/pkg/tcpip/transport/udp"
	"gvisor.dev/gvisor/pkg/waiter"

	"lampyr.dev/serving/impl/fiberd/egress"
	"lampyr.dev/serving/impl/trust/egresspolicy"
)

// LinkName is the fiber's egress interface.
const LinkName = "eth0"

// mtu of the point-to-point link.
const mtu = 1500

// connectTimeout bounds a forwarded connection's set-up: the first one of
// a namespace through its egress proxy may wait for the grant controller
// to start that Pod (up to 30 s) before the proxy dials.
const connectTimeout = 50 * time.Second

// Link is one fiber's egress: a TUN interface in the fiber's network
// namespace, read by a user-space TCP/IP stack (gVisor's netstack) in
// fiberd that serves the fiber's resolver and forwards allowed TCP
// connections through its Dialer (the namespace's egress proxy, or from
// the Home's network namespace).
type Link struct {
	guard *egress.Guard
	dial  egress.Dialer
	fd    int
	file  *os.File
	ep    *channel.Endpoint
	st    *stack.Stack
	udp   *gonet.UDPConn

	ctx    context.Context
	cancel context.CancelFunc
	conns  sync.WaitGroup
	once   sync.Once
	// mu guards closed: no forwarded connection starts once Close began.
	mu     sync.Mutex
	closed bool
}

// Attach gives the fiber whose network namespace is ns its egress link:
// the TUN interface LinkName (address egresspolicy.FiberAddr, default route) and the
// stack behind it. host is fiberd's own namespace, restored on the thread
// that entered ns. dial opens the allowed connections (nil:
// egress.DirectDial). The caller closes the Link when the fiber ends.
func Attach(ns, host netns.NsHandle, guard *egress.Guard, dial egress.Dialer) (*Link, error) {
	return attach(ns, host, guard, dial, false)
}

// AttachGateway is Attach for a fiber whose own network stack is not the
// host's (the gvisor backend: runsc's Sentry takes over the interface and
// refuses a default route without a gateway): LinkName gets
// egresspolicy.FiberAddr/30 and a default route via
// egresspolicy.ResolverAddr, which this link's stack answers for. guard
// nil gives a link that carries only DialFiber's connections: no
// resolver, and every connection the fiber opens is reset.
func AttachGateway(ns, host netns.NsHandle, guard *egress.Guard, dial egress.Dialer) (*Link, error) {
	return attach(ns, host, guard, dial, true)
}

func attach(ns, host netns.NsHandle, guard *egress.Guard, dial egress.Dialer, gateway bool) (*Link, error) {
	fd, err := openTUN(ns, host)
	if err != nil {
		return nil, err
	}
	if err := configure(ns, gateway); err != nil {
		unix.Close(fd)
		return nil, err
	}
	l := &Link{guard: guard, dial: dial, fd: fd}
	if l.dial == nil {
		l.dial = egress.DirectDial
	}
	l.ctx, l.cancel = context.WithCancel(context.Background())
	if err := l.start(); err != nil {
		l.Close()
		return nil, err
	}
	return l, nil
}

// openTUN creates the TUN interface inside ns (a TUN belongs to the
// network namespace of the thread that creates it) and returns its fd,
// non-blocking and close-on-exec, held by fiberd only.
func openTUN(ns, host netns.NsHandle) (int, error) {
	type result struct {
		fd  int
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		if err := netns.Set(ns); err != nil {
			runtime.UnlockOSThread()
			ch <- result{-1, fmt.Errorf("entering the fiber's network namespace: %w", err)}
			return
		}
		fd, err := tun.Open(LinkName)
		if rerr := netns.Set(host); rerr != nil {
			if err == nil {
				unix.Close(fd)
			}
			ch <- result{-1, fmt.Errorf("leaving the fiber's network namespace: %w", rerr)}
			return // the thread stays locked and dies with this goroutine
		}
		runtime.UnlockOSThread()
		if err != nil {
			ch <- result{-1, fmt.Errorf("creating the fiber's egress interface (is /dev/net/tun present in the Home?): %w", err)}
			return
		}
		unix.CloseOnExec(fd)
		if err := unix.SetNonblock(fd, true); err != nil {
			unix.Close(fd)
			ch <- result{-1, err}
			return
		}
		ch <- result{fd, nil}
	}()
	r := <-ch
	return r.fd, r.err
}

// configure gives LinkName its address and the fiber's default route:
// on-link (a /32 and a route without gateway), or with gateway through
// ResolverAddr on a /30.
func configure(ns netns.NsHandle, gateway bool) error {
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return fmt.Errorf("netlink in the fiber's namespace: %w", err)
	}
	defer h.Close()
	link, err := h.LinkByName(LinkName)
	if err != nil {
		return fmt.Errorf("finding %s: %w", LinkName, err)
	}
	bits := 32
	if gateway {
		bits = 30
	}
	addr := &netlink.Addr{IPNet: &net.IPNet{IP: egresspolicy.FiberAddr.AsSlice(), Mask: net.CIDRMask(bits, 32)}}
	if err := h.AddrAdd(link, addr); err != nil {
		return fmt.Errorf("address on %s: %w", LinkName, err)
	}
	if err := h.LinkSetMTU(link, mtu); err != nil {
		return fmt.Errorf("mtu of %s: %w", LinkName, err)
	}
	if err := h.LinkSetUp(link); err != nil {
		return fmt.Errorf("bringing up %s: %w", LinkName, err)
	}
	route := &netlink.Route{LinkIndex: link.Attrs().Index, Scope: netlink.SCOPE_LINK, Src: egresspolicy.FiberAddr.AsSlice()}
	if gateway {
		route = &netlink.Route{LinkIndex: link.Attrs().Index, Gw: egresspolicy.ResolverAddr.AsSlice()}
	}
	if err := h.RouteAdd(route); err != nil {
		return fmt.Errorf("default route via %s: %w", LinkName, err)
	}
	return nil
}

const nic tcpip.NICID = 1

func (l *Link) start() error {
	// The TUN is read and written through Go's poller, so Close ends the
	// reader at once (the TUN holds the fiber's network namespace alive
	// until its last descriptor closes).
	l.file = os.NewFile(uintptr(l.fd), "egress-tun")
	ep := channel.New(256, mtu, "")
	l.ep = ep
	l.st = stack.New(stack.Options{
		NetworkProtocols:   []stack.NetworkProtocolFactory{ipv4.NewProtocol},
		TransportProtocols: []stack.TransportProtocolFactory{tcp.NewProtocol, udp.NewProtocol},
	})
	if e := l.st.CreateNIC(nic, ep); e != nil {
		return fmt.Errorf("egress NIC: %s", e)
	}
	// Promiscuous: the stack takes a SYN for any destination (the
	// forwarder decides); spoofing: it answers as that destination.
	l.st.SetPromiscuousMode(nic, true)
	l.st.SetSpoofing(nic, true)
	if e := l.st.AddProtocolAddress(nic, tcpip.ProtocolAddress{Protocol: ipv4.ProtocolNumber, AddressWithPrefix: tcpip.AddrFrom4(egresspolicy.ResolverAddr.As4()).WithPrefix()}, stack.AddressProperties{}); e != nil {
		return fmt.Errorf("resolver address: %s", e)
	}
	l.st.SetRouteTable([]tcpip.Route{{Destination: header.IPv4EmptySubnet, NIC: nic}})
	// No TIME-WAIT. The stack is the active closer of a forwarded
	// connection whose destination closed first, so the fiber's side is
	// free at once and Linux may reuse its source port for the same
	// destination; gVisor hands a new SYN arriving in TIME-WAIT only to a
	// listening endpoint, never to the forwarder, and dropped it with
	// every retransmit for the 60 s default (a fiber's /call to one
	// Service hung 10 s about once in 3000 calls, both dial modes).
	// Linux accepts such a SYN; on this lossless point-to-point link
	// TIME-WAIT protects nothing.
	noTimeWait := tcpip.TCPTimeWaitTimeoutOption(0)
	if e := l.st.SetTransportProtocolOption(tcp.ProtocolNumber, &noTimeWait); e != nil {
		return fmt.Errorf("egress TIME-WAIT: %s", e)
	}
	fwd := tcp.NewForwarder(l.st, 0, 64, l.forward)
	l.st.SetTransportProtocolHandler(tcp.ProtocolNumber, fwd.HandlePacket)
	go l.readTUN()
	go l.writeTUN()
	if l.guard == nil {
		return nil
	}
	u, err := gonet.DialUDP(l.st, &tcpip.FullAddress{NIC: nic, Addr: tcpip.AddrFrom4(egresspolicy.ResolverAddr.As4()), Port: 53}, nil, ipv4.ProtocolNumber)
	if err != nil {
		return fmt.Errorf("resolver socket: %w", err)
	}
	l.udp = u
	go l.serveDNS()
	return nil
}

// readTUN hands every packet the fiber sends to the stack; only IPv4 is
// understood (anything else is dropped).
func (l *Link) readTUN() {
	buf := make([]byte, mtu+64)
	for {
		n, err := l.file.Read(buf)
		if err != nil {
			return
		}
		if n == 0 || buf[0]>>4 != 4 {
			continue
		}
		pkt := stack.NewPacketBuffer(stack.PacketBufferOptions{Payload: buffer.MakeWithData(append([]byte(nil), buf[:n]...))})
		l.ep.InjectInbound(ipv4.ProtocolNumber, pkt)
		pkt.DecRef()
	}
}

// writeTUN writes the stack's packets to the fiber.
func (l *Link) writeTUN() {
	for {
		pkt := l.ep.ReadContext(l.ctx)
		if pkt == nil {
			return
		}
		v := pkt.ToView()
		pkt.DecRef()
		_, err := l.file.Write(v.AsSlice())
		v.Release()
		if err != nil && l.ctx.Err() != nil {
			return
		}
	}
}

// serveDNS answers the fiber's queries one at a time (a lookup is bounded
// by its own timeout; a fiber flooding its resolver waits for itself).
func (l *Link) serveDNS() {
	buf := make([]byte, 1500)
	for {
		n, from, err := l.udp.ReadFrom(buf)
		if err != nil {
			return
		}
		ctx, cancel := context.WithTimeout(l.ctx, 5*time.Second)
		out := l.guard.Answer(ctx, buf[:n])
		cancel()
		if out != nil {
			l.udp.WriteTo(out, from)
		}
	}
}

// forward is the TCP forwarder: a connection to an address the fiber's
// resolver handed out and the policy allows is opened by the dialer
// (through the namespace's egress proxy, or from the Home) and spliced;
// anything else is reset.
func (l *Link) forward(r *tcp.ForwarderRequest) {
	id := r.ID()
	dst, ok := netip.AddrFromSlice(id.LocalAddress.AsSlice())
	if !ok || l.guard == nil || dst == egresspolicy.ResolverAddr || !l.guard.MayConnect(dst) {
		r.Complete(true)
		return
	}
	// The dialer is handed the address the guard allowed, never a name.
	ctx, cancel := context.WithTimeout(l.ctx, connectTimeout)
	out, err := l.dial(ctx, netip.AddrPortFrom(dst, id.LocalPort))
	cancel()
	if err != nil {
		r.Complete(true)
		return
	}
	var wq waiter.Queue
	ep, e := r.CreateEndpoint(&wq)
	if e != nil {
		out.Close()
		r.Complete(true)
		return
	}
	r.Complete(false)
	in := gonet.NewTCPConn(&wq, ep)
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		in.Close()
		out.Close()
		return
	}
	l.conns.Add(1)
	l.mu.Unlock()
	go func() {
		defer l.conns.Done()
		splice(l.ctx, in, out)
	}()
}

// DialFiber opens a connection from this link's stack to port on the
// fiber's address: the way in to a handler whose sockets live in a
// user-space kernel (gVisor's Sentry), not in the fiber's host network
// namespace. A refused connection (nothing listens yet) fails at once.
func (l *Link) DialFiber(ctx context.Context, port uint16) (net.Conn, error) {
	c, err := gonet.DialContextTCP(ctx, l.st, tcpip.FullAddress{NIC: nic, Addr: tcpip.AddrFrom4(egresspolicy.FiberAddr.As4()), Port: port}, ipv4.ProtocolNumber)
	if err != nil {
		return nil, err
	}
	return &fiberConn{c}, nil
}

// fiberConn is a connection into the fiber whose errors carry the errno a
// kernel socket's would. gonet reports the stack's errors as bare strings
// ("connection reset by peer"), so a caller that tells a handler which
// closed its side (errors.Is(err, syscall.ECONNRESET) or EPIPE: fiberd's
// answerFirstConn, which keeps the answer of a handler that did not read
// the body) could not tell it from a failure: on the gvisor backend that
// turned one answer in ten to a request with an unread 10 MiB body into a
// 502.
type fiberConn struct{ *gonet.TCPConn }

// stackErrnos maps the stack's error texts to errnos.
var stackErrnos = map[string]syscall.Errno{
	(&tcpip.ErrConnectionReset{}).String():   syscall.ECONNRESET,
	(&tcpip.ErrClosedForSend{}).String():     syscall.EPIPE,
	(&tcpip.ErrConnectionAborted{}).String(): syscall.ECONNABORTED,
	(&tcpip.ErrConnectionRefused{}).String(): syscall.ECONNREFUSED,
}

func errno(err error) error {
	var op *net.OpError
	if errors.As(err, &op) && op.Err != nil {
		if e, ok := stackErrnos[op.Err.Error()]; ok {
			c := *op
			c.Err = os.NewSyscallError(op.Op, e)
			return &c
		}
	}
	return err
}

func (c *fiberConn) Read(p []byte) (int, error) {
	n, err := c.TCPConn.Read(p)
	return n, errno(err)
}

func (c *fiberConn) Write(p []byte) (int, error) {
	n, err := c.TCPConn.Write(p)
	return n, errno(err)
}

// splice copies both ways with half-close, and ends both when the link
// closes.
func splice(ctx context.Context, a *gonet.TCPConn, b net.Conn) {
	stop := context.AfterFunc(ctx, func() { a.Close(); b.Close() })
	defer stop()
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		io.Copy(b, a)
		if c, ok := b.(interface{ CloseWrite() error }); ok {
			c.CloseWrite()
		}
	}()
	go func() {
		defer wg.Done()
		io.Copy(a, b)
		a.CloseWrite()
	}()
	wg.Wait()
	a.Close()
	b.Close()
}

// Close ends the link: every forwarded connection, the stack and the TUN
// (the interface disappears with its last descriptor).
func (l *Link) Close() error {
	l.once.Do(func() {
		l.mu.Lock()
		l.closed = true
		l.mu.Unlock()
		l.cancel()
		if l.udp != nil {
			l.udp.Close()
		}
		if l.st != nil {
			l.st.Close()
			l.st.Wait()
		}
		l.conns.Wait()
		if l.file != nil {
			l.file.Close()
		} else if l.fd >= 0 {
			unix.Close(l.fd)
		}
		if l.ep != nil {
			l.ep.Close()
		}
	})
	return nil
}
