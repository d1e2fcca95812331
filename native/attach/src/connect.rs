//! Finding this directory's daemon, or starting one, within the start
//! timeout (the rules of `streamd.resident.attach.connect`):
//!
//! * only the process that holds the directory's lock is spoken to, and only
//!   when it runs as this uid; a daemon older than this client is retired
//!   and a new one started, one as new or newer is used;
//! * every connect (a full listen queue is waited for), every hello and every
//!   poll is bounded by what is left of the timeout; a lock holder that does
//!   not answer in that time is named, "stopped" when it is;
//! * a daemon that cannot start is reported at once, in its own words.

use std::ffi::{OsStr, OsString};
use std::time::{Duration, Instant};

use crate::control::{self, Asks, ControlError, DaemonConnection, OpenError};
use crate::launch::{self, Launched};
use crate::paths::{self, show, DirError};
use crate::sys;

/// How often the socket is tried while a daemon starts.
const START_POLL: f64 = 0.01;

struct Deadline {
    seconds: f64,
    at: Instant,
}

impl Deadline {
    fn new(seconds: f64) -> Self {
        // A timeout too long for an Instant is as good as forever.
        let at = Duration::try_from_secs_f64(seconds)
            .ok()
            .and_then(|d| Instant::now().checked_add(d))
            .unwrap_or_else(|| Instant::now() + Duration::from_secs(100 * 365 * 86400));
        Self { seconds, at }
    }

    fn left(&self) -> f64 {
        self.at
            .saturating_duration_since(Instant::now())
            .as_secs_f64()
    }
}

/// A timeout as Python's `{seconds:g}` shows it in `streamd attach`'s
/// messages: six significant digits, trailing zeros dropped, and scientific
/// notation for an exponent below -4 or from 6 on (`1e-05`, `1.23457e+06`).
fn secs(seconds: f64) -> String {
    fn trimmed(digits: &str) -> &str {
        if digits.contains('.') {
            digits.trim_end_matches('0').trim_end_matches('.')
        } else {
            digits
        }
    }
    if seconds == 0.0 {
        return "0".to_owned();
    }
    // Rounded to six significant digits first: the rounding decides the
    // exponent (999999.5 is 1e+06).
    let scientific = format!("{seconds:.5e}");
    let (mantissa, exp) = scientific.split_once('e').unwrap_or((&scientific, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    if (-4..6).contains(&exp) {
        let decimals = usize::try_from(5 - exp).unwrap_or(0);
        trimmed(&format!("{seconds:.decimals$}")).to_owned()
    } else {
        let sign = if exp < 0 { '-' } else { '+' };
        format!("{}e{sign}{:02}", trimmed(mantissa), exp.abs())
    }
}

fn not_answering(pid: i32, what: &str, deadline: &Deadline) -> String {
    let why = if sys::process_state(pid) == Some('T') {
        format!("it is stopped (resume it with `kill -CONT {pid}`, or end it)")
    } else {
        "it may be swamped or hung; see its log, or end it".to_owned()
    };
    format!(
        "the daemon (pid {pid}) holds the lock but {what} within {} s: {why}",
        secs(deadline.seconds)
    )
}

/// A connection that has said hello (and the daemon's version), or None
/// when no daemon of this directory listens there.
fn probe(
    directory: &OsStr,
    sock_path: &OsStr,
    asks: &Asks,
    deadline: &Deadline,
) -> Result<Option<(DaemonConnection, String)>, String> {
    let mut conn = match DaemonConnection::open(sock_path, deadline.left()) {
        Ok(Some(conn)) => conn,
        Ok(None) => return Ok(None),
        Err(OpenError::NotAccepting) => {
            return Err(match paths::lock_holder(directory) {
                None => format!(
                    "something listens on {} but does not take connections, and no streamd \
                     daemon holds its lock",
                    show(sock_path)
                ),
                Some(pid) => not_answering(pid, "took no connection", deadline),
            })
        }
        Err(OpenError::Foreign(message)) => return Err(message),
        Err(OpenError::Io(e)) => {
            return Err(format!(
                "cannot connect to {}: {}",
                show(sock_path),
                sys::strerror(&e)
            ))
        }
    };
    // Only the lock holder is this directory's daemon. Whatever else listens
    // there (a stray server, a test's socket) is never spoken to: the daemon
    // that takes the lock replaces its socket file.
    let Some(holder) = paths::lock_holder(directory).filter(|&h| conn.peer_pid() == Some(h)) else {
        return Ok(None);
    };
    match control::hello(&mut conn, asks) {
        Ok(version) => Ok(Some((conn, version))),
        Err(ControlError::Refused(message)) => Err(format!(
            "the daemon (pid {holder}) refused this client: {message}"
        )),
        Err(ControlError::NoAnswer) => Err(not_answering(
            holder,
            "did not answer streamd/hello",
            deadline,
        )),
        // Closed or reset under us: a daemon retiring or dying. Nobody answers.
        Err(ControlError::Failed) => Ok(None),
    }
}

/// Find this directory's daemon or start one, all within `timeout`; the
/// connection, or the one line that says why not.
pub fn connect(
    directory: &OsStr,
    daemon_args: &[OsString],
    timeout: f64,
    recall_source: Option<&'static str>,
) -> Result<DaemonConnection, String> {
    let deadline = Deadline::new(timeout);
    let sock_path = paths::socket_path(directory);
    match paths::check_private_dir(directory) {
        Ok(_) => {}
        Err(DirError::Unsafe(e)) => return Err(e.0),
        Err(DirError::Io(e)) => {
            return Err(format!(
                "cannot use the runtime directory {}: {}",
                show(directory),
                sys::strerror(&e)
            ))
        }
    }
    paths::check_socket_path(&sock_path).map_err(|e| e.0)?;
    let cwd = launch::caller_cwd();
    let asks = Asks {
        db: launch::asked_db(daemon_args, cwd.as_deref()),
        cwd: cwd.clone(),
        recall_source,
    };
    if let Some((mut conn, version)) = probe(directory, &sock_path, &asks, &deadline)? {
        if control::version_key(&version) >= control::version_key(env!("STREAMD_VERSION")) {
            return ready(conn);
        }
        // An older daemon: let it finish its clients while a new one serves.
        // Gone already is as good.
        let _ = conn.call("streamd/retire", "{}", control::RETIRE_ID);
    }
    start(
        directory,
        &sock_path,
        daemon_args,
        cwd.as_deref(),
        &asks,
        &deadline,
    )
}

/// The connection, its waits unbounded from now on: the relay blocks.
fn ready(conn: DaemonConnection) -> Result<DaemonConnection, String> {
    let cleared = conn
        .sock
        .set_read_timeout(None)
        .and(conn.sock.set_write_timeout(None));
    cleared.map_err(|e| format!("cannot use the connection: {}", sys::strerror(&e)))?;
    Ok(conn)
}

fn start(
    directory: &OsStr,
    sock_path: &OsStr,
    daemon_args: &[OsString],
    cwd: Option<&OsStr>,
    asks: &Asks,
    deadline: &Deadline,
) -> Result<DaemonConnection, String> {
    let mut daemon = Launched::start(daemon_args, cwd)
        .map_err(|e| format!("cannot start a daemon: {}", sys::strerror(&e)))?;
    let found = wait_for_daemon(&mut daemon, directory, sock_path, asks, deadline);
    daemon.close();
    match found {
        Ok(Some(conn)) => ready(conn),
        Err(why) => Err(why),
        Ok(None) => {
            let why = if daemon.exited() {
                "it exited"
            } else {
                "it still runs"
            };
            Err(format!(
                "started a daemon (pid {}) but nothing answered on {} within {} s ({why}); see \
                 {} or run `streamd daemon` to see why",
                daemon.pid,
                show(sock_path),
                secs(deadline.seconds),
                launch::log_file(daemon_args)
            ))
        }
    }
}

/// Probe until the started daemon (or the one that won a race to start)
/// answers, it has exited with nobody serving, or time is up (None).
fn wait_for_daemon(
    daemon: &mut Launched,
    directory: &OsStr,
    sock_path: &OsStr,
    asks: &Asks,
    deadline: &Deadline,
) -> Result<Option<DaemonConnection>, String> {
    loop {
        if let Some((conn, _)) = probe(directory, sock_path, asks, deadline)? {
            return Ok(Some(conn));
        }
        if deadline.left() <= 0.0 {
            return Ok(None);
        }
        if daemon.wait(START_POLL.min(deadline.left())) {
            // Its pipe has ended: it serves (the next probe finds it), or it
            // exited, and then only a lost race is worth waiting on.
            if daemon.exited() && paths::lock_holder(directory).is_none() {
                return Err(format!(
                    "{}; nothing serves on {}",
                    daemon.reason(),
                    show(sock_path)
                ));
            }
            std::thread::sleep(Duration::from_secs_f64(START_POLL.min(deadline.left())));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_timeout_is_shown_as_pythons_g_format_shows_it() {
        // Right sides: format(x, "g") on CPython 3.11.
        let cases = [
            (5.0, "5"),
            (2.5, "2.5"),
            (30.0, "30"),
            (0.0, "0"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (1234567.0, "1.23457e+06"),
            (0.1234567, "0.123457"),
            (100000.0, "100000"),
            (1e6, "1e+06"),
            (999999.5, "1e+06"),
            (1e300, "1e+300"),
            (1e-300, "1e-300"),
        ];
        for (seconds, shown) in cases {
            assert_eq!(secs(seconds), shown, "{seconds}");
        }
    }
}
