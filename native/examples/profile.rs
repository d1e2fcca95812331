//! Where the time of a build goes: `cargo run --release --example profile -- FILE [RECORDS]`.
//! Times decoding alone, decoding plus tokenizing, and whole segments.

use std::time::Instant;

use streamd_native::gotime::Instant as T;
use streamd_native::json::parse_record;
use streamd_native::lines::{next_line, trim_space};
use streamd_native::postings::{Builder, Origin};
use streamd_native::tokenize::Tokenizer;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let data = std::fs::read(&args[1]).expect("a stream file");
    let want: usize = args.get(2).map_or(usize::MAX, |s| s.parse().expect("a count"));
    let mut lines = Vec::new();
    let mut pos = 0;
    while let Some(l) = next_line(&data, pos) {
        lines.push(&data[l.start..l.start + l.size]);
        pos += l.size;
        if lines.len() == want {
            break;
        }
    }
    let end = pos;
    let n = lines.len() as f64;
    let feed_only = std::env::var_os("FEED_ONLY").is_some();
    let t = Instant::now();
    let mut ok = 0;
    for l in lines.iter().filter(|_| !feed_only) {
        ok += parse_record(trim_space(l)).is_ok() as usize;
    }
    println!("decode:          {:6.2} us/record ({ok} records)", t.elapsed().as_secs_f64() * 1e6 / n);
    let t = Instant::now();
    let mut tok = Tokenizer::default();
    let mut count = 0usize;
    for l in lines.iter().filter(|_| !feed_only) {
        if let Ok(r) = parse_record(trim_space(l)) {
            for s in [&r.text, &r.kind, &r.system, &r.actor, &r.reference, &r.title] {
                tok.tokens(s, |_| count += 1);
            }
        }
    }
    println!("decode+tokenize: {:6.2} us/record ({count} tokens)", t.elapsed().as_secs_f64() * 1e6 / n);
    let t = Instant::now();
    let mut b = Builder::new(0);
    let at = Origin { base_offset: 0, file_no: 0, built_at: T { sec: 0, nsec: 0 } };
    let fed = b.feed(&data[..end], 0, at, u64::MAX, u64::MAX);
    let fed_s = t.elapsed().as_secs_f64();
    let sealed = b.seal();
    println!(
        "feed:            {:6.2} us/record, seal {:.1} ms ({} records, {} terms)",
        fed_s * 1e6 / n,
        (t.elapsed().as_secs_f64() - fed_s) * 1e3,
        fed.records,
        sealed.term_hash.len()
    );
    // The way a first build's workers go: 24 MiB chunks, a fresh builder each.
    if let Some(chunk) = std::env::var("CHUNK_MB").ok().and_then(|s| s.parse::<usize>().ok()) {
        let t = Instant::now();
        let (mut pos, mut segments, mut terms, mut sealing) = (0usize, 0usize, 0usize, 0f64);
        while pos < end {
            let stop = (pos + (chunk << 20)).min(end);
            let mut b = Builder::new(0);
            let fed = b.feed(&data[..stop], pos, at, u64::MAX, u64::MAX);
            pos = if fed.pos > pos { fed.pos } else { stop };
            let s = Instant::now();
            terms += b.seal().term_hash.len();
            sealing += s.elapsed().as_secs_f64();
            segments += 1;
        }
        println!(
            "chunked:         {:6.2} us/record, feed and seal, of it {:.2} sealing ({segments} segments of {chunk} MiB, {terms} terms in all)",
            t.elapsed().as_secs_f64() * 1e6 / n,
            sealing * 1e6 / n
        );
    }
    // A catch-up after that: the next 1,000 lines into a fresh builder, hashes cached.
    let rounds: usize = std::env::var("ROUNDS").ok().and_then(|s| s.parse().ok()).unwrap_or(3);
    for round in 0..rounds {
        let t = Instant::now();
        let mut b = Builder::new(0);
        let fed = b.feed(&data[end..], 0, at, 1000, u64::MAX);
        let fed_s = t.elapsed().as_secs_f64();
        let sealed = b.seal();
        println!(
            "catch-up {round}:      {:6.2} ms feed, {:.2} ms seal ({} records, {} terms)",
            fed_s * 1e3,
            (t.elapsed().as_secs_f64() - fed_s) * 1e3,
            fed.records,
            sealed.term_hash.len()
        );
    }
}
