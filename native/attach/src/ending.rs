//! Whether the daemon's close ends a relayed session cleanly, told from
//! frames: the rules of `streamd.resident.ending`.
//!
//! The daemon closes a session after answering `recall/shutdown`, and that
//! answer is the connection's last frame. So the close is clean exactly when
//! the last frame relayed to stdout answers a `recall/shutdown` request
//! relayed from stdin; the method name quoted in a search, an event or a
//! partial frame is not one. Only lines that contain the name and are short
//! enough to be a shutdown request are decoded.

use serde_json::Value;

const METHOD: &str = "recall/shutdown";
/// A shutdown request is a few dozen bytes; a longer line that mentions the
/// name is some other frame.
pub const MAX_SHUTDOWN_LINE: usize = 1 << 16;

#[derive(Default)]
pub struct SessionEnd {
    line: Vec<u8>,
    long: bool,
    ids: Vec<Value>,
}

impl SessionEnd {
    /// Fed what goes to the daemon, in order.
    pub fn sent(&mut self, data: &[u8]) {
        let mut rest = data;
        loop {
            let end = memchr(rest);
            let piece = &rest[..end.unwrap_or(rest.len())];
            if !self.long {
                if self.line.len() + piece.len() > MAX_SHUTDOWN_LINE {
                    self.long = true;
                    self.line.clear();
                } else {
                    self.line.extend_from_slice(piece);
                }
            }
            let Some(end) = end else { return };
            if !self.long && contains(&self.line, METHOD.as_bytes()) {
                self.note();
            }
            self.line.clear();
            self.long = false;
            rest = &rest[end + 1..];
        }
    }

    fn note(&mut self) {
        let Ok(Value::Object(frame)) = serde_json::from_slice::<Value>(&self.line) else {
            return;
        };
        if frame.get("method").and_then(Value::as_str) == Some(METHOD) {
            // A request without an id is noted as null, as Python's .get does.
            self.ids
                .push(frame.get("id").cloned().unwrap_or(Value::Null));
        }
    }

    /// Whether `last_frame` (one line, no newline) answers a shutdown
    /// request that was sent.
    pub fn answered(&self, last_frame: &[u8]) -> bool {
        if self.ids.is_empty() || last_frame.len() > MAX_SHUTDOWN_LINE {
            return false;
        }
        let Ok(Value::Object(frame)) = serde_json::from_slice::<Value>(last_frame) else {
            return false;
        };
        if frame.contains_key("method") {
            return false;
        }
        if !frame.contains_key("result") && !frame.contains_key("error") {
            return false;
        }
        // An answer without an id answers nothing; serde's equality tells an
        // integer from a float and a boolean from a number, as Python's
        // "equal and of one type" does.
        frame
            .get("id")
            .is_some_and(|id| self.ids.iter().any(|sent| sent == id))
    }
}

/// The last complete line of `written` (which ends with a newline), without it.
pub fn last_line(written: &[u8]) -> &[u8] {
    let body = &written[..written.len().saturating_sub(1)];
    let start = body.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
    &body[start..]
}

fn memchr(data: &[u8]) -> Option<usize> {
    data.iter().position(|&b| b == b'\n')
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_answer_to_a_shutdown_request_sent_ends_cleanly() {
        let mut end = SessionEnd::default();
        end.sent(b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"recall/search\",");
        end.sent(b"\"params\":{\"query\":\"recall/shutdown\"}}\n");
        assert!(!end.answered(br#"{"jsonrpc":"2.0","id":1,"result":{}}"#));
        end.sent(b"{\"jsonrpc\":\"2.0\",\"id\":7,\"method\":\"recall/shutdown\"}\n");
        assert!(end.answered(br#"{"jsonrpc":"2.0","id":7,"result":{}}"#));
        assert!(!end.answered(br#"{"jsonrpc":"2.0","id":7.0,"result":{}}"#));
        assert!(!end.answered(br#"{"jsonrpc":"2.0","id":"7","result":{}}"#));
        assert!(!end.answered(br#"{"jsonrpc":"2.0","result":{}}"#));
        assert!(!end.answered(br#"{"jsonrpc":"2.0","id":7,"method":"x"}"#));
    }

    #[test]
    fn a_long_line_that_names_the_method_is_not_a_request() {
        let mut end = SessionEnd::default();
        let mut line = b"{\"id\":1,\"method\":\"recall/shutdown\",\"pad\":\"".to_vec();
        line.resize(MAX_SHUTDOWN_LINE + 10, b'x');
        line.extend_from_slice(b"\"}\n");
        end.sent(&line);
        assert!(!end.answered(br#"{"id":1,"result":{}}"#));
    }

    #[test]
    fn a_request_is_read_across_chunks_and_among_other_lines() {
        let mut end = SessionEnd::default();
        end.sent(b"{\"id\":1,\"method\":\"recall/health\"}\n{\"id\":\"s\",\"meth");
        assert!(!end.answered(br#"{"id":"s","result":{}}"#)); // not sent whole yet
        end.sent(b"od\":\"recall/shutdown\"}\n{\"id\":3,\"method\":\"recall/search\"}\n");
        assert!(end.answered(br#"{"jsonrpc":"2.0","id":"s","error":{"code":1}}"#));
        assert!(!end.answered(br#"{"id":"s"}"#)); // neither a result nor an error
        assert!(!end.answered(b"not json"));
    }

    #[test]
    fn a_shutdown_sent_as_a_notification_is_answered_only_by_a_null_id() {
        let mut end = SessionEnd::default();
        end.sent(b"{\"jsonrpc\":\"2.0\",\"method\":\"recall/shutdown\"}\n");
        assert!(end.answered(br#"{"id":null,"result":{}}"#));
        assert!(!end.answered(br#"{"result":{}}"#));
    }

    #[test]
    fn last_line_is_the_final_whole_line() {
        assert_eq!(last_line(b"a\nbc\n"), b"bc");
        assert_eq!(last_line(b"bc\n"), b"bc");
    }
}
