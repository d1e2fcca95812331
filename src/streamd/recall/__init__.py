"""The Recall stream adapter: a drop-in ``recall-stream``.

Bottom up, each layer importing only those below it:

* :mod:`~streamd.recall.records`, :mod:`~streamd.recall.tokenize` - one JSONL
  line read as the reference reads it (Go's JSON and time rules), and its
  tokens under the pinned Unicode tables.
* :mod:`~streamd.recall.index` - stream files and cursors, the per-line build
  rules, segments, the index and its published views, parallel builds.
* :mod:`~streamd.recall.query` - ranking, relevance, number variants, the text
  the reference writes.
* :mod:`~streamd.recall.persist` - the workdir: atomic writes, the manifest
  of segments, ``cursor.json``.
* :mod:`~streamd.recall.settings`, :mod:`~streamd.recall.wire` - the settings
  block; params and result Structs.
* :mod:`~streamd.recall.adapter` - the adapter's state and rules, sans-I/O:
  handshake, generations, health, and answers planned as "read these lines,
  then render".
* :mod:`~streamd.recall.oneshot` (blocking, for the CLI) and
  :mod:`~streamd.recall.service` (Trio: the refresh scanner and the methods).
"""
