//! `perf_event_open(2)`, its ioctls and the ring-buffer control page.
//!
//! Everything here is a thin, safe wrapper: callers (`perf::sampler`, `perf::ring`) never see a
//! raw pointer. The ring's data area is only ever *copied out of* (never borrowed as a slice),
//! because the kernel writes to the part of it that lies outside `[data_tail, data_head)`.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};

use perf_event_open_sys::bindings as pb;

use crate::perf::records::USER_REGS_MASK;
use crate::sys::time::PERF_CLOCK_ID;
pub use pb::{
    PERF_COUNT_HW_BRANCH_MISSES, PERF_COUNT_HW_CACHE_MISSES, PERF_COUNT_HW_CPU_CYCLES,
    PERF_COUNT_HW_INSTRUCTIONS, PERF_COUNT_SW_CONTEXT_SWITCHES, PERF_COUNT_SW_CPU_CLOCK,
    PERF_COUNT_SW_DUMMY, PERF_COUNT_SW_PAGE_FAULTS, PERF_COUNT_SW_TASK_CLOCK, PERF_RECORD_CGROUP,
    PERF_RECORD_COMM, PERF_RECORD_EXIT, PERF_RECORD_FORK, PERF_RECORD_LOST,
    PERF_RECORD_LOST_SAMPLES, PERF_RECORD_MISC_COMM_EXEC, PERF_RECORD_MISC_MMAP_BUILD_ID,
    PERF_RECORD_MISC_SWITCH_OUT, PERF_RECORD_MISC_SWITCH_OUT_PREEMPT, PERF_RECORD_MMAP2,
    PERF_RECORD_SAMPLE, PERF_RECORD_SWITCH_CPU_WIDE, PERF_RECORD_THROTTLE, PERF_RECORD_UNTHROTTLE,
    PERF_TYPE_HARDWARE, PERF_TYPE_RAW, PERF_TYPE_SOFTWARE, PERF_TYPE_TRACEPOINT,
};

/// `misc & PERF_RECORD_MISC_CPUMODE_MASK == PERF_RECORD_MISC_KERNEL`: sample taken in kernel mode.
pub const MISC_CPUMODE_MASK: u16 = pb::PERF_RECORD_MISC_CPUMODE_MASK as u16;
pub const MISC_KERNEL: u16 = pb::PERF_RECORD_MISC_KERNEL as u16;

/// The sample layout every event of the daemon uses (records are parsed by `perf::ring`
/// knowing exactly this layout): IDENTIFIER, IP, TID, TIME, CPU. No PERIOD: the sampler stamps
/// each sample with the period it set (for clock events the field keeps the open-time period),
/// and without it a record is 48 bytes, not 56, fewer ring lines to read per sample.
pub const SAMPLE_TYPE: u64 = (pb::PERF_SAMPLE_IDENTIFIER
    | pb::PERF_SAMPLE_IP
    | pb::PERF_SAMPLE_TID
    | pb::PERF_SAMPLE_TIME
    | pb::PERF_SAMPLE_CPU) as u64;
/// Size of a `PERF_RECORD_SAMPLE` with [`SAMPLE_TYPE`]: header + 5 u64.
pub const SAMPLE_RECORD_SIZE: usize = 8 + 5 * 8;
/// Size of the `sample_id` trailer of non-sample records (`sample_id_all` with [`SAMPLE_TYPE`]):
/// TID, TIME, CPU, IDENTIFIER.
pub const SAMPLE_ID_TRAILER: usize = 4 * 8;

/// What to open; turned into a `perf_event_attr`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AttrSpec {
    pub perf_type: u32,
    pub config: u64,
    pub period: u64,
    /// Ask for side-band records (mmap2, comm, `comm_exec`, task) on this event.
    pub sideband: bool,
    /// Ask for build-ids in MMAP2 (kernel >= 5.12); only with `sideband`.
    pub build_id: bool,
    /// Wake poll(2) once this many bytes are in the ring (0: default, one page).
    pub wakeup_watermark: u32,
    /// Add `PERF_SAMPLE_CGROUP` to samples (kernel >= 5.7) and, with `sideband`, ask for
    /// `PERF_RECORD_CGROUP`. Every event sharing a ring must agree.
    pub cgroup: bool,
    /// Ask for `PERF_SAMPLE_CALLCHAIN` of at most this many frames (0: no callchain). Every
    /// event sharing a ring must agree.
    pub max_stack: u16,
    /// `callchains = "dwarf"`: copy this many bytes of user stack and the user bp, sp, ip
    /// with each sample, and keep the callchain to kernel frames (0: no copy). Every event
    /// sharing a ring must agree.
    pub user_stack: u32,
    /// Ask for `PERF_RECORD_SWITCH_CPU_WIDE` records (`attr.context_switch`): the off-CPU
    /// source's fallback (`crate::offcpu`) pairs them to time each thread's waits.
    pub context_switch: bool,
    /// The off-CPU source's lean layout: samples are TID, TIME (then CALLCHAIN and RAW if
    /// asked), the `sample_id` trailer TID, TIME. For an event alone in its rings.
    pub lean: bool,
    /// Add `PERF_SAMPLE_RAW` (a tracepoint's fields) to samples.
    pub raw: bool,
    /// Ask for `PERF_RECORD_EXIT` (and FORK) records (`attr.task`) without the other
    /// side-band records.
    pub exits: bool,
}

fn make_attr(spec: &AttrSpec) -> pb::perf_event_attr {
    let mut attr = pb::perf_event_attr {
        type_: spec.perf_type,
        size: std::mem::size_of::<pb::perf_event_attr>() as u32,
        config: spec.config,
        sample_type: if spec.cgroup {
            SAMPLE_TYPE | pb::PERF_SAMPLE_CGROUP as u64
        } else {
            SAMPLE_TYPE
        },
        read_format: (pb::PERF_FORMAT_TOTAL_TIME_ENABLED | pb::PERF_FORMAT_TOTAL_TIME_RUNNING)
            as u64,
        clockid: PERF_CLOCK_ID,
        ..Default::default()
    };
    attr.__bindgen_anon_1.sample_period = spec.period;
    if spec.max_stack > 0 {
        // Kernel and user frames; user frames through frame pointers (the kernel's only
        // user unwinder), so code built without them yields truncated stacks.
        attr.sample_type |= pb::PERF_SAMPLE_CALLCHAIN as u64;
        attr.sample_max_stack = spec.max_stack;
    }
    if spec.user_stack > 0 {
        // The user part is unwound by dcpid from the copy (perf/dwarf.rs): the kernel's
        // frame-pointer walk of user frames would only duplicate or contradict it.
        attr.sample_type |= (pb::PERF_SAMPLE_REGS_USER | pb::PERF_SAMPLE_STACK_USER) as u64;
        attr.sample_regs_user = USER_REGS_MASK;
        attr.sample_stack_user = spec.user_stack;
        attr.set_exclude_callchain_user(1);
    }
    attr.set_disabled(1);
    attr.set_sample_id_all(1);
    attr.set_use_clockid(1);
    if spec.wakeup_watermark > 0 {
        attr.set_watermark(1);
        attr.__bindgen_anon_2.wakeup_watermark = spec.wakeup_watermark;
    }
    if spec.context_switch {
        attr.set_context_switch(1);
    }
    if spec.exits {
        // A thread that exits while off CPU never switches in: its exit record ends the wait.
        attr.set_task(1);
    }
    if spec.raw {
        attr.sample_type |= pb::PERF_SAMPLE_RAW as u64;
    }
    if spec.lean {
        // The off-CPU source's events are alone in their rings and read only the thread, the
        // time and the chain or the raw fields (`crate::offcpu`'s layouts): without
        // IDENTIFIER, IP and CPU the kernel writes 24 bytes less per sample and 16 less per
        // other record, which the kernel and the reader pay at every switch.
        attr.sample_type &=
            !((pb::PERF_SAMPLE_IDENTIFIER | pb::PERF_SAMPLE_IP | pb::PERF_SAMPLE_CPU) as u64);
    }
    if spec.sideband {
        // The kernel counts mmap listeners by `attr.mmap` only; `mmap2` selects the format.
        attr.set_mmap(1);
        attr.set_mmap2(1);
        attr.set_comm(1);
        attr.set_comm_exec(1);
        attr.set_task(1);
        if spec.build_id {
            attr.set_build_id(1);
        }
        if spec.cgroup {
            attr.set_cgroup(1);
        }
    }
    attr
}

fn last_errno() -> io::Error {
    io::Error::last_os_error()
}

/// An open perf event (one counter on one CPU).
#[derive(Debug)]
pub struct PerfFd {
    fd: OwnedFd,
}

impl AsRawFd for PerfFd {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

/// Counter value and the times it was enabled and running (for multiplex scaling).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CounterTimes {
    pub value: u64,
    pub time_enabled: u64,
    pub time_running: u64,
}

impl PerfFd {
    /// `perf_event_open(attr, pid = -1, cpu, group_fd = -1, FD_CLOEXEC)`: system-wide on `cpu`.
    pub fn open(spec: &AttrSpec, cpu: u32) -> io::Result<Self> {
        let mut attr = make_attr(spec);
        let cpu = libc::c_int::try_from(cpu)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "cpu number too large"))?;
        // SAFETY: `attr` is a fully initialised perf_event_attr whose `size` field matches the
        // struct we pass; the kernel only reads it (and may write `size` back on E2BIG).
        let fd = unsafe {
            libc::syscall(
                libc::SYS_perf_event_open,
                &mut attr as *mut pb::perf_event_attr,
                -1_i32, // pid_t: any process
                cpu,
                -1_i32, // group fd: none
                pb::PERF_FLAG_FD_CLOEXEC as libc::c_ulong,
            )
        };
        if fd < 0 {
            return Err(last_errno());
        }
        // SAFETY: the syscall returned a new file descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd as RawFd) };
        Ok(Self { fd })
    }

    fn ioctl_arg(&self, request: u32, arg: libc::c_ulong) -> io::Result<()> {
        // SAFETY: `self.fd` is a valid perf event fd; `request` is a perf ioctl whose argument
        // is an integer (ENABLE, DISABLE, SET_OUTPUT), passed by value.
        let rc = unsafe { libc::ioctl(self.fd.as_raw_fd(), request as libc::c_ulong, arg) };
        if rc < 0 {
            Err(last_errno())
        } else {
            Ok(())
        }
    }

    pub fn enable(&self) -> io::Result<()> {
        self.ioctl_arg(pb::ENABLE, 0)
    }

    pub fn disable(&self) -> io::Result<()> {
        self.ioctl_arg(pb::DISABLE, 0)
    }

    /// A tracepoint event's kernel-side filter (`PERF_EVENT_IOC_SET_FILTER`, the ftrace
    /// filter syntax): records that do not match are never written.
    pub fn set_filter(&self, filter: &std::ffi::CStr) -> io::Result<()> {
        // SAFETY: PERF_EVENT_IOC_SET_FILTER reads a NUL-terminated string through the pointer
        // (`strndup_user`), which `filter` is, alive for the call.
        let rc = unsafe {
            libc::ioctl(self.fd.as_raw_fd(), pb::SET_FILTER as libc::c_ulong, filter.as_ptr())
        };
        if rc < 0 {
            Err(last_errno())
        } else {
            Ok(())
        }
    }

    /// Send this event's records to `target`'s ring (same CPU, same clock).
    pub fn set_output(&self, target: &Self) -> io::Result<()> {
        self.ioctl_arg(pb::SET_OUTPUT, target.fd.as_raw_fd() as libc::c_ulong)
    }

    /// The kernel's id of this event (the IDENTIFIER field of its records).
    pub fn id(&self) -> io::Result<u64> {
        let mut id: u64 = 0;
        // SAFETY: PERF_EVENT_IOC_ID writes one u64 through the pointer, which points to `id`.
        let rc = unsafe {
            libc::ioctl(self.fd.as_raw_fd(), pb::ID as libc::c_ulong, &mut id as *mut u64)
        };
        if rc < 0 {
            Err(last_errno())
        } else {
            Ok(id)
        }
    }

    /// Set the overflow period. Restarts the timer phase of software clock events.
    pub fn set_period(&self, period: u64) -> io::Result<()> {
        let p: u64 = period;
        // SAFETY: PERF_EVENT_IOC_PERIOD reads one u64 through the pointer (the kernel's
        // `copy_from_user(&value, (u64 __user *)arg, ...)`), which points to `p`.
        let rc = unsafe {
            libc::ioctl(self.fd.as_raw_fd(), pb::PERIOD as libc::c_ulong, &p as *const u64)
        };
        if rc < 0 {
            Err(last_errno())
        } else {
            Ok(())
        }
    }

    /// read(2) the counter with `TOTAL_TIME_ENABLED` | `TOTAL_TIME_RUNNING`.
    pub fn read_times(&self) -> io::Result<CounterTimes> {
        let mut buf = [0u64; 3];
        // SAFETY: `buf` is 24 writable bytes, exactly what our read_format produces.
        let n = unsafe {
            libc::read(
                self.fd.as_raw_fd(),
                buf.as_mut_ptr() as *mut libc::c_void,
                std::mem::size_of_val(&buf),
            )
        };
        if n < 0 {
            return Err(last_errno());
        }
        if n as usize != std::mem::size_of_val(&buf) {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("short read of perf counter: {n} bytes"),
            ));
        }
        Ok(CounterTimes { value: buf[0], time_enabled: buf[1], time_running: buf[2] })
    }
}

/// System page size.
pub fn page_size() -> usize {
    // SAFETY: sysconf has no memory-safety preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if n <= 0 {
        4096
    } else {
        n as usize
    }
}

/// The mmap'ed ring of one perf event: control page + `2^n` data pages.
#[derive(Debug)]
pub struct RingMap {
    map: memmap2::MmapRaw,
    data_offset: usize,
    data_size: usize,
}

impl RingMap {
    /// Map `1 + data_pages` pages of `fd` (`data_pages` must be a power of two).
    pub fn new(fd: &PerfFd, data_pages: usize) -> io::Result<Self> {
        let ps = page_size();
        let len = data_pages
            .checked_add(1)
            .and_then(|n| n.checked_mul(ps))
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "ring too large"))?;
        let map = memmap2::MmapOptions::new().len(len).map_raw(fd.fd.as_raw_fd())?;
        let page = map.as_mut_ptr() as *const pb::perf_event_mmap_page;
        // SAFETY: the first page of the mapping is the kernel's perf_event_mmap_page; these two
        // fields are written once by the kernel before mmap returns.
        let (off, size) = unsafe {
            (
                std::ptr::addr_of!((*page).data_offset).read_volatile(),
                std::ptr::addr_of!((*page).data_size).read_volatile(),
            )
        };
        // Kernels before 4.1 leave both zero: data starts at the second page.
        let (data_offset, data_size) =
            if size == 0 { (ps, len - ps) } else { (off as usize, size as usize) };
        if data_offset.checked_add(data_size).is_none_or(|end| end > len) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "perf ring control page describes a data area outside the mapping",
            ));
        }
        Ok(Self { map, data_offset, data_size })
    }

    fn control_u64(&self, field: usize) -> &AtomicU64 {
        let page = self.map.as_mut_ptr() as *mut pb::perf_event_mmap_page;
        // SAFETY: `field` is the offset of data_head or data_tail inside the control page,
        // which stays mapped as long as `self`; both are naturally aligned u64s that the kernel
        // and we access atomically, so viewing them as AtomicU64 is sound.
        unsafe { &*((page as *mut u8).add(field) as *const AtomicU64) }
    }

    /// `data_head`, read with Acquire: records before it are fully written.
    pub fn head(&self) -> u64 {
        self.control_u64(std::mem::offset_of!(pb::perf_event_mmap_page, data_head))
            .load(Ordering::Acquire)
    }

    pub fn tail(&self) -> u64 {
        self.control_u64(std::mem::offset_of!(pb::perf_event_mmap_page, data_tail))
            .load(Ordering::Relaxed)
    }

    /// `data_tail`, written with Release: our reads of the records before it are complete.
    pub fn set_tail(&self, tail: u64) {
        self.control_u64(std::mem::offset_of!(pb::perf_event_mmap_page, data_tail))
            .store(tail, Ordering::Release)
    }

    pub fn data_size(&self) -> usize {
        self.data_size
    }

    /// The `len` bytes at `off` in the data area, in place; `off + len <= data_size`. The
    /// caller asks only for bytes between `data_tail` and `data_head`, and lets the borrow end
    /// before it moves `data_tail` past them.
    pub fn bytes_at(&self, off: usize, len: usize) -> &[u8] {
        assert!(
            off.checked_add(len).is_some_and(|end| end <= self.data_size),
            "ring read out of bounds"
        );
        // SAFETY: the range was checked to lie inside the data area, which is mapped (readable)
        // for the lifetime of `self`, and u8 has no alignment or validity requirement. The
        // kernel writes only between data_head and data_tail + data_size, never the records
        // between data_tail and data_head that the caller asks for, until the caller moves
        // data_tail past them (after this borrow ends: `RingReader::drain`), so the bytes do
        // not change while borrowed.
        unsafe {
            std::slice::from_raw_parts(
                self.map.as_mut_ptr().add(self.data_offset + off) as *const u8,
                len,
            )
        }
    }

    /// Copy `dst.len()` bytes at `off` in the data area; `off + dst.len() <= data_size`.
    pub fn read_at(&self, off: usize, dst: &mut [u8]) {
        assert!(
            off.checked_add(dst.len()).is_some_and(|end| end <= self.data_size),
            "ring read out of bounds"
        );
        // SAFETY: the range was checked to lie inside the data area, which is mapped for the
        // lifetime of `self`; `dst` is a distinct, writable buffer of exactly that length. The
        // caller reads only between data_tail and data_head, which the kernel does not write.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.map.as_mut_ptr().add(self.data_offset + off) as *const u8,
                dst.as_mut_ptr(),
                dst.len(),
            );
        }
    }
}

/// Pin the calling thread to `cpu`.
pub fn pin_current_thread(cpu: u32) -> io::Result<()> {
    let cpu = cpu as usize;
    // SAFETY: cpu_set_t is plain data; all-zero is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    if cpu >= 8 * std::mem::size_of::<libc::cpu_set_t>() {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "cpu number too large"));
    }
    // SAFETY: `cpu` was checked to be within the set's capacity.
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: `set` is a valid cpu_set_t of the size we pass; pid 0 = calling thread.
    let rc = unsafe { libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set) };
    if rc < 0 {
        Err(last_errno())
    } else {
        Ok(())
    }
}

/// Give the calling thread `SCHED_FIFO` at `priority` (1 = lowest real-time priority).
pub fn set_fifo_priority(priority: i32) -> io::Result<()> {
    let param = libc::sched_param { sched_priority: priority };
    // SAFETY: `param` is a valid sched_param; pid 0 = calling thread.
    let rc = unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &param) };
    if rc < 0 {
        Err(last_errno())
    } else {
        Ok(())
    }
}

/// Set the calling thread's nice value (on Linux `setpriority(PRIO_PROCESS, tid)` applies to
/// one thread). Raising it needs no privilege; lowering it needs `CAP_SYS_NICE` or an
/// `RLIMIT_NICE` that allows it (the unit's `LimitNICE=`).
pub fn set_own_nice(nice: i32) -> io::Result<()> {
    // SAFETY: gettid(2) has no preconditions and cannot fail.
    let tid = unsafe { libc::gettid() };
    let who = libc::id_t::try_from(tid).map_err(|_| io::Error::other("negative thread id"))?;
    // SAFETY: a plain syscall on our own thread id; no memory is passed.
    let rc = unsafe { libc::setpriority(libc::PRIO_PROCESS, who, nice) };
    if rc < 0 {
        Err(last_errno())
    } else {
        Ok(())
    }
}

/// What poll(2) saw on a ring fd.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct PollResult {
    /// The ring has data past the watermark.
    pub readable: bool,
    /// The event is gone (POLLHUP / POLLERR / POLLNVAL).
    pub hangup: bool,
    /// The wake-up fd was signalled.
    pub woken: bool,
}

/// poll(2) a ring fd, a wake-up eventfd shared by every drain thread and one for this thread
/// alone (barrier requests), with a timeout in milliseconds. EINTR counts as a timeout.
pub fn poll_ring(
    ring: &PerfFd,
    wake: &EventFd,
    kick: &EventFd,
    timeout_ms: i32,
) -> io::Result<PollResult> {
    let mut fds = [
        libc::pollfd { fd: ring.as_raw_fd(), events: libc::POLLIN, revents: 0 },
        libc::pollfd { fd: wake.fd.as_raw_fd(), events: libc::POLLIN, revents: 0 },
        libc::pollfd { fd: kick.fd.as_raw_fd(), events: libc::POLLIN, revents: 0 },
    ];
    // SAFETY: `fds` is an array of three valid pollfd structs whose length we pass.
    let rc = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout_ms) };
    if rc < 0 {
        let e = last_errno();
        if e.kind() == io::ErrorKind::Interrupted {
            return Ok(PollResult::default());
        }
        return Err(e);
    }
    let bad = libc::POLLHUP | libc::POLLERR | libc::POLLNVAL;
    Ok(PollResult {
        readable: fds[0].revents & libc::POLLIN != 0,
        hangup: fds[0].revents & bad != 0,
        woken: fds[1].revents & libc::POLLIN != 0 || fds[2].revents & libc::POLLIN != 0,
    })
}

/// poll(2) several ring fds and a stop eventfd with a timeout in milliseconds (the off-CPU
/// source reads every CPU's ring from one thread). Returns whether `stop` was signalled;
/// EINTR counts as a timeout.
pub fn poll_rings(rings: &[&PerfFd], stop: &EventFd, timeout_ms: i32) -> io::Result<bool> {
    let mut fds: Vec<libc::pollfd> = rings
        .iter()
        .map(|r| libc::pollfd { fd: r.as_raw_fd(), events: libc::POLLIN, revents: 0 })
        .collect();
    fds.push(libc::pollfd { fd: stop.fd.as_raw_fd(), events: libc::POLLIN, revents: 0 });
    // SAFETY: `fds` is a vector of valid pollfd structs whose length we pass.
    let rc = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout_ms) };
    if rc < 0 {
        let e = last_errno();
        if e.kind() == io::ErrorKind::Interrupted {
            return Ok(false);
        }
        return Err(e);
    }
    Ok(fds.last().is_some_and(|f| f.revents & libc::POLLIN != 0))
}

/// An eventfd used to wake every drain thread at once (it stays readable once signalled).
#[derive(Debug)]
pub struct EventFd {
    fd: OwnedFd,
}

impl EventFd {
    pub fn new() -> io::Result<Self> {
        // SAFETY: eventfd has no memory-safety preconditions.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(last_errno());
        }
        // SAFETY: a fresh fd that nothing else owns.
        Ok(Self { fd: unsafe { OwnedFd::from_raw_fd(fd) } })
    }

    /// Make it unreadable again (a per-thread kick, consumed by the thread it wakes).
    pub fn clear(&self) {
        let mut v: u64 = 0;
        // SAFETY: reads at most 8 bytes into `v`, as eventfd requires; the fd is non-blocking,
        // so an unsignalled eventfd returns EAGAIN, which is what "already clear" means.
        let _ =
            unsafe { libc::read(self.fd.as_raw_fd(), &mut v as *mut u64 as *mut libc::c_void, 8) };
    }

    /// Make the eventfd readable (for every poller, until read, which we never do).
    pub fn signal(&self) -> io::Result<()> {
        let one: u64 = 1;
        // SAFETY: writes the 8 bytes of `one`, as eventfd requires.
        let n = unsafe {
            libc::write(self.fd.as_raw_fd(), &one as *const u64 as *const libc::c_void, 8)
        };
        if n < 0 {
            Err(last_errno())
        } else {
            Ok(())
        }
    }

    /// Sleep until signalled or `timeout_ms` passes; true if signalled.
    pub fn wait(&self, timeout_ms: i32) -> bool {
        let mut fds = [libc::pollfd { fd: self.fd.as_raw_fd(), events: libc::POLLIN, revents: 0 }];
        // SAFETY: one valid pollfd, length passed.
        let rc = unsafe { libc::poll(fds.as_mut_ptr(), 1, timeout_ms) };
        rc > 0 && fds[0].revents & libc::POLLIN != 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attr_has_our_layout() {
        let spec = AttrSpec {
            perf_type: PERF_TYPE_SOFTWARE,
            config: PERF_COUNT_SW_CPU_CLOCK as u64,
            period: 1_000_000,
            sideband: true,
            build_id: true,
            wakeup_watermark: 4096,
            cgroup: false,
            max_stack: 0,
            user_stack: 0,
            context_switch: false,
            lean: false,
            raw: false,
            exits: false,
        };
        let a = make_attr(&spec);
        let sw = make_attr(&AttrSpec {
            context_switch: true,
            lean: true,
            exits: true,
            sideband: false,
            ..spec.clone()
        });
        assert_eq!((sw.context_switch(), a.context_switch()), (1, 0));
        assert_eq!((sw.task(), sw.mmap2()), (1, 0));
        assert_eq!(sw.sample_type, (pb::PERF_SAMPLE_TID | pb::PERF_SAMPLE_TIME) as u64);
        let tp = make_attr(&AttrSpec { lean: true, raw: true, sideband: false, ..spec.clone() });
        assert_eq!(
            tp.sample_type,
            (pb::PERF_SAMPLE_TID | pb::PERF_SAMPLE_TIME | pb::PERF_SAMPLE_RAW) as u64
        );
        assert_eq!((tp.task(), tp.context_switch()), (0, 0));
        assert_eq!(a.sample_type, SAMPLE_TYPE);
        let c = make_attr(&AttrSpec { cgroup: true, ..spec.clone() });
        assert_eq!(c.sample_type, SAMPLE_TYPE | pb::PERF_SAMPLE_CGROUP as u64);
        assert_eq!((c.cgroup(), a.cgroup()), (1, 0));
        let cc = make_attr(&AttrSpec { max_stack: 32, ..spec.clone() });
        assert_eq!(cc.sample_type, SAMPLE_TYPE | pb::PERF_SAMPLE_CALLCHAIN as u64);
        assert_eq!((cc.sample_max_stack, a.sample_max_stack), (32, 0));
        assert_eq!(a.disabled(), 1);
        assert_eq!(a.watermark(), 1);
        assert_eq!(a.mmap2(), 1);
        assert_eq!(a.sample_id_all(), 1);
        assert_eq!(a.use_clockid(), 1);
        assert_eq!(a.exclude_kernel(), 0);
        let plain = make_attr(&AttrSpec { sideband: false, ..spec });
        assert_eq!(plain.mmap2(), 0);
        assert_eq!(plain.comm(), 0);
    }
}
