//! `model`: the ownership state machine. Pure: no files, no clocks (time arrives
//! inside each transaction), no processes (liveness arrives as evidence in events).
//! The projection is a deterministic fold: `apply` = `check` + mutate, so replaying
//! the log reproduces exactly what each writer validated when it appended.

mod codec;
mod process;
mod projection;
mod refusal;
mod types;

pub use codec::{CodecError, decode_txn, encode_txn};
pub use process::*;
pub use projection::{
    Checked, Lease, LeaseState, Outcome, Owner, Projection, REQUESTS_RETAINED, RequestEntry, Resource, Subject,
    TERMINAL_LEASES_RETAINED, TenureEnd, TenureEndHow,
};
pub use refusal::{Blocker, Refusal, Retired};
pub use types::*;

/// Serialize an externally tagged enum value as `{"kind": "snake_case_variant",
/// <its fields>}` (a unit variant gives just the kind).
pub fn flatten_tagged<T: serde::Serialize>(value: &T) -> serde_json::Value {
    let v = serde_json::to_value(value).expect("model values serialize");
    let (name, fields) = match &v {
        serde_json::Value::Object(o) if o.len() == 1 => {
            o.iter().next().map(|(k, f)| (k.clone(), f.clone())).expect("one")
        }
        serde_json::Value::String(name) => (name.clone(), serde_json::Value::Null),
        _ => return v,
    };
    let mut kind = String::new();
    for (i, c) in name.chars().enumerate() {
        if c.is_ascii_uppercase() && i > 0 {
            kind.push('_');
        }
        kind.push(c.to_ascii_lowercase());
    }
    let mut out = serde_json::Map::new();
    out.insert("kind".into(), kind.into());
    if let serde_json::Value::Object(f) = fields {
        out.extend(f);
    }
    out.into()
}
