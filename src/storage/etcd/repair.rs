//! `fencelog repair --etcd`: cut a damaged log in etcd from record N on, on
//! purpose, as `repair` cuts a directory — only a damaged log, only from its first
//! damaged record or earlier — with the cut records kept as evidence: their keys'
//! bytes, as they were, under `P` `ev/` cut time `/r/` sequence, and the
//! descriptions of the snapshots of state that included them under `P` `ev/` cut
//! time `/s/` sequence. The cut itself is one `Txn` that compares the head (a
//! writer that appended meanwhile makes it fail, nothing cut): the head set back
//! to record N-1 and the record keys from N on deleted.

use etcd_client::{Compare, CompareOp, DeleteOptions, Txn, TxnOp};

use super::{ETCD_TXN_OPS_MAX, EtcdBackend, GROUP_PAYLOAD_BYTES_MAX, keys};
use crate::format::{BODY_BYTES_HARD_MAX, decode_frame, hex};
use std::path::PathBuf;

use crate::storage::{Cut, Problem, RepairReport, SnapshotMeta};
use crate::storage::{Error, Result, ScanItem};

impl EtcdBackend {
    /// Cut the log from record `cut_from_seq` on (see the module).
    pub fn repair(&self, cut_from_seq: u64, now_ms: u64) -> Result<RepairReport> {
        let first = self.first_seq();
        let damage = self.damage_to_cut(first, cut_from_seq)?;
        // The link the log ends with after the cut: record N-1's, read from its
        // frame (which the scan found intact: it lies before the first damage).
        let before = self.conn.get(keys::record(&self.prefix, cut_from_seq - 1), None)?;
        let link = before
            .kvs()
            .first()
            .and_then(|kv| decode_frame(kv.value(), BODY_BYTES_HARD_MAX).ok())
            .filter(|(rec, _)| rec.seq == cut_from_seq - 1)
            .map(|(rec, _)| rec.link)
            .ok_or_else(|| invalid(format!("record {} cannot be read to end the log with", cut_from_seq - 1)))?;
        let head_key = keys::key(&self.prefix, keys::HEAD);
        let head_now = self.conn.get(head_key.clone(), None)?;
        let head_bytes = head_now.kvs().first().map(|kv| kv.value().to_vec()).unwrap_or_default();
        // Evidence first: a crash before the cut leaves copies, nothing lost.
        let evidence = format!("ev/{now_ms:020}/");
        let records_end = keys::prefix_end(&keys::key(&self.prefix, keys::RECORDS));
        let (records, bytes) = self.copy_records_to_evidence(cut_from_seq, &evidence, &records_end)?;
        let (snapshots, _) = self.newest_snapshots_all();
        let set_aside = self.copy_snapshots_to_evidence(&snapshots, cut_from_seq, &evidence)?;
        let cut = Txn::new().when([Compare::value(head_key.clone(), CompareOp::Equal, head_bytes)]).and_then([
            TxnOp::put(head_key, keys::head_value(cut_from_seq - 1, &link), None),
            TxnOp::delete(
                keys::record(&self.prefix, cut_from_seq),
                Some(DeleteOptions::new().with_range(records_end.clone())),
            ),
        ]);
        if !self.conn.txn(cut)?.succeeded() {
            return Err(Error::HeadMoved { expected: 0, actual: self.read_head()?.seq });
        }
        for s in snapshots.iter().filter(|s| s.seq >= cut_from_seq) {
            self.conn.delete(keys::snapshot_dir(&self.prefix, s.seq), DeleteOptions::new().with_prefix())?;
        }
        let after = self.scan(first, |_| true)?;
        Ok(RepairReport {
            dir: self.opts.describe().into(),
            cut_from_seq,
            damage,
            cuts: vec![Cut {
                segment: self.key_path(cut_from_seq),
                offset: 0,
                bytes,
                evidence: format!("{}{evidence}r/ ({records} records)", self.opts.describe()).into(),
            }],
            snapshots_set_aside: set_aside,
            last_seq: cut_from_seq - 1,
            chain_head: hex(&link),
            intact: after.problems.is_empty(),
        })
    }

    /// The first damage of the log held from `first` on, once a cut from
    /// `cut_from_seq` mends it: from the first damage or earlier, and leaving a
    /// record. An intact log is `NOTHING_TO_REPAIR`.
    fn damage_to_cut(&self, first: u64, cut_from_seq: u64) -> Result<Problem> {
        let mut damage = None;
        self.scan(first, |item| match item {
            ScanItem::Damage(p) => {
                damage = Some(p.clone());
                false
            }
            ScanItem::Record { .. } => true,
        })?;
        let Some(damage) = damage else {
            return Err(Error::NothingToRepair {
                detail: "the log is intact: there is nothing to repair (repair cuts only a damaged log)".into(),
            });
        };
        if cut_from_seq == 0 || cut_from_seq > damage.seq {
            return Err(invalid(format!(
                "the first damage is at sequence {} ({} at {}); cut from {} or earlier",
                damage.seq,
                damage.kind,
                damage.segment.display(),
                damage.seq
            )));
        }
        if cut_from_seq <= first {
            return Err(invalid(format!(
                "cutting from {cut_from_seq} would remove every record this prefix holds (it begins at {first}); \
                 restore the damaged key from a copy (or an export) instead"
            )));
        }
        Ok(damage)
    }

    /// Copy the record keys from `cut_from_seq` to `records_end` under `evidence`,
    /// their bytes as they are; how many records and bytes were copied.
    fn copy_records_to_evidence(&self, cut_from_seq: u64, evidence: &str, records_end: &[u8]) -> Result<(u64, u64)> {
        let mut from = keys::record(&self.prefix, cut_from_seq);
        let (mut records, mut bytes) = (0u64, 0u64);
        let mut pager = super::Pager::new();
        loop {
            let page = self.conn.get_page(from.clone(), records_end.to_vec(), &mut pager)?;
            // Copied in `Txn`s within etcd's limits (operations and bytes).
            let (mut ops, mut txn_bytes) = (Vec::new(), 0usize);
            for kv in page.kvs() {
                if !ops.is_empty()
                    && (ops.len() == ETCD_TXN_OPS_MAX || txn_bytes + kv.value().len() > GROUP_PAYLOAD_BYTES_MAX)
                {
                    self.conn.txn(Txn::new().and_then(std::mem::take(&mut ops)))?;
                    txn_bytes = 0;
                }
                let tail = String::from_utf8_lossy(&kv.key()[self.prefix.len()..]).into_owned();
                (records, bytes) = (records + 1, bytes + kv.value().len() as u64);
                txn_bytes += kv.value().len();
                ops.push(TxnOp::put(keys::key(&self.prefix, &format!("{evidence}{tail}")), kv.value().to_vec(), None));
            }
            if !ops.is_empty() {
                self.conn.txn(Txn::new().and_then(ops))?;
            }
            if let Some(last) = page.kvs().last() {
                from = last.key().to_vec();
                from.push(0);
            }
            if !page.more() {
                break;
            }
        }
        Ok((records, bytes))
    }

    /// Copy the descriptions of the snapshots of state at `cut_from_seq` or later
    /// under `evidence`; the keys they were copied to.
    fn copy_snapshots_to_evidence(
        &self,
        snapshots: &[SnapshotMeta],
        cut_from_seq: u64,
        evidence: &str,
    ) -> Result<Vec<PathBuf>> {
        let mut set_aside = Vec::new();
        for s in snapshots.iter().filter(|s| s.seq >= cut_from_seq) {
            let meta = self.conn.get(keys::snapshot_meta(&self.prefix, s.seq), None)?;
            if let Some(kv) = meta.kvs().first() {
                let to = keys::key(&self.prefix, &format!("{evidence}s/{:020}", s.seq));
                self.conn.put(to.clone(), kv.value().to_vec())?;
                set_aside.push(String::from_utf8_lossy(&to).into_owned().into());
            }
        }
        Ok(set_aside)
    }
}

fn invalid(detail: String) -> Error {
    Error::InvalidOption { detail }
}
