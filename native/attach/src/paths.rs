//! Where the resident daemon lives, and the rules for its directory: the
//! same as `streamd.resident.paths`, which the daemon itself follows.
//!
//! Paths stay bytes (`OsString`) throughout, as the kernel sees them.

use std::ffi::{OsStr, OsString};
use std::fs;
use std::io;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::{MetadataExt, PermissionsExt};

use crate::sys;

pub const SOCKET_NAME: &str = "streamd.sock";
pub const LOCK_NAME: &str = "streamd.lock";
pub const LOG_NAME: &str = "daemon.log";
/// sun_path is 108 bytes on Linux, the terminating NUL included.
pub const MAX_SOCKET_PATH: usize = 107;

/// The socket directory exists but is not private to this user (the message).
pub struct UnsafeDirectory(pub String);

/// What a failed check of the runtime directory is.
pub enum DirError {
    Unsafe(UnsafeDirectory),
    Io(io::Error),
}

pub fn show(path: &OsStr) -> String {
    path.to_string_lossy().into_owned()
}

/// `a/b`, or `b` when it is absolute (`os.path.join`).
pub fn join(a: &OsStr, b: &OsStr) -> OsString {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if b.starts_with(b"/") || a.is_empty() {
        return OsString::from_vec(b.to_vec());
    }
    let mut out = a.to_vec();
    if !out.ends_with(b"/") {
        out.push(b'/');
    }
    out.extend_from_slice(b);
    OsString::from_vec(out)
}

/// `os.path.normpath` for POSIX: `.` and empty parts dropped, `..` folded,
/// two leading slashes kept (POSIX leaves their meaning open), more made one.
pub fn normpath(path: &OsStr) -> OsString {
    let bytes = path.as_bytes();
    if bytes.is_empty() {
        return OsString::from(".");
    }
    let lead = root(bytes);
    let mut parts: Vec<&[u8]> = Vec::new();
    for part in bytes.split(|&b| b == b'/') {
        match part {
            b"" | b"." => {}
            b".." if !lead.is_empty() && parts.is_empty() => {}
            b".." if parts.last().is_some_and(|p| *p != b"..") => {
                parts.pop();
            }
            _ => parts.push(part),
        }
    }
    OsString::from_vec(rooted(lead, &parts))
}

/// A path's root as both `os.path` and `pathlib` keep it: exactly two
/// leading slashes stay two (POSIX leaves their meaning open), one or three
/// and more are one.
pub fn root(path: &[u8]) -> &'static [u8] {
    if path.starts_with(b"//") && !path.starts_with(b"///") {
        b"//"
    } else if path.starts_with(b"/") {
        b"/"
    } else {
        b""
    }
}

/// `root` and the parts joined by slashes; `.` for nothing at all.
pub fn rooted(root: &[u8], parts: &[&[u8]]) -> Vec<u8> {
    let mut out = root.to_vec();
    out.extend_from_slice(&parts.join(&b'/'));
    if out.is_empty() {
        out.push(b'.');
    }
    out
}

/// `os.path.abspath`: against this process's working directory.
pub fn abspath(path: &OsStr) -> io::Result<OsString> {
    if path.as_bytes().starts_with(b"/") {
        return Ok(normpath(path));
    }
    let cwd = std::env::current_dir()?;
    Ok(normpath(&join(cwd.as_os_str(), path)))
}

fn xdg(name: &str) -> Option<OsString> {
    std::env::var_os(name).filter(|v| v.as_bytes().starts_with(b"/"))
}

/// `$XDG_STATE_HOME/streamd` (`~/.local/state/streamd`).
pub fn state_dir() -> OsString {
    let base = xdg("XDG_STATE_HOME").unwrap_or_else(|| {
        let home = sys::expand_user(OsStr::new("~"));
        join(&join(&home, OsStr::new(".local")), OsStr::new("state"))
    });
    join(&base, OsStr::new("streamd"))
}

/// `$STREAMD_RUNTIME_DIR`, else `$XDG_RUNTIME_DIR/streamd`, else
/// `$XDG_STATE_HOME/streamd/run`.
pub fn runtime_dir() -> io::Result<OsString> {
    if let Some(dir) = std::env::var_os("STREAMD_RUNTIME_DIR").filter(|v| !v.is_empty()) {
        return abspath(&sys::expand_user(&dir));
    }
    if let Some(dir) = xdg("XDG_RUNTIME_DIR") {
        return Ok(join(&dir, OsStr::new("streamd")));
    }
    Ok(join(&state_dir(), OsStr::new("run")))
}

pub fn socket_path(directory: &OsStr) -> OsString {
    join(directory, OsStr::new(SOCKET_NAME))
}

pub fn lock_path(directory: &OsStr) -> OsString {
    join(directory, OsStr::new(LOCK_NAME))
}

pub fn log_path() -> OsString {
    join(&state_dir(), OsStr::new(LOG_NAME))
}

/// True if `directory` is private to this user, false if it does not exist.
pub fn check_private_dir(directory: &OsStr) -> Result<bool, DirError> {
    let meta = match fs::symlink_metadata(directory) {
        Ok(meta) => meta,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(DirError::Io(e)),
    };
    let name = show(directory);
    let refuse = |msg: String| Err(DirError::Unsafe(UnsafeDirectory(msg)));
    if !meta.file_type().is_dir() {
        return refuse(format!("{name} is not a directory"));
    }
    let me = sys::geteuid();
    if meta.uid() != me {
        return refuse(format!(
            "{name} belongs to uid {}, not to this user (uid {me})",
            meta.uid()
        ));
    }
    let mode = meta.permissions().mode() & 0o7777;
    if mode & 0o077 != 0 {
        return refuse(format!(
            "{name} has mode {mode:04o}; it must be 0700 (no group or other access)"
        ));
    }
    Ok(true)
}

pub fn check_socket_path(path: &OsStr) -> Result<(), UnsafeDirectory> {
    if path.as_bytes().len() > MAX_SOCKET_PATH {
        return Err(UnsafeDirectory(format!(
            "socket path {} is longer than the {MAX_SOCKET_PATH} bytes a Unix socket address \
             can hold; set STREAMD_RUNTIME_DIR to a shorter directory",
            show(path)
        )));
    }
    Ok(())
}

/// The pid the lock file names, if that process holds the file's lock (as
/// the kernel's table of locks says). Read only: taking the lock, even
/// briefly, could make a daemon starting right then give up.
pub fn lock_holder(directory: &OsStr) -> Option<i32> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let mut head = [0u8; 32];
    // Opened without waiting and checked before any read: a FIFO left in the
    // lock file's place would block a plain open (and a read) for good.
    let mut file = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(lock_path(directory))
        .ok()?;
    let meta = file.metadata().ok()?;
    if !meta.file_type().is_file() {
        return None;
    }
    let inode = meta.ino();
    let n = file.read(&mut head).ok()?;
    let text = std::str::from_utf8(&head[..n]).ok()?;
    let pid: i32 = text.split_whitespace().next()?.parse().ok()?;
    if !proc_is_ours() {
        // A /proc of another pid namespace (a sandbox that made one without
        // mounting its own): its table and its /proc/PID number processes as
        // that namespace does, never as the daemon wrote its pid. Whether the
        // pid is a process here, asked of the kernel, is all we know.
        return sys::signalable(pid).then_some(pid);
    }
    match fs::read("/proc/locks") {
        // The kernel's table says who holds the lock: a pid merely alive may
        // be another process's, given the number after a kill -9.
        Ok(table) => flock_held_by(&table, inode, pid).then_some(pid),
        // No table to read: the pid's life is all we know.
        Err(_) => sys::pid_alive(pid).then_some(pid),
    }
}

/// Whether `/proc` numbers processes as this process's pid namespace does
/// (`/proc/self` is named by its pid there); true without a /proc.
fn proc_is_ours() -> bool {
    match fs::read_link("/proc/self") {
        Ok(link) => link.to_str().and_then(|s| s.parse::<u32>().ok()) == Some(std::process::id()),
        Err(e) => e.kind() == io::ErrorKind::NotFound,
    }
}

/// Whether `/proc/locks` (`table`) lists a flock held by `pid` on a file of
/// inode number `inode`. Matched on the inode alone, as the Python side
/// does: the device number there is the superblock's, which a stat does not
/// always give; the pid the file names must match too.
fn flock_held_by(table: &[u8], inode: u64, pid: i32) -> bool {
    // "1: FLOCK  ADVISORY  WRITE 1234 fd:01:56789 0 EOF"; a waiter's line has "->".
    table.split(|&b| b == b'\n').any(|line| {
        let text = String::from_utf8_lossy(line);
        let fields: Vec<&str> = text.split_whitespace().collect();
        fields.len() >= 6
            && fields[1] == "FLOCK"
            && fields[4].parse::<i32>().ok() == Some(pid)
            && fields[5].rsplit(':').next().and_then(|i| i.parse::<u64>().ok()) == Some(inode)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flock_is_held_only_by_the_pid_on_its_line_for_that_inode() {
        let table = b"1: POSIX  ADVISORY  WRITE 40 00:19:77 0 EOF\n\
                      2: FLOCK  ADVISORY  WRITE 41 fd:01:56789 0 EOF\n\
                      2: -> FLOCK  ADVISORY  WRITE 42 fd:01:56789 0 EOF\n";
        assert!(flock_held_by(table, 56789, 41));
        assert!(!flock_held_by(table, 56789, 42)); // a waiter holds nothing
        assert!(!flock_held_by(table, 77, 40)); // a POSIX lock is not the daemon's flock
        assert!(!flock_held_by(table, 5678, 41));
        assert!(!flock_held_by(b"", 56789, 41));
    }

    fn norm(s: &str) -> String {
        show(&normpath(OsStr::new(s)))
    }

    #[test]
    fn normpath_folds_as_python_does() {
        // Each right side is what CPython's posixpath.normpath answers.
        let cases = [
            ("", "."),
            ("/", "/"),
            ("//", "//"),
            ("///", "/"),
            ("//a/../b", "//b"),
            ("a/./b/", "a/b"),
            ("/a/b/../../..", "/"),
            ("../a/..", ".."),
            ("a/../..", ".."),
            ("./", "."),
            ("/x/./y//z", "/x/y/z"),
        ];
        for (given, want) in cases {
            assert_eq!(norm(given), want, "normpath({given:?})");
        }
    }

    #[test]
    fn join_takes_an_absolute_second_part_whole() {
        assert_eq!(show(&join(OsStr::new("/a"), OsStr::new("/b"))), "/b");
        assert_eq!(show(&join(OsStr::new("/a/"), OsStr::new("b"))), "/a/b");
        assert_eq!(show(&join(OsStr::new("/a"), OsStr::new("b"))), "/a/b");
    }
}
