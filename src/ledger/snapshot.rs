//! Snapshots as the ledger sees them: the projection encoded as a body (storage
//! keeps the bytes, see `storage::snapshots`), and decoded only once the chain has
//! vouched for its digest.

use crate::format::{ChainLink, hex};
use crate::model::Projection;

pub use crate::storage::snapshots::{SNAPSHOTS_KEPT, SnapshotMeta, digest_of};

/// The snapshot body of a projection (bincode; deterministic: every map is a
/// BTreeMap, so one state has one digest whoever writes it).
pub fn body_of(p: &Projection) -> Vec<u8> {
    bincode::serde::encode_to_vec(p, bincode::config::standard()).expect("projection encodes")
}

/// The projection in a snapshot body covering `seq`.
pub fn decode(body: &[u8], seq: u64) -> Result<Projection, String> {
    // Claimed lengths are bounded (a corrupt length cannot ask for gigabytes).
    const DECODE_BYTES_MAX: usize = 1 << 30;
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
