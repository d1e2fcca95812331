"""The searchable projection of the stream files.

* :mod:`~streamd.recall.index.streamfile` - reading a file's complete lines
  from a cursor (regular files only, never blocking), and lines by offset.
* :mod:`~streamd.recall.index.segment` - immutable posting segments and
  their on-disk encoding.
* :mod:`~streamd.recall.index.index` - records, columns and segments; the
  published :class:`~streamd.recall.index.index.View` of a generation.
* :mod:`~streamd.recall.index.build` - the per-line rules of a pass.
* :mod:`~streamd.recall.index.parallel` - large passes in worker processes,
  and ``drive``, the one loop that steps a build.
"""
