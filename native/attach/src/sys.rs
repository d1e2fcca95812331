//! The system calls std does not wrap, each behind a safe function.

use std::ffi::{CStr, OsStr, OsString};
use std::fs;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::net::UnixStream;
use std::time::Duration;

/// What `strerror(3)` says of an error: the words Python's `exc.strerror`
/// shows, without Rust's "(os error N)".
pub fn strerror(err: &io::Error) -> String {
    match err.raw_os_error() {
        // SAFETY: strerror returns a pointer to a NUL-terminated static or
        // thread-local string; it is copied out at once.
        Some(code) => unsafe { CStr::from_ptr(libc::strerror(code)) }
            .to_string_lossy()
            .into_owned(),
        None => err.to_string(),
    }
}

pub fn isatty(fd: RawFd) -> bool {
    // SAFETY: isatty only inspects the descriptor.
    unsafe { libc::isatty(fd) == 1 }
}

pub fn geteuid() -> u32 {
    // SAFETY: no arguments, cannot fail.
    unsafe { libc::geteuid() }
}

extern "C" fn exit_now(_signum: libc::c_int) {
    // Nothing is buffered (stdout is written whole lines at a time, straight
    // to the descriptor); closing the socket, which exit does, ends the
    // daemon's session.
    // SAFETY: _exit is async-signal-safe.
    unsafe { libc::_exit(0) }
}

/// SIGTERM and SIGINT end the process at once with status 0.
pub fn exit_on_signals() {
    let handler = exit_now as extern "C" fn(libc::c_int) as libc::sighandler_t;
    // SAFETY: the handler only calls _exit.
    unsafe {
        libc::signal(libc::SIGTERM, handler);
        libc::signal(libc::SIGINT, handler);
    }
}

/// The machine's boot-time clock in seconds (`CLOCK_BOOTTIME`), the clock of
/// `streamd.resident.stopmark`: told to a daemon this process spawns, so that
/// a stop asked after the spawn keeps it from serving.
pub fn boot_clock() -> Option<f64> {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes the struct we own; CLOCK_BOOTTIME exists on
    // every Linux this runs on (2.6.39 on).
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) };
    (rc == 0).then(|| ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9)
}

/// Mark every descriptor above stderr close-on-exec, so that the daemon this
/// process may start inherits none of them (whatever our parent left open).
pub fn close_inherited_on_exec() {
    let Ok(entries) = fs::read_dir("/proc/self/fd") else {
        return;
    };
    let fds: Vec<RawFd> = entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .filter(|&fd| fd > 2)
        .collect();
    for fd in fds {
        // SAFETY: F_GETFD/F_SETFD on a number that may or may not be open
        // (the directory's own descriptor is gone by now) only sets a flag.
        unsafe {
            let flags = libc::fcntl(fd, libc::F_GETFD);
            if flags >= 0 {
                libc::fcntl(fd, libc::F_SETFD, flags | libc::FD_CLOEXEC);
            }
        }
    }
}

/// The pid and uid of the process that listens on the other end.
pub fn peer_cred(sock: &UnixStream) -> io::Result<(i32, u32)> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: cred and len are valid for writes of the sizes given.
    let rc = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((cred.pid, cred.uid))
}

/// Below this a wait is not worth a system call (SO_SNDTIMEO 0 means forever).
pub const MIN_WAIT: f64 = 0.001;

fn timeval(seconds: f64) -> libc::timeval {
    let whole = seconds.trunc();
    libc::timeval {
        tv_sec: whole as libc::time_t,
        tv_usec: ((seconds - whole) * 1_000_000.0) as libc::suseconds_t,
    }
}

fn set_send_timeout(fd: RawFd, seconds: f64) -> io::Result<()> {
    let tv = timeval(seconds);
    // SAFETY: tv lives across the call and its size is passed.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_SNDTIMEO,
            (&tv as *const libc::timeval).cast(),
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// How long one connect(2) sleeps on a full queue before it looks the path up again.
const CONNECT_SLICE: f64 = 0.05;

/// connect(2) to a Unix socket, waiting up to `timeout` for room in a full
/// listen queue. A Unix socket's non-blocking connect fails at once with
/// EAGAIN when the queue is full; a blocking connect with SO_SNDTIMEO is the
/// kernel's own bounded wait, EAGAIN only when the time is up. The wait is
/// taken in slices of [`CONNECT_SLICE`]: a sleeping connect looks the path up
/// again only when it wakes, so a listener that never accepts (a stray whose
/// queue our probes filled) would hold it for the whole timeout though a
/// daemon had meanwhile put its socket in its place.
pub fn connect_waiting(path: &OsStr, timeout: f64) -> io::Result<UnixStream> {
    let bytes = path.as_bytes();
    // SAFETY: sockaddr_un is plain data; zeroed is a valid value.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    if bytes.len() >= addr.sun_path.len() {
        return Err(io::Error::from_raw_os_error(libc::ENAMETOOLONG));
    }
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (dst, src) in addr.sun_path.iter_mut().zip(bytes) {
        *dst = *src as libc::c_char;
    }
    // SAFETY: a new descriptor, owned by the UnixStream at once.
    let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd is a fresh socket nobody else owns.
    let sock = unsafe { UnixStream::from_raw_fd(fd) };
    let waiting = timeout >= MIN_WAIT;
    if !waiting {
        sock.set_nonblocking(true)?;
    }
    let len = (std::mem::size_of::<libc::sa_family_t>() + bytes.len() + 1) as libc::socklen_t;
    // None: too far off for an Instant, as good as forever.
    let deadline = Duration::try_from_secs_f64(timeout.max(0.0))
        .ok()
        .and_then(|d| std::time::Instant::now().checked_add(d));
    let left = || {
        deadline.map_or(f64::INFINITY, |at| {
            at.saturating_duration_since(std::time::Instant::now())
                .as_secs_f64()
        })
    };
    loop {
        if waiting {
            set_send_timeout(fd, left().clamp(MIN_WAIT, CONNECT_SLICE))?;
        }
        // SAFETY: addr is a valid sockaddr_un and len does not exceed it.
        let rc = unsafe { libc::connect(fd, (&addr as *const libc::sockaddr_un).cast(), len) };
        if rc == 0 {
            break;
        }
        let err = io::Error::last_os_error();
        // A connect waiting with SO_SNDTIMEO fails with EINTR when the process
        // is stopped and continued (Ctrl-Z, SIGSTOP), handler or not. Python's
        // attach retries it (PEP 475); so does this, rather than give up.
        if err.kind() == io::ErrorKind::Interrupted && left() >= MIN_WAIT {
            continue;
        }
        if !waiting || err.raw_os_error() != Some(libc::EAGAIN) || left() < MIN_WAIT {
            return Err(err);
        }
    }
    if waiting {
        // No longer wanted: later sends are bounded by the stream's timeouts.
        set_send_timeout(fd, 0.0)?;
    } else {
        sock.set_nonblocking(false)?;
    }
    // Interrupted by a signal whose handler returned, connect may report
    // success on a socket that is not connected.
    sock.peer_addr()?;
    Ok(sock)
}

/// Read and write timeouts of at least [`MIN_WAIT`].
pub fn set_timeouts(sock: &UnixStream, seconds: f64) -> io::Result<()> {
    let wait = Some(Duration::from_secs_f64(seconds.max(MIN_WAIT)));
    sock.set_read_timeout(wait)?;
    sock.set_write_timeout(wait)
}

/// The state letter of `/proc/PID/stat` (`R`, `S`, `T` stopped, `Z`
/// zombie...), or None when there is no such process.
pub fn process_state(pid: i32) -> Option<char> {
    let stat = fs::read(format!("/proc/{pid}/stat")).ok()?;
    let close = stat.iter().rposition(|&b| b == b')')?;
    let rest = std::str::from_utf8(&stat[close + 1..]).ok()?;
    rest.split_whitespace().next()?.chars().next()
}

/// Whether `pid` is a process of this pid namespace (a zombie too), asked
/// of the kernel (`kill(pid, 0)`), not of /proc.
pub fn signalable(pid: i32) -> bool {
    if pid <= 0 {
        return false; // not one process: kill would ask about a group
    }
    // SAFETY: signal 0 delivers nothing; it only checks the pid.
    let sent = unsafe { libc::kill(pid, 0) } == 0;
    sent || io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// Whether `pid` is a live process (a zombie counts as gone).
pub fn pid_alive(pid: i32) -> bool {
    matches!(process_state(pid), Some(s) if s != 'Z' && s != 'X')
}

/// Wait up to `timeout` seconds for `fd` to be readable (or at its end).
pub fn readable(fd: RawFd, timeout: f64) -> io::Result<bool> {
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = (timeout.max(0.0) * 1000.0).ceil().min(i32::MAX as f64) as libc::c_int;
    loop {
        // SAFETY: one valid pollfd.
        let rc = unsafe { libc::poll(&mut pfd, 1, ms) };
        if rc >= 0 {
            return Ok(rc > 0);
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
}

/// `~` and `~user` at the start of `path` expanded as Python's
/// `os.path.expanduser` does; anything else unchanged.
pub fn expand_user(path: &OsStr) -> OsString {
    let bytes = path.as_bytes();
    if bytes.first() != Some(&b'~') {
        return path.to_owned();
    }
    let end = bytes.iter().position(|&b| b == b'/').unwrap_or(bytes.len());
    let user = &bytes[1..end];
    let home = if user.is_empty() {
        match std::env::var_os("HOME") {
            Some(home) => Some(home.into_vec()),
            None => home_of(None),
        }
    } else {
        home_of(Some(user))
    };
    let Some(mut home) = home else {
        return path.to_owned();
    };
    while home.ends_with(b"/") {
        home.pop();
    }
    home.extend_from_slice(&bytes[end..]);
    if home.is_empty() {
        home.push(b'/');
    }
    OsString::from_vec(home)
}

fn home_of(user: Option<&[u8]>) -> Option<Vec<u8>> {
    // SAFETY: getpwnam/getpwuid return a pointer into static storage, read
    // at once; this process is single-threaded while it resolves paths.
    unsafe {
        let entry = match user {
            Some(name) => {
                let name = std::ffi::CString::new(name).ok()?;
                libc::getpwnam(name.as_ptr())
            }
            None => libc::getpwuid(libc::getuid()),
        };
        if entry.is_null() || (*entry).pw_dir.is_null() {
            return None;
        }
        Some(CStr::from_ptr((*entry).pw_dir).to_bytes().to_vec())
    }
}

/// Write `text` and a newline to stdout (1) or stderr (2) in one write where
/// it fits, ignoring failure: a reader that went away must not turn a
/// message into a panic (std's `eprintln!` panics on a broken pipe).
pub fn say(fd: RawFd, text: &str) {
    use std::io::Write;
    let mut line = Vec::with_capacity(text.len() + 1);
    line.extend_from_slice(text.as_bytes());
    line.push(b'\n');
    // SAFETY: the descriptor is borrowed for one write; ManuallyDrop keeps
    // it open.
    let mut file = std::mem::ManuallyDrop::new(unsafe { fs::File::from_raw_fd(fd) });
    let _ = file.write_all(&line);
}

/// Interrupting a thread in the middle of a blocking call, as a stop and
/// continue of the process does (a handler that returns, without
/// SA_RESTART, makes the call fail with EINTR the same way).
#[cfg(test)]
pub mod interrupting {
    use std::os::unix::thread::JoinHandleExt;
    use std::sync::Once;
    use std::thread::JoinHandle;

    extern "C" fn nothing(_signum: libc::c_int) {}

    fn install() {
        static ONCE: Once = Once::new();
        // SAFETY: a zeroed sigaction is valid; the handler does nothing.
        ONCE.call_once(|| unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = nothing as extern "C" fn(libc::c_int) as libc::sighandler_t;
            libc::sigemptyset(&mut action.sa_mask);
            libc::sigaction(libc::SIGUSR1, &action, std::ptr::null_mut());
        });
    }

    /// This thread's kernel id, for [`interrupt_in`].
    pub fn tid() -> libc::pid_t {
        // SAFETY: gettid takes nothing and cannot fail.
        unsafe { libc::syscall(libc::SYS_gettid) as libc::pid_t }
    }

    /// Whether thread `tid` of this process is blocked in system call `nr`.
    fn blocked_in(tid: libc::pid_t, nr: libc::c_long) -> bool {
        let path = format!("/proc/self/task/{tid}/syscall");
        std::fs::read_to_string(path)
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse::<libc::c_long>().ok())
            == Some(nr)
    }

    /// Signal `thread` `times` times, each once it is seen blocked in system
    /// call `nr`; stops early if the thread has ended (the call gave up).
    pub fn interrupt_in<T>(
        thread: &JoinHandle<T>,
        tid: libc::pid_t,
        nr: libc::c_long,
        times: usize,
    ) {
        install();
        for _ in 0..times {
            while !blocked_in(tid, nr) {
                if thread.is_finished() {
                    return;
                }
                std::thread::yield_now();
            }
            // SAFETY: the thread has not been joined, so its pthread_t is live.
            unsafe { libc::pthread_kill(thread.as_pthread_t(), libc::SIGUSR1) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixListener;

    #[test]
    fn a_connect_interrupted_while_it_waits_for_room_goes_on_waiting() {
        let dir = std::env::temp_dir().join(format!("sda-eintr-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir(&dir).unwrap();
        let path = dir.join("s");
        let listener = UnixListener::bind(&path).unwrap();
        // A backlog of 0 holds one pending connection: `filler` takes it, so
        // the next connect waits for room.
        // SAFETY: listen on a socket we own only changes its backlog.
        assert_eq!(unsafe { libc::listen(listener.as_raw_fd(), 0) }, 0);
        let _filler = UnixStream::connect(&path).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let target = path.clone().into_os_string();
        let waiter = std::thread::spawn(move || {
            tx.send(interrupting::tid()).unwrap();
            connect_waiting(&target, 60.0).map(drop)
        });
        let tid = rx.recv().unwrap();
        interrupting::interrupt_in(&waiter, tid, libc::SYS_connect, 3);
        let _taken = listener.accept().unwrap(); // room: the waiting connect goes in
        let got = waiter.join().unwrap();
        let _ = fs::remove_dir_all(&dir);
        assert!(got.is_ok(), "{got:?}");
    }
}
