#!/usr/bin/env python3
"""Deterministic generator of realistic Recall JSONL streams, for the bench.

    python bench/gen_stream.py OUT.jsonl -n 1000000 [--seed 7] [--bad-every K]
    python bench/gen_stream.py OUT.jsonl --append 1000

The same arguments always write the same bytes. Every run also writes a
sidecar ``OUT.jsonl.meta.json`` that the bench driver reads to pick meaningful
queries: how often every vocabulary word occurs, the exact document frequency
of the most common words, a sample of records (id, schema, system, ref,
correlation, event time), and the state an append continues from (next id,
last event time, per-system ref counters).

What the stream looks like, and why:

* Schema mix: about a third of the records are schema 1 (text in ``body``),
  the rest schema 2 (``text`` plus ``actor``), as a stream written across an
  upgrade would be.
* Four upstream systems with identifier-like refs: tasks ``td-f62256``, jira
  ``REC-118``, slack ``C0RECALL/1746177600.000200`` (kind message) and github
  ``owner/repo#123``. Refs recur: a ticket gets several events over a while,
  so an exact-identifier query finds a handful of records, an id finds one.
* Prose is drawn from a Zipf distribution over a vocabulary of tens of
  thousands of terms: a few dozen real English words at the head (so a few
  terms occur in most records) and deterministic pseudo-words after them
  (so the tail is full of rare terms). Some words exist as a singular/plural
  pair, some only as a plural, which exercises number variants.
* Event times increase by exponential gaps (mean 30 s) and a few records
  arrive late (up to five minutes out of order); some carry a fraction of a
  second (milli, micro or nanosecond precision) or a ``+00:00`` offset.
* ``--bad-every K`` inserts, after every K-th record, a line the adapter must
  count as failed: alternately a truncated JSON line and a schema-3 record.

An average line is about 430 bytes, so a million records are about 430 MB.
numpy draws the randomness in bulk and lines are written in large chunks, so
a million records take some tens of seconds on a small machine.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import sys
import time
from dataclasses import dataclass

import numpy as np

META_SUFFIX = ".meta.json"
META_FORMAT = 1
# Bump whenever the same arguments would write different bytes: the bench
# reuses a cached stream only when its meta names this revision.
GENERATOR_REVISION = 2
DEFAULT_SEED = 7
DEFAULT_VOCAB = 60_000
ZIPF_S = 1.07
CHUNK = 20_000
SAMPLE_TARGET = 4000  # records remembered in the meta file for the driver
TOP_DF = 64  # exact document frequency is counted for this many head words
T0_NS = 1_735_689_600 * 10**9  # 2025-01-01T00:00:00Z
MEAN_GAP_NS = 30 * 10**9

SYSTEMS = ("tasks", "jira", "slack", "github")
SYSTEM_P = (0.30, 0.25, 0.30, 0.15)

# The head of the distribution: real words, most frequent first.
HEAD_WORDS = (  # noqa: SIM905
    "the to and of a in for is on that with it this we be as at by not from are "
    "was have an or but if will can should after before when into build test "
    "review deploy release fix merge branch adapter index stream record search "
    "query latency error issue change update config service"
).split()

JIRA_PROJECTS = ("REC", "OPS", "PLAT", "WEB", "DATA")
SLACK_CHANNELS = (
    ("C0RECALL", "recall"),
    ("C0OPS", "ops"),
    ("C0DEPLOY", "deploy"),
    ("C0INCIDENT", "incident"),
    ("C0GENERAL", "general"),
    ("C0RANDOM", "random"),
    ("C0DATA", "data-eng"),
    ("C0WEB", "web"),
    ("C0INFRA", "infra"),
    ("C0REVIEW", "review"),
    ("C0PLAT", "platform"),
    ("C0ONCALL", "oncall"),
)
GITHUB_REPOS = (
    "marcus/recall",
    "acme/streamd",
    "acme/gateway",
    "acme/billing",
    "acme/web-app",
    "infra/terraform",
    "infra/charts",
    "data/pipelines",
)
TASK_STATUS = ("NEXT", "TODO", "In Progress", "DONE", "Blocked")
JIRA_STATUS = ("In Review", "In Progress", "Done", "To Do", "QA")
GH_VERBS = ("opened", "merged", "closed", "reviewed", "updated")
FIRST_NAMES = (  # noqa: SIM905
    "marcus aisha wei olga tomas priya kenji lena diego fatima noah ines "
    "arjun mei sven amara lucas yara omar hana ivan zoe ravi elena kwame nora"
).split()

_ONSETS = (  # noqa: SIM905
    "b c d f g h j k l m n p r s t v w z br ch cr dr fl gr kl pl pr sh st str th tr"
).split()
_NUCLEI = ["a", "e", "i", "o", "u", "ai", "ea", "io", "ou"]
_CODAS = ["", "", "", "n", "r", "s", "l", "t", "m", "x", "nd", "rk", "st"]
_ACCENTS = {"e": "é", "u": "ü", "o": "ö", "a": "å"}
_SIBILANT = ("s", "x", "z", "ch", "sh")


def plural_of(word: str) -> str:
    if word.endswith(_SIBILANT):
        return word + "es"
    if word.endswith("y") and len(word) >= 2 and word[-2] not in "aeiou":
        return word[:-1] + "ies"
    return word + "s"


@dataclass(slots=True)
class Vocabulary:
    """The words, most frequent first, and the Zipf law over their ranks."""

    words: list[str]
    cdf: np.ndarray
    # singular -> plural where only the plural is in the vocabulary
    plural_only: dict[str, str]
    # singular -> plural where both are in the vocabulary
    pairs: dict[str, str]
    # names this exact word list, so a cached stream from another one is not reused
    digest: str

    @classmethod
    @functools.lru_cache(maxsize=4)
    def build(cls, seed: int, size: int = DEFAULT_VOCAB, s: float = ZIPF_S) -> Vocabulary:
        rng = np.random.default_rng([seed, 0x766F63])
        taken = set(HEAD_WORDS)
        pseudo: list[str] = []
        want = size - len(HEAD_WORDS)
        while len(pseudo) < want:
            # Draw syllables in bulk; a Python loop only glues them together.
            m = 2 * (want - len(pseudo)) + 1000
            nsyl = rng.choice(np.array([1, 2, 2, 3, 3, 3, 4]), m).tolist()
            ons = rng.integers(len(_ONSETS), size=(m, 4)).tolist()
            nuc = rng.integers(len(_NUCLEI), size=(m, 4)).tolist()
            cod = rng.integers(len(_CODAS), size=m).tolist()
            accent = (rng.random(m) < 0.01).tolist()  # a few non-ASCII letters
            for k in range(m):
                o, u = ons[k], nuc[k]
                w = "".join(_ONSETS[o[j]] + _NUCLEI[u[j]] for j in range(nsyl[k]))
                w += _CODAS[cod[k]]
                if accent[k]:
                    for plain, accented in _ACCENTS.items():
                        if plain in w:
                            w = w.replace(plain, accented, 1)
                            break
                if len(w) < 3 or w in taken:
                    continue
                taken.add(w)
                pseudo.append(w)
                if len(pseudo) == want:
                    break
        # Number pairs: some words also appear as a plural (written over another
        # word's slot), some only as a plural (written over their own).
        pairs: dict[str, str] = {}
        plural_only: dict[str, str] = {}
        npick = len(pseudo) // 20
        picks = rng.permutation(len(pseudo))[: 3 * npick].tolist()
        for k in range(npick):
            a, b, c = picks[k], picks[npick + k], picks[2 * npick + k]
            for idx, slot, table in ((a, a, plural_only), (b, c, pairs)):
                w = pseudo[idx]
                p = plural_of(w)
                if p in taken or w.endswith("s"):
                    continue
                pseudo[slot] = p
                table[w] = p
                taken.add(p)
        held = set(pseudo)
        pairs = {k: v for k, v in pairs.items() if k in held and v in held}
        plural_only = {k: v for k, v in plural_only.items() if v in held and k not in held}
        order = rng.permutation(len(pseudo))
        words = list(HEAD_WORDS) + [pseudo[i] for i in order.tolist()]
        ranks = np.arange(1, len(words) + 1, dtype=np.float64)
        weights = ranks**-s
        cdf = np.cumsum(weights)
        cdf /= cdf[-1]
        digest = hashlib.sha256("\n".join(words).encode()).hexdigest()[:16]
        return cls(words, cdf, plural_only, pairs, digest)

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        idx = np.searchsorted(self.cdf, rng.random(n), side="right")
        np.minimum(idx, len(self.words) - 1, out=idx)
        return idx.astype(np.int32)


def _names(seed: int) -> list[str]:
    rng = np.random.default_rng([seed, 0x6E616D])
    out = []
    for first in FIRST_NAMES:
        out.append(first)
        for _ in range(8):
            out.append(f"{first}.{chr(97 + int(rng.integers(26)))}")
    return sorted(set(out))


def _task_ref(n: int) -> str:
    # An odd multiplier is a bijection modulo 2**24: distinct tasks, distinct refs.
    return f"td-{(n * 0x9E3779B1 + 0x5A17) & 0xFFFFFF:06x}"


def _jira_ref(n: int) -> str:
    return f"{JIRA_PROJECTS[n % len(JIRA_PROJECTS)]}-{n // len(JIRA_PROJECTS) + 1}"


def _github_ref(n: int) -> str:
    return f"{GITHUB_REPOS[n % len(GITHUB_REPOS)]}#{n // len(GITHUB_REPOS) + 1}"


def _fmt_times(ns: np.ndarray, precision: np.ndarray, offset: np.ndarray) -> list[str]:
    """RFC 3339 strings; precision is 0, 3, 6 or 9 fraction digits."""
    base = np.datetime_as_string(ns.astype("datetime64[ns]"), unit="ns").tolist()
    out = []
    for b, p, o in zip(base, precision.tolist(), offset.tolist(), strict=True):
        s = b[:19] if p == 0 else b[: 20 + p]
        out.append(s + ("+00:00" if o else "Z"))
    return out


def _fmt_seconds(ns: np.ndarray) -> list[str]:
    secs = ns.astype("datetime64[ns]").astype("datetime64[s]")
    return [s + "Z" for s in np.datetime_as_string(secs, unit="s").tolist()]


class Generator:
    """Writes records ``start .. start+n-1``; ``state`` carries over to an append."""

    def __init__(self, seed: int, vocab_size: int, state: dict | None = None) -> None:
        self.seed = seed
        self.vocab = Vocabulary.build(seed, vocab_size)
        self.names = _names(seed)
        v = len(self.vocab.words)
        # Extended vocabulary: plain, with a comma, ending a sentence, quoted.
        w = self.vocab.words
        self.ext = w + [x + "," for x in w] + [x + "." for x in w] + ['\\"' + x + '\\"' for x in w]
        self.ext_np = np.array(self.ext, dtype=object)
        self.v = v
        st = state or {}
        self.next_index = st.get("next_index", 0)
        self.last_ns = st.get("last_time_ns", T0_NS)
        self.sys_counts = st.get("system_counts", dict.fromkeys(SYSTEMS, 0))
        self.word_counts = np.array(st.get("word_counts", [0] * v), dtype=np.int64)
        self.top_df = np.array(st.get("top_df", [0] * TOP_DF), dtype=np.int64)
        self.records = st.get("records", 0)
        self.bad_lines = st.get("bad_lines", 0)
        self.min_ns = st.get("min_time_ns")
        self.max_ns = st.get("max_time_ns")
        self.samples: list = st.get("samples", [])

    def state(self) -> dict:
        return {
            "next_index": self.next_index,
            "last_time_ns": self.last_ns,
            "system_counts": self.sys_counts,
            "word_counts": self.word_counts.tolist(),
            "top_df": self.top_df.tolist(),
            "records": self.records,
            "bad_lines": self.bad_lines,
            "min_time_ns": self.min_ns,
            "max_time_ns": self.max_ns,
            "samples": self.samples,
        }

    # -- one chunk ----------------------------------------------------------------

    def chunk(self, n: int, salt: int, bad_every: int, sample_every: int) -> bytes:
        start = self.next_index
        rng = np.random.default_rng([self.seed, start, salt])
        vocab = self.vocab

        # Times: exponential gaps, a few late arrivals, mixed precision.
        gaps = rng.exponential(MEAN_GAP_NS, n).astype(np.int64) + 1
        ns = self.last_ns + np.cumsum(gaps)
        self.last_ns = int(ns[-1])
        late = rng.random(n) < 0.03
        ns = ns - np.where(late, rng.integers(0, 300 * 10**9, n), 0)
        precision = rng.choice(np.array([0, 3, 6, 9]), n, p=[0.45, 0.3, 0.15, 0.1])
        unit = 10 ** (9 - precision)
        ns = ns - ns % unit
        offset = rng.random(n) < 0.01
        event_s = _fmt_times(ns, precision, offset)
        observed_ns = ns + rng.integers(0, 10 * 10**9, n)
        has_observed = rng.random(n) >= 0.10
        observed_s = _fmt_seconds(observed_ns)
        lo, hi = int(ns.min()), int(ns.max())
        self.min_ns = lo if self.min_ns is None else min(self.min_ns, lo)
        self.max_ns = hi if self.max_ns is None else max(self.max_ns, hi)

        system = rng.choice(4, n, p=SYSTEM_P)
        schema = np.where(rng.random(n) < 0.35, 1, 2)
        u_ref = rng.random(n)
        u_misc = rng.integers(0, 1 << 30, n)
        title_kind = rng.integers(0, 4, n)
        revision = rng.integers(1, 21, n)
        actor_idx = rng.integers(0, len(self.names), n)
        corr_roll = rng.random(n)
        mention_roll = rng.random(n)
        omit_kind = rng.random(n) < 0.05

        # Prose: lognormal lengths with a tail of long messages.
        lens = np.maximum(3, rng.lognormal(np.log(20), 0.5, n)).astype(np.int64)
        long_ = rng.random(n) < 0.03
        lens = np.where(long_, lens * 5, lens)
        tlens = rng.integers(2, 6, n)
        # Only some title templates carry prose; count only the words written.
        has_prose = (
            ((system == 0) & (title_kind == 2))
            | ((system == 1) & ((title_kind == 1) | (title_kind == 3)))
            | ((system == 3) & (title_kind != 3))
        )
        tlens = np.where(has_prose, tlens, 0)
        total = int(lens.sum())
        ttotal = int(tlens.sum())
        words = vocab.draw(rng, total)
        twords = vocab.draw(rng, ttotal)
        self.word_counts += np.bincount(words, minlength=self.v)
        self.word_counts += np.bincount(twords, minlength=self.v)
        self._count_top_df(n, words, lens, twords, tlens)
        punct = rng.choice(4, total, p=[0.86, 0.06, 0.075, 0.005])
        ends = np.cumsum(lens) - 1
        punct[ends] = 2  # every text ends a sentence
        ext = self.ext_np[words + punct * self.v].tolist()
        text_ext = self.ext_np[twords].tolist()
        offs = np.concatenate(([0], np.cumsum(lens))).tolist()
        toffs = np.concatenate(([0], np.cumsum(tlens))).tolist()

        # Plain lists: indexing numpy scalars one by one is several times slower.
        system = system.tolist()
        schema = schema.tolist()
        u_ref = u_ref.tolist()
        u_misc = u_misc.tolist()
        title_kind = title_kind.tolist()
        revision = revision.tolist()
        actor_idx = actor_idx.tolist()
        corr_roll = corr_roll.tolist()
        mention_roll = mention_roll.tolist()
        omit_kind = omit_kind.tolist()
        has_observed = has_observed.tolist()
        ns_list = ns.tolist()
        names = self.names
        counts = self.sys_counts
        out: list[str] = []
        bad = 0
        for j in range(n):
            i = start + j
            sysno = system[j]
            sysname = SYSTEMS[sysno]
            k = counts[sysname]
            counts[sysname] = k + 1
            # A ref recurs for a while: pick among the last ~400 refs of the system.
            top = k // 4
            low = top - 400 if top > 400 else 0
            refno = low + int(u_ref[j] * (top + 1 - low))
            misc = u_misc[j]
            tk = title_kind[j]
            twds = " ".join(text_ext[toffs[j] : toffs[j + 1]])
            actor = names[actor_idx[j]]
            kind = "event"
            corr = None
            rev: str | None = str(revision[j])
            cr = corr_roll[j]
            if sysno == 0:
                ref = _task_ref(refno)
                corr = ref if cr < 0.8 else None
                title = (
                    f"Task {ref} moved to {TASK_STATUS[misc % 5]}",
                    f"Task {ref} created",
                    f"Task {ref}: {twds}",
                    f"Task {ref} commented",
                )[tk]
            elif sysno == 1:
                ref = _jira_ref(refno)
                corr = ref if cr < 0.6 else (_jira_ref(refno // 8) if cr < 0.8 else None)
                title = (
                    f"{ref} transitioned to {JIRA_STATUS[misc % 5]}",
                    f"{ref}: {twds}",
                    f"{ref} assigned to {actor}",
                    f"{ref}: {twds}",
                )[tk]
            elif sysno == 2:
                chan, cname = SLACK_CHANNELS[misc % len(SLACK_CHANNELS)]
                sec = ns_list[j] // 10**9
                ref = f"{chan}/{sec}.{misc % 1_000_000:06d}"
                kind = "message"
                rev = None
                if cr < 0.3:
                    corr = _task_ref(misc % (counts["tasks"] // 4 + 1))
                elif cr < 0.5:
                    corr = _jira_ref(misc % (counts["jira"] // 4 + 1))
                title = f"{actor.split('.')[0].capitalize()} posted in #{cname}"
            else:
                ref = _github_ref(refno)
                if tk == 3:
                    kind = "message"
                    title = f"Comment on {ref}"
                else:
                    title = f"PR {ref} {GH_VERBS[misc % 5]}: {twds}"
                corr = _jira_ref(misc % (counts["jira"] // 4 + 1)) if cr < 0.5 else ref
            text = " ".join(ext[offs[j] : offs[j + 1]])
            if mention_roll[j] < 0.12:
                m = misc >> 7
                other = (_task_ref, _jira_ref, _github_ref)[m % 3](m % (k // 4 + 1))
                text += f" See {other}."
            rid = f"evt-{i + 1:07d}"
            sch = schema[j]
            parts = [f'{{"schema":{sch},"id":"{rid}"']
            if not (omit_kind[j] and kind == "event" and sch == 1):
                parts.append(f',"kind":"{kind}"')
            parts.append(f',"event_time":"{event_s[j]}"')
            if has_observed[j]:
                parts.append(f',"observed_at":"{observed_s[j]}"')
            parts.append(f',"system":"{sysname}","ref":"{ref}"')
            if corr is not None:
                parts.append(f',"correlation":"{corr}"')
            parts.append(f',"title":"{title}"')
            if sch == 1:
                parts.append(f',"body":"{text}"')
            else:
                parts.append(f',"text":"{text}","actor":"{actor}"')
            if rev is not None:
                parts.append(f',"revision":"{rev}"')
            parts.append("}\n")
            line = "".join(parts)
            out.append(line)
            if sample_every and i % sample_every == sample_every // 2:
                self.samples.append([rid, sch, sysname, ref, corr, ns_list[j]])
            if bad_every and (i + 1) % bad_every == 0:
                if (self.bad_lines + bad) % 2 == 0:
                    out.append(line[: len(line) // 2] + "\n")  # truncated JSON
                else:
                    out.append(
                        line.replace(f'"schema":{sch}', '"schema":3', 1).replace(
                            f'"id":"{rid}"', f'"id":"bad-{i + 1:07d}"', 1
                        )
                    )
                bad += 1
        self.next_index = start + n
        self.records += n
        self.bad_lines += bad
        return "".join(out).encode()

    def _count_top_df(self, n, words, lens, twords, tlens) -> None:
        """Exact number of records whose prose or title holds each head word."""
        rec = np.repeat(np.arange(n), lens)
        trec = np.repeat(np.arange(n), tlens)
        seen = np.zeros(n * TOP_DF, dtype=bool)
        for w, r in ((words, rec), (twords, trec)):
            m = w < TOP_DF
            seen[r[m] * TOP_DF + w[m]] = True
        self.top_df += seen.reshape(n, TOP_DF).sum(axis=0)


# -- files -------------------------------------------------------------------------


def meta_path(path: str) -> str:
    return path + META_SUFFIX


def load_meta(path: str) -> dict:
    with open(meta_path(path), encoding="utf-8") as f:
        return json.load(f)


def _write_meta(path: str, meta: dict) -> None:
    tmp = meta_path(path) + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(meta, f, separators=(",", ":"))
    os.replace(tmp, meta_path(path))


def _run(
    gen: Generator,
    path: str,
    n: int,
    mode: str,
    bad_every: int,
    salt: int,
    sample_every: int,
    progress: bool,
) -> None:
    t = time.perf_counter()
    with open(path, mode) as f:
        done = 0
        while done < n:
            k = min(CHUNK, n - done)
            f.write(gen.chunk(k, salt, bad_every, sample_every))
            done += k
            if progress:
                rate = done / max(time.perf_counter() - t, 1e-9)
                print(f"\r{done:,}/{n:,} records  {rate:,.0f} rec/s", end="", file=sys.stderr)
    if progress:
        print(file=sys.stderr)


def generate(
    path: str,
    n: int,
    seed: int = DEFAULT_SEED,
    bad_every: int = 0,
    vocab_size: int = DEFAULT_VOCAB,
    progress: bool = False,
) -> dict:
    """Write ``n`` records to ``path`` (replacing it) and its meta sidecar."""
    gen = Generator(seed, vocab_size)
    sample_every = max(1, n // SAMPLE_TARGET)
    tmp = path + ".partial"
    _run(gen, tmp, n, "wb", bad_every, 0, sample_every, progress)
    os.replace(tmp, path)
    meta = {
        "format": META_FORMAT,
        "generator": "bench/gen_stream.py",
        "generator_revision": GENERATOR_REVISION,
        "seed": seed,
        "vocab_size": vocab_size,
        "zipf_s": ZIPF_S,
        "vocab_digest": gen.vocab.digest,
        "bad_every": bad_every,
        "base_records": n,
        "appended_records": 0,
        "bytes": os.path.getsize(path),
        **gen.state(),
    }
    _write_meta(path, meta)
    return meta


def append(path: str, m: int, progress: bool = False) -> dict:
    """Append ``m`` records continuing ids, times and refs; update the sidecar."""
    meta = load_meta(path)
    if os.path.getsize(path) != meta["bytes"]:
        raise SystemExit(f"{path} changed since its meta file was written")
    gen = Generator(meta["seed"], meta["vocab_size"], meta)
    # Keep a few samples of the appended part too; a new salt per append keeps
    # repeated appends of the same size from writing identical prose.
    keep = len(gen.samples)
    sample_every = max(1, m // 20)
    _run(
        gen, path, m, "ab", meta["bad_every"], 1 + meta["appended_records"], sample_every, progress
    )
    gen.samples = gen.samples[: keep + 20]
    meta.update(gen.state())
    meta["appended_records"] += m
    meta["bytes"] = os.path.getsize(path)
    _write_meta(path, meta)
    return meta


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", help="stream file to write (its meta goes to OUT.meta.json)")
    ap.add_argument("-n", "--records", type=int, default=100_000)
    ap.add_argument("--seed", type=int, default=DEFAULT_SEED)
    ap.add_argument("--vocab", type=int, default=DEFAULT_VOCAB, help="vocabulary size")
    ap.add_argument(
        "--bad-every",
        type=int,
        default=0,
        metavar="K",
        help="after every K-th record write a bad line (0: none)",
    )
    ap.add_argument(
        "--append", type=int, metavar="M", help="append M records to an existing generated stream"
    )
    ap.add_argument("-q", "--quiet", action="store_true")
    args = ap.parse_args(argv)
    t = time.perf_counter()
    if args.append is not None:
        meta = append(args.out, args.append, progress=not args.quiet)
    else:
        meta = generate(
            args.out, args.records, args.seed, args.bad_every, args.vocab, progress=not args.quiet
        )
    dt = time.perf_counter() - t
    if not args.quiet:
        lines = meta["records"] + meta["bad_lines"]
        print(
            f"{args.out}: {meta['records']:,} records, {meta['bad_lines']:,} bad lines, "
            f"{meta['bytes'] / 1e6:,.1f} MB ({meta['bytes'] / max(lines, 1):.0f} B/line) "
            f"in {dt:.1f} s",
            file=sys.stderr,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
