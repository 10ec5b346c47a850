//! `model`: the ownership state machine. Pure: no files, no clocks (time arrives
//! inside each transaction), no processes (liveness arrives as evidence in events).
//! The projection is a deterministic fold: `apply` = `check` + mutate, so replaying
//! the log reproduces exactly what each writer validated when it appended.

mod codec;
mod projection;
mod refusal;
mod types;

pub use codec::{CodecError, decode_txn, encode_txn};
pub use projection::{
    Checked, Lease, LeaseState, Outcome, Owner, Projection, REQUESTS_RETAINED, RequestEntry, Resource, Subject,
    TenureEnd, TenureEndHow,
};
pub use refusal::{Blocker, Refusal};
pub use types::*;
