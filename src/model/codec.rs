//! Transactions as record payloads: bincode 2.0.1 (standard configuration) via serde.

use super::Txn;

#[derive(Debug, Clone, thiserror::Error)]
#[error("undecodable transaction payload: {detail} (an unknown record kind or version is named here)")]
pub struct CodecError {
    pub detail: String,
}

/// Largest decoded payload accepted: the storage layer's hard bound on a record
/// payload, one constant, so that whatever storage accepted on append decodes on
/// replay (a smaller bound here made large transactions apply when written and be
/// skipped on replay).
const DECODE_BYTES_MAX: usize = crate::format::PAYLOAD_BYTES_HARD_MAX as usize;

pub fn encode_txn(txn: &Txn) -> Vec<u8> {
    bincode::serde::encode_to_vec(txn, bincode::config::standard()).expect("a Txn always encodes")
}

pub fn decode_txn(bytes: &[u8]) -> Result<Txn, CodecError> {
    let cfg = bincode::config::standard().with_limit::<DECODE_BYTES_MAX>();
    match bincode::serde::decode_from_slice::<Txn, _>(bytes, cfg) {
        Ok((txn, used)) if used == bytes.len() => Ok(txn),
        Ok((_, used)) => Err(CodecError { detail: format!("{} trailing bytes", bytes.len() - used) }),
        Err(e) => Err(CodecError { detail: e.to_string() }),
    }
}
