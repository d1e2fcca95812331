"""The resident per-user daemon and the thin client Recall spawns instead.

A Recall core spawns its adapter afresh for every command. ``streamd attach``
is that adapter: a client of the standard library only that relays stdio to a
daemon which stays up, so a spawn costs an interpreter start and a round trip
rather than the imports and the index loading of a whole daemon.

* :mod:`~streamd.resident.paths` - where the socket, lock and log live; the
  private-directory rule (stdlib).
* :mod:`~streamd.resident.lock` - one daemon per directory: the flock (stdlib).
* :mod:`~streamd.resident.claim` - a daemon's claim on its directory: the lock,
  then the socket, taken before the daemon's imports (stdlib).
* :mod:`~streamd.resident.control` - a blocking client of the control methods
  (``streamd/hello``, ``status``, ``stop``, ``retire``) and ``streamd status`` /
  ``streamd stop`` (stdlib).
* :mod:`~streamd.resident.launch` - starting a daemon for a client: its
  paths, its startup pipe (stdlib).
* :mod:`~streamd.resident.dbmatch` - whether the event log a client asks for
  is the one a running daemon serves (stdlib).
* :mod:`~streamd.resident.ending` - whether the daemon's close ends a relayed
  session cleanly, told from frames (stdlib).
* :mod:`~streamd.resident.attach` - ``streamd attach``: find or start the
  daemon, then relay byte for byte (stdlib).
* :mod:`~streamd.resident.server` - ``streamd daemon``: the listener, peer
  checks, control methods, idle exit and retirement, over
  :class:`streamd.daemon.Daemon` (Trio).

Nothing is imported here: the stdlib modules must stay importable without
pulling in Trio, and :mod:`~streamd.resident.server` is imported only by the
command that runs the daemon.
"""
