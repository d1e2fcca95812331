"""The searchable projection of the stream files.

* :mod:`~streamd.recall.index.streamfile` - reading a file's complete lines
  from a cursor (regular files only, never blocking), and lines by offset.
* :mod:`~streamd.recall.index.segment` - immutable posting segments and
  their on-disk encoding.
* :mod:`~streamd.recall.index.segheader` - a segment file's header and its
  own checksum.
* :mod:`~streamd.recall.index.index` - records, columns and segments; the
  published :class:`~streamd.recall.index.index.View` of a generation.
* :mod:`~streamd.recall.index.idorder` - record ids in order, for ties.
* :mod:`~streamd.recall.index.fingerprint` - a file's consumed bytes, summed
  up (first and last 64 KiB).
* :mod:`~streamd.recall.index.native` - the compiled core's face: whether it
  can be used, and its segment builder.
* :mod:`~streamd.recall.index.build` - the per-line rules of a pass, on the
  plain path and the compiled one (blocks of lines).
* :mod:`~streamd.recall.index.parallel` - large passes in worker processes,
  and ``drive``, the one loop that steps a build.
"""
