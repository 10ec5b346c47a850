//! One record, and one refused caller, as every service shows them: the inspector's
//! `dump --json` line, the daemon's watch events, the audit's findings.

use std::path::Path;

use serde_json::{Value, json};

use super::time::format_ms;
use crate::format::{RecordRef, frame_bytes, hex};
use crate::model::{Event, decode_txn, flatten_tagged};

/// A segment's file name, for messages (the whole path if it has none).
pub fn file_name(p: &Path) -> String {
    p.file_name().map_or_else(|| p.display().to_string(), |n| n.to_string_lossy().into_owned())
}

/// One decoded record as stable JSON (the `dump --json` line).
pub fn record_json(rec: &RecordRef<'_>, segment: &Path, offset: u64) -> Value {
    let mut v = json!({
        "seq": rec.seq,
        "time_ms": rec.time_ms,
        "time": format_ms(rec.time_ms),
        "writer": uuid::Uuid::from_bytes(rec.writer).to_string(),
        "link": hex(&rec.link),
        "segment": file_name(segment),
        "offset": offset,
        "bytes": frame_bytes(rec.payload.len()),
    });
    match decode_txn(rec.payload) {
        Ok(txn) => {
            v["request"] = json!(txn.request.as_ref().map(|r| &r.id));
            v["kinds"] = json!(txn.events.iter().map(Event::kind).collect::<Vec<_>>());
            v["subjects"] = json!(txn.events.iter().filter_map(Event::subject).collect::<Vec<_>>());
            v["conditions"] = json!(txn.conditions.iter().map(flatten_tagged).collect::<Vec<_>>());
            v["events"] = json!(txn.events.iter().map(flatten_tagged).collect::<Vec<_>>());
        }
        Err(e) => {
            v["kinds"] = json!(["undecodable"]);
            v["error"] = json!(e.to_string());
            v["payload_bytes"] = json!(rec.payload.len());
        }
    }
    v
}

/// A refused caller, as text: `pid P (start T, exe E) instance I`, or `remote`.
pub fn caller_text(c: &crate::model::CallerId) -> String {
    let mut s = if c.pid == 0 {
        "a remote caller".to_owned()
    } else {
        format!("pid {} (start {}, exe {})", c.pid, c.start_ticks, c.exe)
    };
    if let Some(i) = c.instance {
        s += &format!(" instance {i}");
    }
    s
}
