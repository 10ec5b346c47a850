//! `demo`: printing only (the demo itself is `fencelog::ops::demo`).

use std::path::Path;

use crate::Printed;

pub(crate) fn demo(dir: &Path, records: u64, appenders: u64, payload_bytes: usize) -> Printed {
    let report = fencelog::ops::demo::demo(dir, records, appenders, payload_bytes)?;
    let code = if report.intact() { 0 } else { 1 };
    Ok((serde_json::to_value(&report).expect("report serializes"), code))
}
