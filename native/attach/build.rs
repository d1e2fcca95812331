//! The bridge says streamd's version in its hello, so it takes it from the
//! package's one source of truth, `streamd.__version__`, at build time.

use std::env;
use std::fs;
use std::path::PathBuf;

const SOURCE: &str = "../../src/streamd/__init__.py";

fn main() {
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let source = manifest.join(SOURCE);
    println!("cargo:rerun-if-changed={}", source.display());
    println!("cargo:rerun-if-changed=build.rs");
    let text = fs::read_to_string(&source)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", source.display()));
    let version = text
        .lines()
        .find_map(|l| l.strip_prefix("__version__ = \""))
        .and_then(|rest| rest.strip_suffix('"'))
        .expect("streamd/__init__.py names no __version__");
    println!("cargo:rustc-env=STREAMD_VERSION={version}");
}
