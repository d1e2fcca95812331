//! `streamd-attach`: `streamd attach`, compiled.
//!
//! A Recall core spawns its adapter afresh for every command and pays that
//! process's start each time; through `streamd attach` most of a warm
//! command's cost is the Python interpreter starting. This program keeps
//! every rule of `streamd.resident.attach` (which is the specification: its
//! module docstring lists them) and takes the same arguments, so a Recall
//! config names either with the same `args`. It starts a daemon with the
//! Python of the `streamd` script installed beside it.
//!
//! Exit status: 0 when the session ended as the peer asked (stdin's end, the
//! answer to `recall/shutdown`, SIGTERM or SIGINT, or nobody reading stdout),
//! 1 when no daemon could serve or it went away (one line on stderr), 2 for a
//! mistake in the arguments.

mod connect;
mod control;
mod dbcheck;
mod ending;
mod launch;
mod options;
mod paths;
mod relay;
mod sys;

use std::ffi::OsString;

use options::Parsed;

const WAITING_LINE: &str = "streamd attach: waiting for JSON-RPC 2.0 requests on stdin, one per \
line, and relays them to the resident daemon on stdout; Ctrl-D ends it ('streamd demo' shows it \
at work, 'streamd --help' lists the commands)";

fn main() {
    std::process::exit(run());
}

fn run() -> i32 {
    sys::exit_on_signals();
    let argv: Vec<OsString> = std::env::args_os().skip(1).collect();
    let opts = match options::parse(&argv) {
        Ok(Parsed::Run(opts)) => opts,
        Ok(Parsed::Help) => {
            sys::say(1, options::USAGE);
            return 0;
        }
        Err(mistake) => {
            sys::say(
                2,
                &format!("streamd: {mistake} (see 'streamd-attach --help')"),
            );
            return 2;
        }
    };
    if opts
        .daemon_args
        .iter()
        .any(|a| a == "--db" || a.as_encoded_bytes().starts_with(b"--db="))
    {
        match dbcheck::argv_error(&opts.daemon_args) {
            Ok(None) => {}
            Ok(Some(refused)) => {
                sys::say(2, &format!("streamd: {refused}"));
                return 2;
            }
            Err(why) => {
                sys::say(2, &format!("streamd attach: {why}"));
                return 1;
            }
        }
    }
    // A person who types the command at a terminal is told what it waits
    // for; a spawning program never gives a terminal.
    if sys::isatty(0) {
        sys::say(2, WAITING_LINE);
    }
    match connect::connect(
        &opts.directory,
        &opts.daemon_args,
        opts.timeout,
        opts.recall_source,
    ) {
        Ok(conn) => relay::run(conn.sock, conn.buffer),
        Err(why) => {
            sys::say(2, &format!("streamd attach: {why}"));
            1
        }
    }
}
