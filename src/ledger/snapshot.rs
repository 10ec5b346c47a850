//! Snapshots as the ledger sees them: the projection encoded as a body (storage
//! keeps the bytes, see `storage::snapshots`), and decoded only once the chain has
//! vouched for its digest.

use crate::format::{ChainLink, hex};
use crate::model::Projection;

pub use crate::storage::snapshots::{SNAPSHOTS_KEPT, SnapshotMeta, digest_of};

/// A snapshot body begins with this tag and the schema of the projection encoded
/// after it. (0xFF begins no bincode varint, so no untagged body — schema 1, what
/// builds before the tag wrote — can look tagged.)
const BODY_TAG: [u8; 7] = [0xFF, b'F', b'L', b'P', b'R', b'O', b'J'];
/// The projection's schema: bumped whenever `Projection` (or a type in it) changes
/// its encoding. A snapshot of another schema is never decoded: it is ignored (a
/// warning; the log is replayed from an older snapshot or from record 1), and
/// `inspect verify` does not compare it.
pub const PROJECTION_SCHEMA: u8 = 3;
/// Bytes of a body that tell its schema.
pub const SCHEMA_PREFIX_BYTES: usize = BODY_TAG.len() + 1;

/// The snapshot body of a projection: the tag, the schema, then bincode
/// (deterministic: every map is a BTreeMap, so one state has one digest whoever
/// writes it).
pub fn body_of(p: &Projection) -> Vec<u8> {
    let mut body = Vec::with_capacity(4096);
    body.extend_from_slice(&BODY_TAG);
    body.push(PROJECTION_SCHEMA);
    bincode::serde::encode_into_std_write(p, &mut body, bincode::config::standard()).expect("projection encodes");
    body
}

/// The schema a body (or its first [`SCHEMA_PREFIX_BYTES`]) was written with.
pub fn schema_of(prefix: &[u8]) -> u8 {
    match prefix.strip_prefix(&BODY_TAG[..]) {
        Some([schema, ..]) => *schema,
        _ => 1,
    }
}

/// The projection in a snapshot body covering `seq`.
pub fn decode(body: &[u8], seq: u64) -> Result<Projection, String> {
    // Claimed lengths are bounded (a corrupt length cannot ask for gigabytes).
    const DECODE_BYTES_MAX: usize = 1 << 30;
    let schema = schema_of(body);
    if schema != PROJECTION_SCHEMA {
        let who = if schema < PROJECTION_SCHEMA { "an earlier" } else { "a later" };
        return Err(format!(
            "a projection of schema {schema}, written by {who} build (this one reads schema {PROJECTION_SCHEMA})"
        ));
    }
    let body = &body[SCHEMA_PREFIX_BYTES..];
    let cfg = bincode::config::standard().with_limit::<DECODE_BYTES_MAX>();
    let (p, used): (Projection, usize) = bincode::serde::decode_from_slice(body, cfg).map_err(|e| e.to_string())?;
    if used != body.len() {
        return Err(format!("{} trailing bytes", body.len() - used));
    }
    if p.last_seq != seq {
        return Err(format!("covers sequence {} but says {seq}", p.last_seq));
    }
    Ok(p)
}

pub fn describe(seq: u64, head: &ChainLink) -> String {
    format!("sequence {seq}, chain head {}", hex(head))
}
