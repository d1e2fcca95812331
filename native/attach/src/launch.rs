//! Starting a resident daemon for a client, and the paths it is handed: the
//! rules of `streamd.resident.launch`.
//!
//! The daemon runs in `/`, so every path a client hands it is made absolute
//! against the client's working directory first (`--db`, `--log-file`,
//! `--runtime-dir` in any spelling argparse takes, `STREAMD_DB`,
//! `STREAMD_RUNTIME_DIR`, and a relative `HOME`). Its stderr is a pipe to the client until it serves;
//! a daemon that exits first leaves what it said there.

use std::ffi::{OsStr, OsString};
use std::fs;
use std::io::{self, Read};
use std::os::fd::AsRawFd;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStderr, Command, ExitStatus, Stdio};

use crate::paths::{self, join, normpath, show};
use crate::sys;

pub const STARTUP_PIPE_ENV: &str = "STREAMD_STARTUP_PIPE";
/// When the daemon was spawned (`streamd.resident.stopmark`).
pub const SPAWNED_AT_ENV: &str = "STREAMD_SPAWNED_AT";
const MAX_SAID: usize = 1 << 16;
const PATH_OPTIONS: [&str; 3] = ["--db", "--log-file", "--runtime-dir"];
const VALUE_OPTIONS: [&str; 11] = [
    "--db",
    "--log-file",
    "--runtime-dir",
    "--watch-interval-ms",
    "--watch-buffer-bytes",
    "--synchronous",
    "--idle-exit",
    "--source-idle",
    "--max-sources",
    "--max-connections",
    "--announce-version",
];
const FLAG_OPTIONS: [&str; 4] = ["--verbose", "-v", "--help", "-h"];

/// A database server's address, not a path: a `scheme://` URL or a libpq
/// `keyword=value` string.
fn is_url(value: &[u8]) -> bool {
    let scheme = value.first().is_some_and(u8::is_ascii_alphabetic) && {
        let n = value
            .iter()
            .take_while(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'.' | b'-'))
            .count();
        value[n..].starts_with(b"://")
    };
    let keyword = {
        let n = value
            .iter()
            .take_while(|b| b.is_ascii_lowercase() || **b == b'_')
            .count();
        n > 0 && value[n..].iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'=')
    };
    scheme || keyword
}

/// `value` as a path the daemon reads the same from `/`.
pub fn absolute(value: &OsStr, cwd: &OsStr) -> OsString {
    if value.is_empty() || is_url(value.as_bytes()) {
        return value.to_owned();
    }
    normpath(&join(cwd, &sys::expand_user(value)))
}

/// The daemon option `name` spells (itself, or an unambiguous prefix).
fn option(name: &[u8]) -> Option<&'static str> {
    let all = VALUE_OPTIONS.iter().chain(FLAG_OPTIONS.iter());
    if let Some(exact) = all.clone().find(|o| o.as_bytes() == name) {
        return Some(exact);
    }
    if !name.starts_with(b"--") || name.len() < 3 {
        return None;
    }
    let mut matches = all.filter(|o| o.as_bytes().starts_with(name));
    match (matches.next(), matches.next()) {
        (Some(only), None) => Some(only),
        _ => None,
    }
}

fn split_eq(arg: &[u8]) -> (&[u8], Option<&[u8]>) {
    match arg.iter().position(|&b| b == b'=') {
        Some(i) => (&arg[..i], Some(&arg[i + 1..])),
        None => (arg, None),
    }
}

fn path_value(option: &str, value: &[u8], cwd: &OsStr) -> OsString {
    if option == "--log-file" && value == b"-" {
        return OsString::from("-");
    }
    absolute(OsStr::from_bytes(value), cwd)
}

/// The daemon's arguments with every path value made absolute; anything else
/// (a mistake included, which the daemon then reports) unchanged.
pub fn absolute_args(args: &[OsString], cwd: &OsStr) -> Vec<OsString> {
    let mut out = Vec::with_capacity(args.len());
    let mut rest = args.iter();
    while let Some(arg) = rest.next() {
        if arg == "--" {
            out.push(arg.clone());
            out.extend(rest.cloned());
            break;
        }
        let (name, value) = split_eq(arg.as_bytes());
        let opt = option(name);
        match (opt, value) {
            (Some(o), Some(v)) if PATH_OPTIONS.contains(&o) => {
                let mut spelled = name.to_vec();
                spelled.push(b'=');
                spelled.extend_from_slice(path_value(o, v, cwd).as_bytes());
                out.push(OsString::from_vec(spelled));
            }
            (Some(o), None) if VALUE_OPTIONS.contains(&o) => {
                out.push(arg.clone());
                if let Some(v) = rest.next() {
                    out.push(if PATH_OPTIONS.contains(&o) {
                        path_value(o, v.as_bytes(), cwd)
                    } else {
                        v.clone()
                    });
                }
            }
            _ => out.push(arg.clone()),
        }
    }
    out
}

/// The last value of option `wanted` among `args` (argparse's rule).
fn given(args: &[OsString], wanted: &str) -> Option<OsString> {
    let mut found = None;
    let mut rest = args.iter();
    while let Some(arg) = rest.next() {
        if arg == "--" {
            break;
        }
        let (name, mut value) = split_eq(arg.as_bytes());
        let opt = option(name);
        if value.is_none() && opt.is_some_and(|o| VALUE_OPTIONS.contains(&o)) {
            match rest.next() {
                Some(v) => value = Some(v.as_bytes()),
                None => break,
            }
        }
        if opt == Some(wanted) {
            found = value.map(|v| OsStr::from_bytes(v).to_owned());
        }
    }
    found
}

/// The socket directory a daemon started with `args` serves: its last
/// `--runtime-dir`, absolute as `absolute_args` hands it over; None when they
/// name none. A client must look for the daemon there, or it starts one it
/// never finds.
pub fn runtime_dir_of(args: &[OsString], cwd: Option<&OsStr>) -> Option<OsString> {
    let value = given(args, "--runtime-dir").filter(|v| !v.is_empty())?;
    Some(absolute(&value, cwd.unwrap_or(OsStr::new("/"))))
}

/// The event log a client was told to use, as its hello says it.
pub fn asked_db(args: &[OsString], cwd: Option<&OsStr>) -> Option<OsString> {
    let db = given(args, "--db")
        .filter(|v| !v.is_empty())
        .or_else(|| std::env::var_os("STREAMD_DB"))
        .filter(|v| !v.is_empty())?;
    let expanded = sys::expand_user(&db);
    if cwd.is_some() || expanded.as_bytes().starts_with(b"/") || is_url(db.as_bytes()) {
        return Some(absolute(&db, cwd.unwrap_or(OsStr::new("/"))));
    }
    None
}

/// Where a daemon started with `args` logs (for messages).
pub fn log_file(args: &[OsString]) -> String {
    match given(args, "--log-file") {
        Some(v) if v == "-" => "its stderr".to_owned(),
        Some(v) if !v.is_empty() => show(&v),
        _ => show(&paths::log_path()),
    }
}

/// This process's working directory, or None when it was removed.
pub fn caller_cwd() -> Option<OsString> {
    std::env::current_dir().ok().map(PathBuf::into_os_string)
}

/// The Python that runs streamd here: the interpreter named by the `streamd`
/// script installed beside this executable (what pip wrote for the install
/// this bridge came with), else a `python3` beside it.
pub fn interpreter() -> io::Result<Vec<OsString>> {
    let exe = std::env::current_exe()?;
    let dir = exe.parent().unwrap_or(Path::new("/"));
    if let Some(found) = fs::read(dir.join("streamd")).ok().and_then(|s| shebang(&s)) {
        return Ok(found);
    }
    let beside = dir.join("python3");
    if beside.is_file() {
        return Ok(vec![beside.into_os_string()]);
    }
    Err(io::Error::new(
        io::ErrorKind::NotFound,
        format!(
            "no 'streamd' script or 'python3' beside {} to run it with (streamd-attach \
             belongs in the bin directory of a streamd install)",
            exe.display()
        ),
    ))
}

/// The program (and its argument) of a script's `#!` line. pip writes
/// `#!/bin/sh` and an `exec` line for an interpreter path too long or with
/// spaces; that interpreter is taken from the `exec` line.
fn shebang(script: &[u8]) -> Option<Vec<OsString>> {
    let mut lines = script.split(|&b| b == b'\n');
    let first = lines.next()?.strip_prefix(b"#!")?;
    let words: Vec<OsString> = first
        .split(|b| b.is_ascii_whitespace())
        .filter(|w| !w.is_empty())
        .map(|w| OsStr::from_bytes(w).to_owned())
        .collect();
    if words
        .first()
        .is_some_and(|w| w.as_bytes().ends_with(b"/sh"))
    {
        let exec = lines.next()?.strip_prefix(b"'''exec' \"")?;
        let end = exec.iter().position(|&b| b == b'"')?;
        return Some(vec![OsStr::from_bytes(&exec[..end]).to_owned()]);
    }
    (!words.is_empty()).then_some(words)
}

/// A `streamd daemon` this process started, with its startup pipe.
pub struct Launched {
    child: Child,
    pub pid: u32,
    pipe: Option<ChildStderr>,
    said: Vec<u8>,
    status: Option<ExitStatus>,
}

impl Launched {
    pub fn start(daemon_args: &[OsString], cwd: Option<&OsStr>) -> io::Result<Self> {
        let base = cwd.unwrap_or(OsStr::new("/"));
        let python = interpreter()?;
        // Whatever our parent left open must not stay open in the daemon,
        // which outlives it (the core waits for its pipes to close).
        sys::close_inherited_on_exec();
        let mut command = Command::new(&python[0]);
        command
            .args(&python[1..])
            .args(["-m", "streamd", "daemon"])
            .args(absolute_args(daemon_args, base))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .current_dir("/")
            .env(STARTUP_PIPE_ENV, "1");
        // Before the spawn: a stop asked from here on holds it back. (Unread,
        // the clock says nothing, and the daemon serves whatever was asked.)
        match sys::boot_clock() {
            Some(now) => command.env(SPAWNED_AT_ENV, format!("{now:.6}")),
            None => command.env_remove(SPAWNED_AT_ENV),
        };
        for name in ["STREAMD_DB", "STREAMD_RUNTIME_DIR"] {
            if let Some(value) = std::env::var_os(name).filter(|v| !v.is_empty()) {
                command.env(name, absolute(&value, base));
            }
        }
        // The default runtime directory, log and event log all hang off HOME:
        // a relative one would name them under "/" for the daemon and under
        // our directory for us, and we would never find it.
        if let Some(home) = std::env::var_os("HOME") {
            if !home.is_empty() && !home.as_bytes().starts_with(b"/") {
                command.env("HOME", normpath(&join(base, &home)));
            }
        }
        // SAFETY: setsid is async-signal-safe; the daemon gets a session (and
        // so a process group) of its own, which the core's signals miss.
        unsafe {
            command.pre_exec(|| {
                if libc::setsid() < 0 {
                    return Err(io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let mut child = command.spawn()?;
        let pid = child.id();
        let pipe = child.stderr.take();
        Ok(Self {
            child,
            pid,
            pipe,
            said: Vec::new(),
            status: None,
        })
    }

    /// Wait up to `timeout` for the daemon to say something or detach; true
    /// once its pipe has ended (it serves, or it exited: [`Self::exited`]).
    pub fn wait(&mut self, timeout: f64) -> bool {
        let Some(pipe) = self.pipe.as_mut() else {
            return true;
        };
        if !sys::readable(pipe.as_raw_fd(), timeout).unwrap_or(true) {
            return false;
        }
        let mut chunk = vec![0u8; MAX_SAID];
        match pipe.read(&mut chunk) {
            Ok(n) if n > 0 => {
                self.said.extend_from_slice(&chunk[..n]);
                let excess = self.said.len().saturating_sub(MAX_SAID);
                self.said.drain(..excess);
                false
            }
            _ => {
                self.pipe = None;
                true
            }
        }
    }

    /// Whether the daemon has exited (and is reaped).
    pub fn exited(&mut self) -> bool {
        if self.status.is_none() {
            match self.child.try_wait() {
                Ok(status) => self.status = status,
                Err(_) => return true,
            }
        }
        self.status.is_some()
    }

    /// How it ended and the last thing it said, in one line.
    pub fn reason(&self) -> String {
        let how = match self.status {
            Some(s) if s.signal().is_some() => {
                format!("was killed by signal {}", s.signal().unwrap_or(0))
            }
            Some(s) => format!("exited with status {}", s.code().unwrap_or(0)),
            None => "exited".to_owned(),
        };
        let text = String::from_utf8_lossy(&self.said);
        let said = match text.lines().map(str::trim).rfind(|l| !l.is_empty()) {
            Some(line) => format!(": {line}"),
            None => ", saying nothing".to_owned(),
        };
        format!("the daemon it started (pid {}) {how}{said}", self.pid)
    }

    pub fn close(&mut self) {
        self.pipe = None;
        // Reaps a daemon that lost the lock race.
        self.exited();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strs(v: &[OsString]) -> Vec<String> {
        v.iter().map(|s| show(s)).collect()
    }

    fn os(v: &[&str]) -> Vec<OsString> {
        v.iter().map(OsString::from).collect()
    }

    #[test]
    fn urls_and_keyword_strings_are_not_paths() {
        for url in [
            "postgresql://u@h/db",
            "mysql://h/db",
            "host=db1 dbname=x",
            "a_b =1",
        ] {
            assert!(is_url(url.as_bytes()), "{url}");
        }
        for path in ["log.db", "./host=x", "/a/b", "1x://y", "Host=x", ""] {
            assert!(!is_url(path.as_bytes()), "{path}");
        }
    }

    #[test]
    fn every_spelling_of_a_path_option_is_made_absolute() {
        let args = os(&[
            "--db",
            "a.db",
            "--log-file=l.txt",
            "--run",
            "r",
            "--idle-exit",
            "x.db",
            "--log-file",
            "-",
            "--",
            "--db",
            "b.db",
        ]);
        assert_eq!(
            strs(&absolute_args(&args, OsStr::new("/home/u"))),
            [
                "--db",
                "/home/u/a.db",
                "--log-file=/home/u/l.txt",
                "--run",
                "/home/u/r",
                "--idle-exit",
                "x.db",
                "--log-file",
                "-",
                "--",
                "--db",
                "b.db",
            ]
        );
        let url = os(&["--d", "postgresql://h/x"]);
        assert_eq!(
            strs(&absolute_args(&url, OsStr::new("/c"))),
            ["--d", "postgresql://h/x"]
        );
    }

    #[test]
    fn the_last_value_given_wins_and_an_ambiguous_prefix_is_no_option() {
        let args = os(&["--db", "a", "--db=b", "--log", "x"]);
        assert_eq!(given(&args, "--db").map(|v| show(&v)), Some("b".into()));
        assert_eq!(option(b"--s"), None); // --synchronous or --source-idle
        assert_eq!(option(b"--sy"), Some("--synchronous"));
    }

    #[test]
    fn the_interpreter_is_read_from_a_script_line() {
        let plain = shebang(b"#!/v/bin/python3\nimport x\n").unwrap();
        assert_eq!(strs(&plain), ["/v/bin/python3"]);
        let env = shebang(b"#!/usr/bin/env python3\n").unwrap();
        assert_eq!(strs(&env), ["/usr/bin/env", "python3"]);
        let long = shebang(b"#!/bin/sh\n'''exec' \"/a b/python\" \"$0\" \"$@\"\n' '''\n").unwrap();
        assert_eq!(strs(&long), ["/a b/python"]);
        assert!(shebang(b"no line").is_none());
    }
}
