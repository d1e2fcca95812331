//! One blocking connection to the daemon socket and the control calls the
//! bridge makes on it (`streamd/hello`, `streamd/retire`): the rules of
//! `streamd.resident.control`.

use std::ffi::OsStr;
use std::io::{self, Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::UnixStream;

use serde_json::Value;

use crate::paths::show;
use crate::sys;

pub const HELLO_ID: &str = "streamd-attach-hello";
pub const RETIRE_ID: &str = "streamd-attach-retire";
const READ_CHUNK: usize = 1 << 16;

pub enum ControlError {
    /// The daemon answered the call with an error (it runs, and said no).
    Refused(String),
    /// It took the connection but did not answer in time.
    NoAnswer,
    /// It answered nonsense, or went away: as good as nobody answering,
    /// which is all the bridge makes of it.
    Failed,
}

pub enum OpenError {
    /// Something listens but its queue of pending connections stayed full.
    NotAccepting,
    /// The listener runs as another user.
    Foreign(String),
    Io(io::Error),
}

pub struct DaemonConnection {
    pub sock: UnixStream,
    /// Bytes read past the last answer taken (kept for the relay).
    pub buffer: Vec<u8>,
}

impl DaemonConnection {
    /// Connect, or None when nobody listens there (no file, a stale file).
    /// A full listen queue is waited for up to `timeout`; calls on the
    /// connection then wait `timeout`.
    pub fn open(path: &OsStr, timeout: f64) -> Result<Option<Self>, OpenError> {
        let sock = match sys::connect_waiting(path, timeout) {
            Ok(sock) => sock,
            Err(e) => {
                return match e.raw_os_error() {
                    Some(libc::ENOENT | libc::ECONNREFUSED | libc::ECONNRESET) => Ok(None),
                    Some(libc::EAGAIN) => Err(OpenError::NotAccepting),
                    _ => Err(OpenError::Io(e)),
                }
            }
        };
        sys::set_timeouts(&sock, timeout).map_err(OpenError::Io)?;
        let (_, uid) = sys::peer_cred(&sock).map_err(OpenError::Io)?;
        if uid != sys::geteuid() {
            return Err(OpenError::Foreign(format!(
                "the server on {} runs as uid {uid}, not as this user",
                show(path)
            )));
        }
        Ok(Some(Self {
            sock,
            buffer: Vec::new(),
        }))
    }

    /// The process that listens on the socket (it called listen(2)).
    pub fn peer_pid(&self) -> Option<i32> {
        sys::peer_cred(&self.sock).ok().map(|(pid, _)| pid)
    }

    /// Send one request and wait for the answer with its id.
    pub fn call(&mut self, method: &str, params: &str, id: &str) -> Result<Value, ControlError> {
        let frame = format!(
            "{{\"jsonrpc\": \"2.0\", \"id\": \"{id}\", \"method\": \"{method}\", \"params\": {params}}}\n"
        );
        let failed = |e: io::Error| {
            if matches!(
                e.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
            ) {
                ControlError::NoAnswer
            } else {
                ControlError::Failed
            }
        };
        // A daemon that refused the connection may have closed it before the
        // request went out: what it said is still there to read.
        let unsent = match self.sock.write_all(frame.as_bytes()) {
            Err(e) if matches!(e.kind(), io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset) => {
                Some(e)
            }
            other => {
                other.map_err(failed)?;
                None
            }
        };
        let reply = loop {
            let line = match self.line() {
                Ok(Some(line)) => line,
                Ok(None) => return Err(ControlError::Failed), // it closed the connection
                Err(e) => return Err(failed(unsent.unwrap_or(e))),
            };
            let Ok(reply) = serde_json::from_slice::<Value>(&line) else {
                return Err(ControlError::Failed); // a line that is not JSON
            };
            // An error with no id: the daemon refused the connection.
            let refused = reply.get("id").is_some_and(Value::is_null) && reply.get("error").is_some();
            if refused || reply.get("id").and_then(Value::as_str) == Some(id) {
                break reply;
            }
        };
        if let Some(err) = reply.get("error") {
            let message = match err.get("message") {
                Some(Value::String(s)) => s.clone(),
                Some(other) => other.to_string(),
                None => "None".to_owned(),
            };
            return Err(ControlError::Refused(message));
        }
        Ok(reply.get("result").cloned().unwrap_or(Value::Null))
    }

    fn line(&mut self) -> io::Result<Option<Vec<u8>>> {
        loop {
            if let Some(end) = self.buffer.iter().position(|&b| b == b'\n') {
                let rest = self.buffer.split_off(end + 1);
                let mut line = std::mem::replace(&mut self.buffer, rest);
                line.pop();
                return Ok(Some(line));
            }
            let mut chunk = vec![0u8; READ_CHUNK];
            // A read with SO_RCVTIMEO fails with EINTR when the process is
            // stopped and continued; Python's recv retries it (PEP 475), and
            // an interrupted hello is no daemon gone.
            let n = match self.sock.read(&mut chunk) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                other => other?,
            };
            if n == 0 {
                return Ok(None);
            }
            self.buffer.extend_from_slice(&chunk[..n]);
        }
    }
}

/// What a client asks of the daemon in its hello, besides its version.
#[derive(Default)]
pub struct Asks {
    pub cwd: Option<std::ffi::OsString>,
    pub db: Option<std::ffi::OsString>,
    pub recall_source: Option<&'static str>,
}

/// Say hello; the daemon's answer (its version string), or why not.
pub fn hello(conn: &mut DaemonConnection, asks: &Asks) -> Result<String, ControlError> {
    let mut params = format!(
        "{{\"client_version\": {}",
        json_str(env!("STREAMD_VERSION").as_bytes())
    );
    for (key, value) in [
        ("cwd", asks.cwd.as_deref().map(OsStr::as_bytes)),
        ("db", asks.db.as_deref().map(OsStr::as_bytes)),
        ("recall_source", asks.recall_source.map(str::as_bytes)),
    ] {
        if let Some(value) = value.filter(|v| !v.is_empty()) {
            params += &format!(", \"{key}\": {}", json_str(value));
        }
    }
    params.push('}');
    let result = conn.call("streamd/hello", &params, HELLO_ID)?;
    match result.get("version") {
        Some(Value::String(version)) if result.is_object() => Ok(version.clone()),
        _ => Err(ControlError::Failed), // an answer that is no hello's
    }
}

/// A JSON string of `bytes` as Python's `json.dumps` writes a `str` made of
/// them with `surrogateescape` (how Python holds a path that is not UTF-8):
/// ASCII only, a byte that is not UTF-8 as the escape `\udcXX`.
pub fn json_str(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len() + 2);
    out.push('"');
    let mut rest = bytes;
    while !rest.is_empty() {
        let (good, bad) = match std::str::from_utf8(rest) {
            Ok(s) => (s, None),
            Err(e) => {
                let (good, _) = rest.split_at(e.valid_up_to());
                let bad_len = e.error_len().unwrap_or(rest.len() - e.valid_up_to());
                // SAFETY-free: valid_up_to bytes are UTF-8 by definition.
                (std::str::from_utf8(good).unwrap_or(""), Some(bad_len))
            }
        };
        for ch in good.chars() {
            match ch {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                '\t' => out.push_str("\\t"),
                '\u{8}' => out.push_str("\\b"),
                '\u{c}' => out.push_str("\\f"),
                c if (c as u32) < 0x20 || (c as u32) > 0x7e => {
                    let mut units = [0u16; 2];
                    for unit in c.encode_utf16(&mut units) {
                        out += &format!("\\u{unit:04x}");
                    }
                }
                c => out.push(c),
            }
        }
        let consumed = good.len();
        match bad {
            None => break,
            Some(n) => {
                for b in &rest[consumed..consumed + n] {
                    out += &format!("\\udc{b:02x}");
                }
                rest = &rest[consumed + n..];
            }
        }
    }
    out.push('"');
    out
}

/// `"0.10.2"` -> `[0, 10, 2]`: the leading digits of each dotted part,
/// trailing zeros dropped, so a local suffix compares by its numbers.
pub fn version_key(version: &str) -> Vec<u64> {
    let mut key: Vec<u64> = version
        .split('.')
        .map(|part| {
            let digits: String = part.chars().take_while(char::is_ascii_digit).collect();
            digits.parse().unwrap_or(0)
        })
        .collect();
    while key.last() == Some(&0) {
        key.pop();
    }
    key
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_with_no_id_is_the_daemon_refusing_the_connection() {
        // What a daemon serving as many connections as it takes writes before
        // it closes; an answer to someone else's id is still skipped.
        let (ours, mut daemon) = UnixStream::pair().unwrap();
        sys::set_timeouts(&ours, 60.0).unwrap();
        daemon
            .write_all(concat!(
                "{\"jsonrpc\":\"2.0\",\"id\":\"other\",\"result\":{}}\n",
                "{\"jsonrpc\":\"2.0\",\"id\":null,\"error\":{\"code\":-32000,",
                "\"message\":\"streamd serves at most 512 connections at once\"}}\n",
            ).as_bytes())
            .unwrap();
        drop(daemon);
        let mut conn = DaemonConnection { sock: ours, buffer: Vec::new() };
        match conn.call("streamd/hello", "{}", HELLO_ID) {
            Err(ControlError::Refused(m)) => {
                assert_eq!(m, "streamd serves at most 512 connections at once")
            }
            Err(_) => panic!("not read as a refusal"),
            Ok(v) => panic!("an answer: {v}"),
        }
    }

    #[test]
    fn strings_are_escaped_as_python_json_dumps_escapes_them() {
        // Right sides: json.dumps(b.decode("utf-8", "surrogateescape")).
        assert_eq!(json_str(b"/tmp/a b"), r#""/tmp/a b""#);
        assert_eq!(json_str(b"q\"\\\n\x01"), r#""q\"\\\n\u0001""#);
        assert_eq!(json_str("é😀".as_bytes()), r#""\u00e9\ud83d\ude00""#);
        assert_eq!(json_str(b"a\xffb\xc3"), r#""a\udcffb\udcc3""#);
        assert_eq!(json_str(b"\x7f"), r#""\u007f""#);
    }

    #[test]
    fn versions_compare_by_their_numbers() {
        assert_eq!(version_key("0.10.2"), vec![0, 10, 2]);
        assert_eq!(version_key("1.0rc1"), vec![1]);
        assert_eq!(version_key("0.2.0.dev1"), vec![0, 2]);
        assert!(version_key("0.10.0") > version_key("0.9.9"));
        assert_eq!(version_key("1.0"), version_key("1"));
    }
}

#[cfg(test)]
mod interrupted {
    use super::*;
    use crate::sys::interrupting;

    #[test]
    fn a_call_interrupted_while_it_waits_for_its_answer_goes_on_waiting() {
        let (ours, mut daemon) = UnixStream::pair().unwrap();
        sys::set_timeouts(&ours, 60.0).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let caller = std::thread::spawn(move || {
            tx.send(interrupting::tid()).unwrap();
            let mut conn = DaemonConnection {
                sock: ours,
                buffer: Vec::new(),
            };
            conn.call("streamd/hello", "{}", HELLO_ID)
                .map_err(|e| match e {
                    ControlError::Refused(m) => format!("refused: {m}"),
                    ControlError::NoAnswer => "no answer".to_owned(),
                    ControlError::Failed => "failed".to_owned(),
                })
        });
        let tid = rx.recv().unwrap();
        let mut request = [0u8; 256];
        let n = daemon.read(&mut request).unwrap(); // the request is out: it reads now
        assert!(request[..n].ends_with(b"\n"));
        interrupting::interrupt_in(&caller, tid, libc::SYS_recvfrom, 3);
        // Fails when the call gave up and closed: the assertion says so.
        let _ = daemon
            .write_all(b"{\"id\": \"streamd-attach-hello\", \"result\": {\"version\": \"9\"}}\n");
        let got = caller.join().unwrap();
        assert_eq!(
            got.ok().and_then(|r| r.get("version").cloned()),
            Some(Value::from("9"))
        );
    }
}
