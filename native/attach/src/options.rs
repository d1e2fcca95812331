//! The command line: the same arguments as `streamd attach`, read by the
//! same rules (`streamd.resident.attach._parse`), so a Recall config can
//! name either program with the same `args`.

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;

use crate::paths;

/// How long a started daemon gets to answer before the bridge gives up. It
/// needs about 0.4 s (imports, then the socket); the rest is room for a
/// loaded machine.
pub const START_TIMEOUT: f64 = 5.0;

pub const USAGE: &str = "\
usage: streamd-attach [--eventlog] [--runtime-dir DIR] [--start-timeout S]
                      [-- DAEMON-ARGS...]

Speak the adapter protocol on stdin/stdout and relay it to the resident
streamd daemon, starting one (`streamd daemon DAEMON-ARGS...`) when none
answers: `streamd attach`, compiled. Recall config: command =
\".../streamd-attach\", args = [] (JSONL streams) or [\"--eventlog\"] (an event log).

options:
  --eventlog           the Recall source is an event log (the handshake's location
                       is the log) instead of JSONL streams
  --runtime-dir DIR    the daemon's socket directory (default $STREAMD_RUNTIME_DIR,
                       else $XDG_RUNTIME_DIR/streamd, else $XDG_STATE_HOME/streamd/run)
  --start-timeout S    how long a daemon it starts gets to answer (default 5)
  -- DAEMON-ARGS...    options for a daemon it starts (see 'streamd daemon --help')
  -h, --help           show this help and exit";

#[derive(Debug, PartialEq)]
pub struct Options {
    /// The socket directory, absolute.
    pub directory: OsString,
    pub timeout: f64,
    /// For a daemon it starts; `--runtime-dir DIR` first when one was given.
    pub daemon_args: Vec<OsString>,
    /// What this client's recall/* methods index, as its hello says it.
    pub recall_source: Option<&'static str>,
}

#[derive(Debug, PartialEq)]
pub enum Parsed {
    Run(Options),
    Help,
}

/// The options, or the one-line mistake (exit 2).
pub fn parse(argv: &[OsString]) -> Result<Parsed, String> {
    let mut recall_source = None;
    let mut directory: Option<OsString> = None;
    let mut timeout = START_TIMEOUT;
    let mut daemon_args: Vec<OsString> = Vec::new();
    let mut args = argv.iter();
    while let Some(arg) = args.next() {
        if arg == "--" {
            daemon_args = args.cloned().collect();
            break;
        }
        if arg == "-h" || arg == "--help" {
            return Ok(Parsed::Help);
        }
        if arg == "--eventlog" {
            recall_source = Some("eventlog");
            continue;
        }
        let bytes = arg.as_bytes();
        let (name, value) = match bytes.iter().position(|&b| b == b'=') {
            Some(i) => (&bytes[..i], Some(&bytes[i + 1..])),
            None => (bytes, None),
        };
        if name != b"--runtime-dir" && name != b"--start-timeout" {
            return Err(format!("unrecognized argument {}", py_repr(arg)));
        }
        let name = String::from_utf8_lossy(name);
        let value: &OsStr = match value {
            Some(v) => OsStr::from_bytes(v),
            None => args.next().ok_or_else(|| format!("{name} needs a value"))?,
        };
        if name == "--runtime-dir" {
            let absolute = paths::abspath(value)
                .map_err(|e| format!("--runtime-dir: {}", crate::sys::strerror(&e)))?;
            directory = Some(absolute);
        } else {
            timeout = seconds(value).ok_or_else(|| {
                format!(
                    "--start-timeout must be a number of seconds, not {}",
                    py_repr(value)
                )
            })?;
        }
    }
    if let Some(dir) = &directory {
        daemon_args.splice(0..0, [OsString::from("--runtime-dir"), dir.clone()]);
    }
    // Where the daemon it starts will serve: a --runtime-dir after -- too.
    let cwd = crate::launch::caller_cwd();
    let directory = match crate::launch::runtime_dir_of(&daemon_args, cwd.as_deref()) {
        Some(dir) => dir,
        None => paths::runtime_dir()
            .map_err(|e| format!("the runtime directory: {}", crate::sys::strerror(&e)))?,
    };
    Ok(Parsed::Run(Options {
        directory,
        timeout,
        daemon_args,
        recall_source,
    }))
}

/// A finite number of seconds, zero or more, as Python's `float` reads it
/// (surrounding whitespace allowed).
fn seconds(value: &OsStr) -> Option<f64> {
    let text = std::str::from_utf8(value.as_bytes()).ok()?.trim();
    // Python's float takes `_` between two digits (`1_000`); Rust's parse
    // takes none.
    let bytes = text.as_bytes();
    let grouped = |i: usize| {
        i > 0 && bytes[i - 1].is_ascii_digit() && bytes.get(i + 1).is_some_and(u8::is_ascii_digit)
    };
    if (0..bytes.len()).any(|i| bytes[i] == b'_' && !grouped(i)) {
        return None;
    }
    let n: f64 = text.replace('_', "").parse().ok()?;
    (n.is_finite() && n >= 0.0).then_some(n)
}

/// A string as Python's `repr` shows it, so that a mistake is quoted the
/// way `streamd attach` quotes it. A byte that is not UTF-8 is shown as the
/// surrogate escape Python holds it as.
pub fn py_repr(value: &OsStr) -> String {
    let lossless: Vec<Result<char, u8>> = decode(value.as_bytes());
    let has = |c: char| lossless.contains(&Ok(c));
    let quote = if has('\'') && !has('"') { '"' } else { '\'' };
    let mut out = String::new();
    out.push(quote);
    for item in lossless {
        match item {
            Err(byte) => out += &format!("\\udc{byte:02x}"),
            Ok(c) if c == quote || c == '\\' => {
                out.push('\\');
                out.push(c);
            }
            Ok('\n') => out.push_str("\\n"),
            Ok('\r') => out.push_str("\\r"),
            Ok('\t') => out.push_str("\\t"),
            Ok(c) if (c as u32) < 0x20 || (0x7f..0xa0).contains(&(c as u32)) => {
                out += &format!("\\x{:02x}", c as u32);
            }
            Ok(c) => out.push(c),
        }
    }
    out.push(quote);
    out
}

/// UTF-8 characters, and each byte that is not part of one.
fn decode(mut bytes: &[u8]) -> Vec<Result<char, u8>> {
    let mut out = Vec::with_capacity(bytes.len());
    while !bytes.is_empty() {
        match std::str::from_utf8(bytes) {
            Ok(text) => {
                out.extend(text.chars().map(Ok));
                break;
            }
            Err(e) => {
                let good = e.valid_up_to();
                // The prefix up to valid_up_to is UTF-8 by definition.
                out.extend(
                    std::str::from_utf8(&bytes[..good])
                        .unwrap_or("")
                        .chars()
                        .map(Ok),
                );
                let bad = e.error_len().unwrap_or(bytes.len() - good);
                out.extend(bytes[good..good + bad].iter().map(|&b| Err(b)));
                bytes = &bytes[good + bad..];
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(v: &[&str]) -> Vec<OsString> {
        v.iter().map(OsString::from).collect()
    }

    fn run(v: &[&str]) -> Options {
        match parse(&args(v)) {
            Ok(Parsed::Run(opts)) => opts,
            other => panic!("{v:?}: {other:?}"),
        }
    }

    #[test]
    fn the_directory_is_where_the_daemon_it_starts_serves() {
        // argparse takes the last --runtime-dir, so the daemon serves there.
        assert_eq!(run(&["--", "--runtime-dir", "/b"]).directory, OsString::from("/b"));
        assert_eq!(
            run(&["--runtime-dir", "/a", "--", "--runtime=/b/./c"]).directory,
            OsString::from("/b/c")
        );
    }

    #[test]
    fn a_runtime_dir_is_absolute_and_goes_to_the_daemon_first() {
        let opts = run(&["--runtime-dir=/r/./x", "--eventlog", "--", "--db", "e.db"]);
        assert_eq!(opts.directory, OsString::from("/r/x"));
        assert_eq!(
            opts.daemon_args,
            args(&["--runtime-dir", "/r/x", "--db", "e.db"])
        );
        assert_eq!(opts.recall_source, Some("eventlog"));
        assert_eq!(
            run(&["--runtime-dir", "/a"]).daemon_args,
            args(&["--runtime-dir", "/a"])
        );
    }

    #[test]
    fn everything_after_the_separator_is_the_daemons_even_help() {
        let opts = run(&["--start-timeout", " 2.5 ", "--", "--help", "--bogus"]);
        assert_eq!(opts.timeout, 2.5);
        assert_eq!(opts.daemon_args, args(&["--help", "--bogus"]));
        assert_eq!(opts.recall_source, None);
        assert_eq!(
            parse(&args(&["--eventlog", "-h", "--bogus"])),
            Ok(Parsed::Help)
        );
    }

    #[test]
    fn mistakes_are_said_as_streamd_attach_says_them() {
        let err = |v: &[&str]| parse(&args(v)).unwrap_err();
        assert_eq!(err(&["--bogus"]), "unrecognized argument '--bogus'");
        assert_eq!(
            err(&["--eventlog=1"]),
            "unrecognized argument '--eventlog=1'"
        );
        assert_eq!(err(&["--runtime-dir"]), "--runtime-dir needs a value");
        for bad in ["x", "-1", "inf", "nan", ""] {
            assert_eq!(
                err(&["--start-timeout", bad]),
                format!("--start-timeout must be a number of seconds, not '{bad}'")
            );
        }
        assert_eq!(run(&["--start-timeout=0"]).timeout, 0.0);
    }

    #[test]
    fn a_timeout_is_read_as_pythons_float_reads_it() {
        // Right sides: float(x) on CPython 3.11.
        for (given, want) in [
            ("1_0", 10.0),
            ("2_5.0_0", 25.0),
            ("1e1_0", 1e10),
            (" 1_0 ", 10.0),
        ] {
            assert_eq!(run(&["--start-timeout", given]).timeout, want, "{given}");
        }
        for bad in ["_1", "1_", "1__0", "1_.5"] {
            assert!(parse(&args(&["--start-timeout", bad])).is_err(), "{bad}");
        }
    }

    #[test]
    fn repr_quotes_as_python_does() {
        let r = |s: &[u8]| py_repr(OsStr::from_bytes(s));
        assert_eq!(r(b"it's"), "\"it's\"");
        assert_eq!(r(b"a'\"b"), "'a\\'\"b'");
        assert_eq!(r(b"t\tn\n\x01\\"), "'t\\tn\\n\\x01\\\\'");
        assert_eq!(r("é".as_bytes()), "'é'");
        assert_eq!(r(b"\xff"), "'\\udcff'");
    }
}
