"""Google ADK on the streamd event log (``pip install 'recall-streamd[adk]'``).

* :mod:`~streamd.adk.session_service` - :class:`StreamdSessionService`, an ADK
  ``BaseSessionService`` on :class:`streamd.client.AsyncClient`: sessions,
  events and ``app:`` / ``user:`` / session state in the log, ``temp:`` never
  persisted, bounded reads for ``GetSessionConfig``, and ADK's stale-session
  error from the log's ``expected_seq``.
* :mod:`~streamd.adk.errors` - :class:`EventConflictError`, raised for an
  event id already stored with other content, or in another session (ADK has no
  error for it).
* :mod:`~streamd.adk.write_behind` - queued appends and their batch runs.
* :mod:`~streamd.adk.codec` - how ADK's events, state, times and ids are stored.
* :mod:`~streamd.adk.convert` - ADK events back from the log, rebuilt without
  re-validating what the service itself wrote.

Importing this package imports ADK.
"""

from streamd.adk.errors import EventConflictError
from streamd.adk.session_service import StreamdSessionService

__all__ = ["EventConflictError", "StreamdSessionService"]
