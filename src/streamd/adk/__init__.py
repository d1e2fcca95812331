"""Google ADK on the streamd event log (``pip install 'recall-streamd[adk]'``).

* :mod:`~streamd.adk.session_service` - :class:`StreamdSessionService`, an ADK
  ``BaseSessionService`` on :class:`streamd.client.AsyncClient`: sessions,
  events and ``app:`` / ``user:`` / session state in the log, ``temp:`` never
  persisted, bounded reads for ``GetSessionConfig``, and ADK's stale-session
  error from the log's ``expected_seq``.

Importing this package imports ADK.
"""

from streamd.adk.session_service import StreamdSessionService

__all__ = ["StreamdSessionService"]
