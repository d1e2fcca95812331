"""What the adapter keeps in Recall's workdir, and the order it writes it in.

* :mod:`~streamd.recall.persist.atomic` - the one write: tmp, fsync, rename.
* :mod:`~streamd.recall.persist.cursors` - a cursor as JSON.
* :mod:`~streamd.recall.persist.manifest` - the durable index: segments and
  the manifest naming them, adopted by the next process.
* :mod:`~streamd.recall.persist.summed` - the manifest's JSON, carrying the
  CRC-32 of its own bytes.
* :mod:`~streamd.recall.persist.checkpoint` - ``cursor.json``, written last.
* :mod:`~streamd.recall.persist.lock` - one writer per workdir, whichever
  processes meet on it.
"""
