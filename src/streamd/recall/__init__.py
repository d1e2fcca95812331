"""The Recall stream adapter: a drop-in ``recall-stream``.

Bottom up, each layer importing only those below it:

* :mod:`~streamd.recall.records`, :mod:`~streamd.recall.tokenize` - one JSONL
  line read as the reference reads it (Go's JSON and time rules), and its
  tokens under the pinned Unicode tables; :mod:`~streamd.recall.stop` - how
  an answer computed on a worker thread learns that its request is over.
* :mod:`~streamd.recall.index` - stream files and cursors, the per-line build
  rules, segments, the index and its published views, parallel builds.
* :mod:`~streamd.recall.query` - ranking, relevance, number variants, the text
  the reference writes.
* :mod:`~streamd.recall.persist` - the workdir: atomic writes, the manifest
  of segments, ``cursor.json``.
* :mod:`~streamd.recall.settings`, :mod:`~streamd.recall.wire` - the settings
  block; params and result Structs.
* :mod:`~streamd.recall.generation` - one published build, and how far a
  build has come; :mod:`~streamd.recall.changes` - what became of a file since
  a generation read it.
* :mod:`~streamd.recall.answers` - search, expand and health rendered from a
  generation and the lines read back for it (sans-I/O).
* :mod:`~streamd.recall.adapter` - the adapter's one I/O owner: handshake,
  builds, publishing and saving in the workdir, the workdir lock; the
  answers on top.
* :mod:`~streamd.recall.check` - why a line is not a record, for people;
  :mod:`~streamd.recall.reserve` - how much of a deadline is kept for
  answering.
* :mod:`~streamd.recall.oneshot` (blocking, for the CLI),
  :mod:`~streamd.recall.scanner` (Trio: the one task that builds a source's
  generations, and the threads a connection's answers are computed in),
  :mod:`~streamd.recall.sources` (sources shared by a resident daemon's
  connections) and :mod:`~streamd.recall.service` (the methods).
"""
