"""The relay's one decision about frames: is the daemon's close the end the
peer asked for? Only when the last frame out answers a shutdown request that
went in, however the bytes were cut into reads."""

from __future__ import annotations

from streamd.resident.ending import MAX_SHUTDOWN_LINE, SessionEnd, last_line

SHUTDOWN = b'{"jsonrpc":"2.0","id":4,"method":"recall/shutdown"}\n'
ANSWER = b'{"jsonrpc":"2.0","id":4,"result":{}}'


def fed(*chunks: bytes) -> SessionEnd:
    end = SessionEnd()
    for chunk in chunks:
        end.sent(chunk)
    return end


def test_a_shutdown_request_cut_anywhere_is_recognized() -> None:
    for cut in range(1, len(SHUTDOWN)):
        end = fed(b'{"id":1,"method":"recall/health"}\n' + SHUTDOWN[:cut], SHUTDOWN[cut:])
        assert end.shutdown_sent and end.answered(ANSWER), cut


def test_the_name_in_a_query_an_unfinished_frame_or_a_long_line_is_no_shutdown() -> None:
    query = b'{"id":2,"method":"recall/search","params":{"query":"recall/shutdown"}}\n'
    assert not fed(query).shutdown_sent
    assert not fed(SHUTDOWN[:-1]).shutdown_sent  # its newline never came
    padded = SHUTDOWN[:-2] + b" " * MAX_SHUTDOWN_LINE + b"}\n"
    assert not fed(padded).shutdown_sent


def test_only_the_answer_to_that_id_counts() -> None:
    end = fed(SHUTDOWN)
    assert not end.answered(b'{"jsonrpc":"2.0","id":3,"result":{}}')
    assert not end.answered(b'{"jsonrpc":"2.0","id":"4","result":{}}')
    assert not end.answered(b'{"jsonrpc":"2.0","method":"x","id":4}')
    assert not end.answered(b'{"jsonrpc":"2.0","id":4,"resu')
    assert not SessionEnd().answered(ANSWER)  # nothing was asked


def test_the_last_line_of_what_was_written() -> None:
    assert bytes(last_line(b'{"a":1}\n' + ANSWER + b"\n")) == ANSWER
    assert bytes(last_line(ANSWER + b"\n")) == ANSWER
