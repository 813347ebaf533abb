//go:build linux

package helper

// The fiber's system-call filter: the one reviewed file that says what a
// handler may ask of the kernel (docs/security.md, "Fiber sandbox").
//
// It is an allowlist in the spirit of Docker's default profile
// (moby/profiles/seccomp/default.json) for a process without
// capabilities: what is not listed fails with EPERM. It is stricter than
// Docker's where a Knative handler has no use for a call and the call is an
// attack surface (ptrace, process_vm_*, io_uring, personality changes,
// keyrings, socket families other than the four below).
//
// The helper installs it, together with no_new_privs, on the OS thread
// that forks the handler, just before the fork (after the user namespace,
// mounts, pivot_root and cgroup namespace are in place): the handler
// inherits both and can never lift them, and every process it starts
// inherits them again. Filters are built with github.com/elastic/go-seccomp-bpf
// (pure Go, no libseccomp): it checks the architecture first (a syscall
// made through another ABI, 32-bit int 0x80 or x32, is refused) and compiles
// each group below into a linear BPF program, hottest groups first.

import (
	"fmt"
	"runtime"
	"sync"
	"unsafe"

	seccomp "github.com/elastic/go-seccomp-bpf"
	"github.com/elastic/go-seccomp-bpf/arch"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// errnoENOSYS makes a call look absent, so a C library falls back to an
// older call (glibc's clone3 -> clone), as Docker's profile does.
const errnoENOSYS = seccomp.Action(unix.SECCOMP_RET_ERRNO | uint32(unix.ENOSYS))

// nsCloneFlags are the namespace flags of clone(2): a handler may start
// threads and processes, never new namespaces (Docker's mask 0x7E020000).
const nsCloneFlags = unix.CLONE_NEWNS | unix.CLONE_NEWCGROUP | unix.CLONE_NEWUTS | unix.CLONE_NEWIPC |
	unix.CLONE_NEWUSER | unix.CLONE_NEWPID | unix.CLONE_NEWNET

// socket types other than SOCK_STREAM (1) and SOCK_DGRAM (2) in the low
// bits of socket(2)'s type argument (SOCK_NONBLOCK 0x800 and SOCK_CLOEXEC
// 0x80000 are flags and stay allowed).
const (
	notStream = 0x7fe // type&0x7ff must be 1
	notDgram  = 0x7fd // type&0x7ff must be 2
)

// SeccompGroups is the profile. Each group says why it is there.
var SeccompGroups = []struct {
	Why   string
	Names []string
	Args  []seccomp.NameWithConditions
	// Action is Allow unless set.
	Action seccomp.Action
}{
	{
		Why: "the request path, first for speed: I/O on sockets, pipes and files, polling, timers, futexes",
		Names: []string{"read", "write", "readv", "writev", "pread64", "pwrite64", "preadv", "pwritev", "preadv2", "pwritev2",
			"epoll_wait", "epoll_pwait", "epoll_pwait2", "epoll_ctl", "futex", "futex_waitv", "nanosleep", "clock_nanosleep",
			"clock_gettime", "gettimeofday", "time", "sched_yield", "getpid", "gettid", "tgkill", "rt_sigreturn", "rt_sigprocmask",
			"accept", "accept4", "recvfrom", "recvmsg", "recvmmsg", "sendto", "sendmsg", "sendmmsg", "close", "close_range",
			"sendfile", "splice", "tee", "vmsplice", "copy_file_range", "poll", "ppoll", "select", "pselect6"},
	},
	{
		Why: "memory management of any runtime (Go, Node, Python, the JVM): mappings, protection, advice, membarrier",
		Names: []string{"mmap", "munmap", "mremap", "mprotect", "madvise", "brk", "mincore", "msync", "mlock", "mlock2",
			"munlock", "mlockall", "munlockall", "membarrier", "memfd_create", "remap_file_pages", "pkey_alloc", "pkey_free",
			"pkey_mprotect", "process_mrelease"},
	},
	{
		Why: "threads and processes without new namespaces (clone is allowed only without namespace flags, below)",
		Names: []string{"fork", "vfork", "execve", "execveat", "exit", "exit_group", "wait4", "waitid", "set_tid_address",
			"set_robust_list", "get_robust_list", "rseq", "arch_prctl", "prctl", "sched_getaffinity", "sched_setaffinity",
			"sched_getattr", "sched_setattr", "sched_getparam", "sched_setparam", "sched_getscheduler", "sched_setscheduler",
			"sched_get_priority_max", "sched_get_priority_min", "sched_rr_get_interval", "getpriority", "setpriority",
			"ioprio_get", "ioprio_set", "getcpu", "getrusage", "times", "sysinfo", "uname", "getrandom", "restart_syscall",
			"pidfd_open", "pidfd_send_signal", "modify_ldt", "get_thread_area", "set_thread_area", "alarm", "pause"},
	},
	{
		Why: "signals to the handler's own processes (the PID namespace holds nothing else it may signal)",
		Names: []string{"kill", "tkill", "rt_sigaction", "rt_sigpending", "rt_sigqueueinfo", "rt_tgsigqueueinfo",
			"rt_sigsuspend", "rt_sigtimedwait", "sigaltstack", "signalfd", "signalfd4", "getitimer", "setitimer",
			"timer_create", "timer_delete", "timer_getoverrun", "timer_gettime", "timer_settime", "timerfd_create",
			"timerfd_gettime", "timerfd_settime", "clock_getres", "eventfd", "eventfd2"},
	},
	{
		Why: "credentials: reading them, and the set* calls that only ever drop (the handler holds no capability)",
		Names: []string{"getuid", "geteuid", "getgid", "getegid", "getresuid", "getresgid", "getgroups", "getpgid", "getpgrp",
			"getppid", "getsid", "setsid", "setpgid", "setuid", "setgid", "setreuid", "setregid", "setresuid", "setresgid",
			"setfsuid", "setfsgid", "setgroups", "capget", "capset", "getrlimit", "setrlimit", "prlimit64", "umask"},
	},
	{
		Why: "files on the read-only root and the private /tmp (the mount table decides what is writable)",
		Names: []string{"open", "openat", "openat2", "creat", "stat", "fstat", "lstat", "newfstatat", "statx", "statfs", "fstatfs",
			"access", "faccessat", "faccessat2", "lseek", "getdents", "getdents64", "getcwd", "chdir", "fchdir", "readlink",
			"readlinkat", "mkdir", "mkdirat", "rmdir", "unlink", "unlinkat", "rename", "renameat", "renameat2", "link", "linkat",
			"symlink", "symlinkat", "chmod", "fchmod", "fchmodat", "chown", "fchown", "fchownat", "lchown", "truncate",
			"ftruncate", "fallocate", "fadvise64", "readahead", "fsync", "fdatasync", "sync", "syncfs", "sync_file_range",
			"flock", "fcntl", "dup", "dup2", "dup3", "pipe", "pipe2", "ioctl", "utime", "utimes", "utimensat", "futimesat",
			"mknod", "mknodat", "getxattr", "lgetxattr", "fgetxattr", "listxattr", "llistxattr", "flistxattr", "setxattr",
			"lsetxattr", "fsetxattr", "removexattr", "lremovexattr", "fremovexattr", "name_to_handle_at",
			"inotify_init", "inotify_init1", "inotify_add_watch", "inotify_rm_watch", "fanotify_mark", "epoll_create",
			"epoll_create1", "io_setup", "io_destroy", "io_submit", "io_cancel", "io_getevents", "io_pgetevents"},
	},
	{
		Why: "sockets the runtime contract needs: the handler's own listener and loopback connections (other socket calls; socket(2) itself is below)",
		Names: []string{"bind", "listen", "connect", "getsockname", "getpeername", "getsockopt", "setsockopt",
			"shutdown", "socketpair"},
	},
	{
		Why: "System V and POSIX IPC, private to the fiber's IPC namespace",
		Names: []string{"shmget", "shmat", "shmdt", "shmctl", "semget", "semop", "semtimedop", "semctl", "msgget", "msgsnd",
			"msgrcv", "msgctl", "mq_open", "mq_unlink", "mq_timedsend", "mq_timedreceive", "mq_notify", "mq_getsetattr"},
	},
	{
		Why:   "landlock lets a handler sandbox itself further; adjtimex only reads the clock without CAP_SYS_TIME",
		Names: []string{"landlock_create_ruleset", "landlock_add_rule", "landlock_restrict_self", "adjtimex", "seccomp"},
	},
	{
		Why: "clone only without namespace flags: threads and fork, never a new user, mount, network, PID, IPC, UTS or cgroup namespace",
		Args: []seccomp.NameWithConditions{{Name: "clone", Conditions: seccomp.ArgumentConditions{
			{Argument: 0, Operation: seccomp.BitsNotSet, Value: nsCloneFlags}}}},
	},
	{
		Why: "socket families: unix, IPv4 and IPv6 stream or datagram (no raw or packet sockets), netlink route only (interface lists, getaddrinfo)",
		Args: []seccomp.NameWithConditions{
			{Name: "socket", Conditions: seccomp.ArgumentConditions{{Argument: 0, Operation: seccomp.Equal, Value: unix.AF_UNIX}}},
			{Name: "socket", Conditions: seccomp.ArgumentConditions{{Argument: 0, Operation: seccomp.Equal, Value: unix.AF_INET}, {Argument: 1, Operation: seccomp.BitsNotSet, Value: notStream}}},
			{Name: "socket", Conditions: seccomp.ArgumentConditions{{Argument: 0, Operation: seccomp.Equal, Value: unix.AF_INET}, {Argument: 1, Operation: seccomp.BitsNotSet, Value: notDgram}}},
			{Name: "socket", Conditions: seccomp.ArgumentConditions{{Argument: 0, Operation: seccomp.Equal, Value: unix.AF_INET6}, {Argument: 1, Operation: seccomp.BitsNotSet, Value: notStream}}},
			{Name: "socket", Conditions: seccomp.ArgumentConditions{{Argument: 0, Operation: seccomp.Equal, Value: unix.AF_INET6}, {Argument: 1, Operation: seccomp.BitsNotSet, Value: notDgram}}},
			{Name: "socket", Conditions: seccomp.ArgumentConditions{{Argument: 0, Operation: seccomp.Equal, Value: unix.AF_NETLINK}, {Argument: 2, Operation: seccomp.Equal, Value: unix.NETLINK_ROUTE}}},
		},
	},
	{
		Why: "personality only to query it or for the flags runtimes set (Docker's list): no ADDR_NO_RANDOMIZE for an exploit",
		Args: []seccomp.NameWithConditions{
			{Name: "personality", Conditions: seccomp.ArgumentConditions{{Argument: 0, Operation: seccomp.Equal, Value: 0}}},
			{Name: "personality", Conditions: seccomp.ArgumentConditions{{Argument: 0, Operation: seccomp.Equal, Value: 8}}},
			{Name: "personality", Conditions: seccomp.ArgumentConditions{{Argument: 0, Operation: seccomp.Equal, Value: 0x20000}}},
			{Name: "personality", Conditions: seccomp.ArgumentConditions{{Argument: 0, Operation: seccomp.Equal, Value: 0x20008}}},
			{Name: "personality", Conditions: seccomp.ArgumentConditions{{Argument: 0, Operation: seccomp.Equal, Value: 0xffffffff}}},
		},
	},
	{
		Why:    "clone3 cannot be filtered by flags (they are in memory): report it absent so C libraries fall back to clone",
		Names:  []string{"clone3"},
		Action: errnoENOSYS,
	},
	// Everything else is refused with EPERM. Named here because each is a
	// known way out or across: new namespaces and mounts (unshare, setns,
	// mount, umount2, pivot_root, chroot, fsopen, fsmount, move_mount,
	// open_tree, mount_setattr), keyrings shared through the kernel
	// (keyctl, add_key, request_key), other processes' memory (ptrace,
	// process_vm_readv/writev, kcmp, pidfd_getfd), kernel code and
	// introspection (bpf, perf_event_open, init_module, finit_module,
	// delete_module, kexec_load, kexec_file_load, syslog, lookup_dcookie),
	// io_uring (a second system-call interface this filter cannot see),
	// userfaultfd (a classic exploit primitive), file handles across mounts
	// (open_by_handle_at), the machine (reboot, swapon, swapoff, acct,
	// quotactl, settimeofday, clock_settime, clock_adjtime, iopl, ioperm,
	// sethostname, setdomainname, vhangup), NUMA policy (mbind,
	// set_mempolicy) and fanotify_init.
}

var (
	filterOnce sync.Once
	filter     seccomp.Filter
	filterErr  error
)

// seccompFilter builds the fiber's filter for this architecture. Names the
// architecture does not have (arm64 has no open, stat, fork ...) are left
// out: there is nothing to allow.
func seccompFilter() (seccomp.Filter, error) {
	filterOnce.Do(func() {
		info, err := arch.GetInfo("")
		if err != nil {
			filterErr = fmt.Errorf("seccomp: %w", err)
			return
		}
		p := seccomp.Policy{DefaultAction: seccomp.ActionErrno}
		for _, g := range SeccompGroups {
			sg := seccomp.SyscallGroup{Action: g.Action}
			if sg.Action == 0 {
				sg.Action = seccomp.ActionAllow
			}
			for _, n := range g.Names {
				if _, ok := info.SyscallNames[n]; ok {
					sg.Names = append(sg.Names, n)
				}
			}
			for _, a := range g.Args {
				if _, ok := info.SyscallNames[a.Name]; ok {
					sg.NamesWithCondtions = append(sg.NamesWithCondtions, a)
				}
			}
			p.Syscalls = append(p.Syscalls, sg)
		}
		// no_new_privs is set by the helper itself, on the same thread,
		// before the filter (LoadFilter would set it too).
		filter = seccomp.Filter{NoNewPrivs: true, Policy: p}
	})
	return filter, filterErr
}

// seccompProgram assembles the fiber's filter into the BPF program the
// kernel takes (before the spec: about half a millisecond of a start).
func seccompProgram() (*unix.SockFprog, error) {
	f, err := seccompFilter()
	if err != nil {
		return nil, err
	}
	insts, err := f.Policy.Assemble()
	if err != nil {
		return nil, fmt.Errorf("seccomp profile: assembling the policy: %w", err)
	}
	raw, err := bpf.Assemble(insts)
	if err != nil {
		return nil, fmt.Errorf("seccomp profile: assembling BPF: %w", err)
	}
	prog := make([]unix.SockFilter, len(raw))
	for i, in := range raw {
		prog[i] = unix.SockFilter{Code: in.Op, Jt: in.Jt, Jf: in.Jf, K: in.K}
	}
	return &unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}, nil
}

// loadSeccomp installs prog (seccompProgram) on the calling OS thread only
// (no TSYNC: the helper's other threads stay unfiltered), as
// go-seccomp-bpf's LoadFilter does with an assembled program. The caller
// must have set no_new_privs, be locked to its thread and fork the handler
// from it.
func loadSeccomp(prog *unix.SockFprog) error {
	if _, _, e := unix.RawSyscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, 0, uintptr(unsafe.Pointer(prog))); e != 0 {
		return fmt.Errorf("seccomp profile: loading the filter: %w", e)
	}
	runtime.KeepAlive(prog)
	return nil
}
