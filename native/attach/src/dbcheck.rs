//! The daemon's `--db` refused before a daemon is started with it, as
//! `streamd attach` refuses it (`streamd.eventlog.dbtarget.argv_error`): a
//! password there would show in `ps` for the daemon's whole life, and a
//! mistyped directory must fail rather than be served.
//!
//! A plain file name (no `:`, no `=`) is a SQLite file by every rule of
//! `dbtarget`, and is checked here, at no cost. Anything else (a URL, a libpq
//! string, an odd spelling) is read by streamd's own parser, in the Python
//! streamd runs on, fed the arguments on a pipe (never on a command line):
//! one parser of database strings, not two that could disagree on where a
//! password is.

use std::ffi::{OsStr, OsString};
use std::io::{Read, Write};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::Path;
use std::process::{Command, Stdio};

use crate::launch;
use crate::paths;
use crate::sys;

const CHECK: &str = "import os, sys\n\
from streamd.eventlog.dbtarget import argv_error\n\
args = [os.fsdecode(a) for a in sys.stdin.buffer.read().split(b'\\0')]\n\
sys.stdout.buffer.write((argv_error(args) or '').encode('utf-8', 'surrogateescape'))\n";

/// The `--db` values `argv_error` reads: `--db VALUE` and `--db=VALUE`, and
/// the same with `--d`, the prefix argparse also takes for it.
fn db_values(args: &[OsString]) -> Vec<&[u8]> {
    let mut out = Vec::new();
    for (i, arg) in args.iter().enumerate() {
        let arg = arg.as_bytes();
        let (name, value) = match arg.iter().position(|&b| b == b'=') {
            Some(at) => (&arg[..at], Some(&arg[at + 1..])),
            None => (arg, None),
        };
        if name != b"--db" && name != b"--d" {
            continue;
        }
        match value {
            Some(value) => out.push(value),
            None => {
                if let Some(next) = args.get(i + 1) {
                    out.push(next.as_bytes());
                }
            }
        }
    }
    out
}

/// Why the daemon must not be started with `args`, in one line, or None.
/// Err: the check itself could not be made.
pub fn argv_error(args: &[OsString]) -> Result<Option<String>, String> {
    let values = db_values(args);
    if values.iter().all(|v| plain_file(v)) {
        return Ok(values.iter().find_map(|v| sqlite_error(v)));
    }
    ask_streamd(args)
}

/// Read by dbtarget's rules as a SQLite file, whatever else it says: no
/// scheme (`:`), no keyword (`=`), not blank, no NUL, UTF-8.
fn plain_file(value: &[u8]) -> bool {
    std::str::from_utf8(value)
        .is_ok_and(|text| !text.trim().is_empty() && !text.contains([':', '=', '\0']))
}

/// `DbTarget.file_error` of a file given as an argument: it is a directory
/// or another file that is not a regular one (a device, a named pipe, a
/// socket), or the directory it would be made in is missing.
fn sqlite_error(value: &[u8]) -> Option<String> {
    let shown = sys::expand_user(OsStr::from_bytes(value));
    let (whole, parent) = pure_path(shown.as_bytes());
    let described = String::from_utf8_lossy(shown.as_bytes()).into_owned();
    let whole = OsString::from_vec(whole);
    if let Ok(meta) = std::fs::metadata(&whole) {
        let kind = meta.file_type();
        if kind.is_dir() {
            return Some(format!(
                "--db: event log database {described}: is a directory; give a file path"
            ));
        }
        if !kind.is_file() {
            return Some(format!(
                "--db: event log database {described}: is a {}, not a regular file; give a \
                 file path",
                special_kind(&kind)
            ));
        }
    }
    let parent_path = OsString::from_vec(parent);
    let parent_path = Path::new(&parent_path);
    if parent_path.is_dir() {
        return None;
    }
    let what = if parent_path.exists() {
        "is not a directory"
    } else {
        "does not exist"
    };
    Some(format!(
        "--db: event log database {described}: directory {} {what} (create it first: only \
         the default location is created)",
        parent_path.display()
    ))
}

/// What dbtarget's `_special_kind` calls a file that is neither a regular
/// file nor a directory.
fn special_kind(kind: &std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if kind.is_fifo() {
        "named pipe (FIFO)"
    } else if kind.is_char_device() {
        "character device"
    } else if kind.is_block_device() {
        "block device"
    } else if kind.is_socket() {
        "socket"
    } else {
        "special file"
    }
}

/// `str(Path(p))` and `str(Path(p).parent)`, by pathlib's rules: repeated
/// slashes and `.` parts dropped, `..` kept, exactly two leading slashes kept.
fn pure_path(p: &[u8]) -> (Vec<u8>, Vec<u8>) {
    let root = paths::root(p);
    let parts: Vec<&[u8]> = p
        .split(|&b| b == b'/')
        .filter(|part| !part.is_empty() && *part != b".")
        .collect();
    let parent = &parts[..parts.len().saturating_sub(1)];
    (paths::rooted(root, &parts), paths::rooted(root, parent))
}

/// `argv_error(args)` asked of streamd itself, the arguments on a pipe.
fn ask_streamd(args: &[OsString]) -> Result<Option<String>, String> {
    let python = launch::interpreter().map_err(|e| sys::strerror(&e))?;
    let cannot = |why: String| {
        format!(
            "cannot check the daemon's --db with {}: {why}",
            python[0].to_string_lossy()
        )
    };
    let mut child = Command::new(&python[0])
        .args(&python[1..])
        // -P: `-c` would put the working directory first on sys.path, and a
        // `streamd` package there would be run, handed the arguments and any
        // password in them. The `streamd` script reads the installed streamd;
        // so must this. (The working directory is kept: a relative --db is
        // checked against it.)
        .args(["-P", "-c", CHECK])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| cannot(sys::strerror(&e)))?;
    let input = args
        .iter()
        .map(|a| a.as_bytes())
        .collect::<Vec<_>>()
        .join(&0u8);
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(&input)
            .map_err(|e| cannot(sys::strerror(&e)))?;
    }
    let mut said = Vec::new();
    if let Some(mut stdout) = child.stdout.take() {
        stdout
            .read_to_end(&mut said)
            .map_err(|e| cannot(sys::strerror(&e)))?;
    }
    let status = child.wait().map_err(|e| cannot(sys::strerror(&e)))?;
    if !status.success() {
        return Err(cannot(format!("it ended with {status}")));
    }
    let said = String::from_utf8_lossy(&said).trim().to_owned();
    Ok((!said.is_empty()).then_some(said))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pp(p: &str) -> (String, String) {
        let (a, b) = pure_path(p.as_bytes());
        (String::from_utf8(a).unwrap(), String::from_utf8(b).unwrap())
    }

    #[test]
    fn paths_fold_as_pathlib_folds_them() {
        // Right sides: str(Path(p)), str(Path(p).parent) on CPython 3.11.
        assert_eq!(pp("a.db"), ("a.db".into(), ".".into()));
        assert_eq!(pp("./x//y/./a.db/"), ("x/y/a.db".into(), "x/y".into()));
        assert_eq!(pp("/a.db"), ("/a.db".into(), "/".into()));
        assert_eq!(pp("//h/a.db"), ("//h/a.db".into(), "//h".into()));
        assert_eq!(pp("///a"), ("/a".into(), "/".into()));
        assert_eq!(pp("x/../a.db"), ("x/../a.db".into(), "x/..".into()));
        assert_eq!(pp("."), (".".into(), ".".into()));
    }

    #[test]
    fn every_spelling_argparse_takes_for_db_is_read() {
        let args: Vec<OsString> = [
            "--db", "a", "--db=b", "--d", "c", "--d=d", "--dbx", "e", "--db",
        ]
        .iter()
        .map(OsString::from)
        .collect();
        let got: Vec<&[u8]> = db_values(&args);
        assert_eq!(got, [b"a" as &[u8], b"b", b"c", b"d"]);
    }

    #[test]
    fn only_names_without_a_scheme_or_a_keyword_are_plain_files() {
        for plain in ["events.db", "~/e.db", "/a b/e.db", "x y"] {
            assert!(plain_file(plain.as_bytes()), "{plain}");
        }
        for other in [
            "",
            "  ",
            "postgresql://u:p@h/x",
            "host=h",
            "notes:2024.db",
            "a\0b",
        ] {
            assert!(!plain_file(other.as_bytes()), "{other}");
        }
        assert!(!plain_file(b"\xff.db"));
    }

    #[test]
    fn a_missing_directory_and_a_directory_are_refused() {
        let dir = std::env::temp_dir();
        let missing = dir.join("sda-no-such-dir/e.db");
        let said = sqlite_error(missing.as_os_str().as_bytes()).unwrap();
        assert!(said.ends_with(&format!(
            "directory {} does not exist (create it first: only the default location is \
             created)",
            dir.join("sda-no-such-dir").display()
        )));
        let said = sqlite_error(dir.as_os_str().as_bytes()).unwrap();
        assert!(said.ends_with("is a directory; give a file path"), "{said}");
        assert_eq!(sqlite_error(dir.join("e.db").as_os_str().as_bytes()), None);
    }
}
