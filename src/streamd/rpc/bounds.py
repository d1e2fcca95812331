"""What one connection may hold, and why each bound is where it is.

The rules these bounds serve are :mod:`~streamd.rpc.server`'s (what waits
at each, and when); what all connections hold together is
:mod:`~streamd.rpc.held`'s.
"""

from __future__ import annotations

__all__ = [
    "BULK_ANSWER_BYTES", "MAX_BULK", "MAX_INFLIGHT", "MAX_INFLIGHT_BYTES", "MAX_UNWRITTEN_BYTES",
]

# Per connection: requests dispatched and not yet answered, and what their
# params take decoded, estimated (:mod:`streamd.rpc.footprint`). 64 MiB is
# eight frames of the largest size holding one string each, or 2.6 MiB of
# frames of empty objects.
MAX_INFLIGHT = 256
MAX_INFLIGHT_BYTES = 64 << 20
# Per connection: answers and notifications written into the outbox and not yet
# taken by the peer. Past it the reader stops reading: queued methods answer
# from callbacks that cannot wait, so without this a peer that sends appends
# and never reads would grow the outbox without limit. Above a watch's share of
# its budget (3.5 MiB by default), so one watch alone never stalls the reader.
MAX_UNWRITTEN_BYTES = 16 << 20
# Per connection: bulk answers computed at once (see the server's docstring).
MAX_BULK = 4
# What a bulk answer is charged to the daemon-wide budget from its slot to its
# answer (at most a connection's share there): the event log's page budget.
# Charged only once queued, 64 clients' four slots each passed the check
# together and computed 1 GiB of pages.
BULK_ANSWER_BYTES = 4 << 20
