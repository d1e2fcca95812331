//! The relay: stdin -> socket in a thread, socket -> stdout in the main
//! thread, byte for byte, and the exit status the session ended with (the
//! rules of `streamd.resident.attach.Relay`).
//!
//! Only whole lines go to stdout: if the daemon dies mid-frame, the partial
//! frame is dropped, never shown. stdin at EOF half-closes the socket and
//! the relay goes on until the daemon closes; the daemon's close is clean
//! when stdin ended first or when the last frame relayed answers a
//! `recall/shutdown` that was sent ([`crate::ending`]).

use std::fs::File;
use std::io::{self, Read, Write};
use std::mem::ManuallyDrop;
use std::net::Shutdown;
use std::os::fd::FromRawFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use crate::ending::{last_line, SessionEnd, MAX_SHUTDOWN_LINE};
use crate::sys;

const READ_CHUNK: usize = 1 << 16;

/// stdin or stdout as a file, unbuffered (std's `Stdout` buffers lines) and
/// never closed by us.
fn fd(n: i32) -> ManuallyDrop<File> {
    // SAFETY: 0 and 1 are open for the life of the process; ManuallyDrop
    // keeps them from being closed.
    ManuallyDrop::new(unsafe { File::from_raw_fd(n) })
}

struct Shared {
    end: Mutex<SessionEnd>,
    stdin_closed: AtomicBool,
}

/// Relay until the session ends; the exit status. `first`: bytes read with
/// the hello's answer, not relayed yet.
pub fn run(sock: UnixStream, first: Vec<u8>) -> i32 {
    let shared = Arc::new(Shared {
        end: Mutex::new(SessionEnd::default()),
        stdin_closed: AtomicBool::new(false),
    });
    match sock.try_clone() {
        Ok(writer) => {
            let shared = Arc::clone(&shared);
            std::thread::Builder::new()
                .name("stdin".into())
                .spawn(move || pump_stdin(writer, &shared))
                .map(drop)
                .unwrap_or_else(|e| fail(&format!("cannot start the relay: {e}")));
        }
        Err(e) => fail(&format!("cannot start the relay: {}", sys::strerror(&e))),
    }
    pump_socket(sock, first, &shared)
}

fn fail(why: &str) -> ! {
    sys::say(2, &format!("streamd attach: {why}"));
    std::process::exit(1)
}

fn pump_stdin(mut sock: UnixStream, shared: &Shared) {
    let mut stdin = fd(0);
    let mut buf = vec![0u8; READ_CHUNK];
    loop {
        // A stdin that cannot be read has ended, as Python's attach takes it.
        let n = read_retrying(&mut *stdin, &mut buf).unwrap_or_default();
        if n == 0 {
            break;
        }
        // Before the bytes go: the answer to a shutdown can only follow.
        lock(&shared.end).sent(&buf[..n]);
        if sock.write_all(&buf[..n]).is_err() {
            return; // the daemon is gone; the socket side reports it
        }
    }
    // Only a real end of input: a daemon that vanished under a write must
    // not pass for a session the peer ended.
    shared.stdin_closed.store(true, Ordering::SeqCst);
    let _ = sock.shutdown(Shutdown::Write);
}

fn lock(end: &Mutex<SessionEnd>) -> std::sync::MutexGuard<'_, SessionEnd> {
    // A panic aborts this program (panic = "abort"), so no lock is poisoned.
    end.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The last frame written to stdout, when it is short enough to be a
/// shutdown's answer.
enum Last {
    None,
    Short(Vec<u8>),
    Long,
}

fn pump_socket(mut sock: UnixStream, first: Vec<u8>, shared: &Shared) -> i32 {
    let mut stdout = fd(1);
    let mut pending: Vec<u8> = Vec::new(); // a frame whose newline is still to come
    let mut last = Last::None;
    let mut died: Option<String> = None;
    let mut buf = vec![0u8; READ_CHUNK];
    let mut data: &[u8] = &first;
    loop {
        // Whole lines go out, the rest waits for its newline. Only the new
        // chunk is searched.
        match data.iter().rposition(|&b| b == b'\n') {
            Some(i) => {
                pending.extend_from_slice(&data[..=i]);
                if stdout.write_all(&pending).is_err() {
                    return 0; // nobody reads our stdout any more
                }
                let line = last_line(&pending);
                last = if line.len() > MAX_SHUTDOWN_LINE {
                    Last::Long
                } else {
                    Last::Short(line.to_vec())
                };
                pending.clear();
                pending.extend_from_slice(&data[i + 1..]);
            }
            None => pending.extend_from_slice(data),
        }
        let n = match read_retrying(&mut sock, &mut buf) {
            Ok(n) => n,
            Err(e) => {
                died = Some(sys::strerror(&e));
                break;
            }
        };
        if n == 0 {
            break;
        }
        data = &buf[..n];
    }
    let answered = match &last {
        Last::Short(line) => lock(&shared.end).answered(line),
        Last::None | Last::Long => false,
    };
    let clean_eof = died.is_none() && shared.stdin_closed.load(Ordering::SeqCst);
    if pending.is_empty() && (clean_eof || answered) {
        return 0;
    }
    let why = if !pending.is_empty() {
        "the daemon closed the connection in the middle of a frame".to_owned()
    } else if let Some(died) = died {
        format!("the connection to the daemon broke ({died})")
    } else {
        "the daemon closed the connection".to_owned()
    };
    sys::say(2, &format!("streamd attach: {why}; the session is over"));
    1
}

fn read_retrying(from: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        match from.read(buf) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            other => return other,
        }
    }
}
