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
    Checked, Lease, LeaseState, Outcome, Owner, Projection, REFUSAL_WINDOWS_MAX, REFUSAL_WINDOWS_RETAIN_MS,
    REQUESTS_RETAINED, RequestEntry, Resource, Subject, TERMINAL_LEASES_RETAINED, TenureEnd, TenureEndHow,
    refusal_window_key,
};
pub use refusal::{Blocker, Refusal, Retired};
pub use types::*;

/// `Serialize` for a model enum with two faces. In a record or a snapshot
/// (bincode: not human-readable) it writes what `#[derive(Serialize)]` wrote — the
/// variant's index, then its fields in order — so no byte of any log changes (a
/// test round-trips every variant through the derived `Deserialize`). In JSON it
/// is one flat object: `{"kind": "snake_case_variant", <fields>}`.
///
/// Each variant is listed as `INDEX Variant "kind" { field: json_name, … }` in
/// declaration order, with its JSON type (a tuple variant's field is `0: json_name:
/// Type`). The same list gives the OpenAPI schema of each variant (`variant_schemas`).
macro_rules! flat_enum_serialize {
    ($ty:ident { $($idx:literal $var:ident $kind:literal { $($field:tt : $json:ident : $fty:ty),* })* }) => {
        impl serde::Serialize for $ty {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                #[allow(unused_imports)]
                use serde::ser::{SerializeMap, SerializeStructVariant};
                let human = s.is_human_readable();
                match self {
                    $(
                        #[allow(non_shorthand_field_patterns)]
                        $ty::$var { $($field: $json),* } => {
                            // Each field is of the JSON type its schema declares.
                            $( let _: &$fty = $json; )*
                            if human {
                                let mut m = s.serialize_map(None)?;
                                m.serialize_entry("kind", $kind)?;
                                $( m.serialize_entry(stringify!($json), $json)?; )*
                                m.end()
                            } else {
                                let fields = 0 $( + { let _ = stringify!($json); 1 } )*;
                                #[allow(unused_mut)]
                                let mut v = s.serialize_struct_variant(stringify!($ty), $idx, stringify!($var), fields)?;
                                $( v.serialize_field(stringify!($json), $json)?; )*
                                v.end()
                            }
                        }
                    )*
                }
            }
        }

        impl $ty {
            /// The JSON schema of each variant's flat object, by its `kind`: every
            /// member is always present (`null` when empty).
            pub fn variant_schemas() -> Vec<(&'static str, utoipa::openapi::RefOr<utoipa::openapi::schema::Schema>)> {
                vec![$((
                    $kind,
                    utoipa::openapi::schema::ObjectBuilder::new()
                        .property(
                            "kind",
                            utoipa::openapi::schema::ObjectBuilder::new()
                                .schema_type(utoipa::openapi::schema::Type::String)
                                .enum_values(Some([$kind])),
                        )
                        .required("kind")
                        $(
                            .property(stringify!($json), <$fty as utoipa::PartialSchema>::schema())
                            .required(stringify!($json))
                        )*
                        .into(),
                ),)*]
            }
        }

        impl utoipa::PartialSchema for $ty {
            fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
                let mut one_of = utoipa::openapi::schema::OneOfBuilder::new();
                for (_, s) in $ty::variant_schemas() {
                    one_of = one_of.item(s);
                }
                one_of.into()
            }
        }

        impl utoipa::ToSchema for $ty {}
    };
}
pub(crate) use flat_enum_serialize;

/// Serialize an externally tagged enum value as `{"kind": "snake_case_variant",
/// <its fields>}` (a unit variant gives just the kind).
pub fn flatten_tagged<T: serde::Serialize>(value: &T) -> serde_json::Value {
    let v = serde_json::to_value(value).expect("model values serialize");
    // The variant's name and fields are moved out, never copied.
    let (name, fields) = match v {
        serde_json::Value::Object(o) if o.len() == 1 && !o.contains_key("kind") => o.into_iter().next().expect("one"),
        serde_json::Value::String(name) => (name, serde_json::Value::Null),
        v => return v,
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

#[cfg(test)]
mod tests {
    use super::projection::GrantedLease;
    use super::*;

    fn bin<T: serde::Serialize>(v: &T) -> Vec<u8> {
        bincode::serde::encode_to_vec(v, bincode::config::standard()).unwrap()
    }

    /// Round-trip through the derived `Deserialize` (unchanged since the first
    /// log was written): the bytes must decode to the same value and be used up.
    fn round_trips<T: serde::Serialize + serde::de::DeserializeOwned + PartialEq + std::fmt::Debug>(v: &T) {
        let bytes = bin(v);
        let (back, used): (T, usize) = bincode::serde::decode_from_slice(&bytes, bincode::config::standard()).unwrap();
        assert_eq!((&back, used), (v, bytes.len()), "{v:?}");
    }

    fn id() -> Identity {
        Identity { instance: uuid::Uuid::from_u128(1), pid: 2, start_ticks: 3, boot_id: "b".into(), exe: "e".into() }
    }

    fn end(how: TenureEndHow) -> TenureEnd {
        TenureEnd { generation: 1, instance: uuid::Uuid::from_u128(4), pid: 5, cut_off_seq: 6, ended_ms: 7, how }
    }

    /// Proves: the two-faced enums write in records exactly what their derived
    /// `Serialize` wrote (every variant decodes back, byte for byte, through the
    /// derived `Deserialize`), and in JSON one flat object with a snake_case `kind`.
    #[test]
    fn model_enums_keep_their_record_bytes_and_are_flat_snake_case_in_json() {
        let hows = [TenureEndHow::Released, TenureEndHow::TakenOver, TenureEndHow::DeadOwner(DeathReason::ExeChanged)];
        for h in hows {
            round_trips(&h);
        }
        // Variant index first, then the fields: what derive wrote.
        assert_eq!(bin(&TenureEndHow::DeadOwner(DeathReason::BootChanged)), vec![2, 2]);
        let states = [
            LeaseState::Held,
            LeaseState::ReleasePending { code: "TOKEN_MISMATCH".into(), attempts: 2 },
            LeaseState::Released { seq: 9 },
            LeaseState::Displaced { seq: 10 },
        ];
        for st in &states {
            round_trips(st);
        }
        let capture =
            Capture { bytes_seen: 1, bytes_kept: 1, truncated: false, kept_blake3: [7; 32], tail: b"x".to_vec() };
        let exit = Exit {
            exit_code: Some(0),
            signal: None,
            timed_out: false,
            cancelled: false,
            duration_ms: 3,
            stdout: capture.clone(),
            stderr: capture,
        };
        let ends = [
            ProcessEnd::Exited(exit),
            ProcessEnd::CompletedUnknown { runner: "process_dead".into(), command_alive: true },
            ProcessEnd::Failed { code: "SPAWN_FAILED".into(), detail: "d".into() },
        ];
        for e in &ends {
            round_trips(e);
        }
        let s = || "s".to_owned();
        let outcomes = vec![
            Outcome::Claimed { subject: s(), generation: 1, owner: id(), retired: Some(end(hows[2])) },
            Outcome::LockReused { subject: s(), generation: 1, owner: id() },
            Outcome::Heartbeat { subject: s(), generation: 1, heartbeat_ms: 2 },
            Outcome::Released { subject: s(), generation: 1 },
            Outcome::TookOver { subject: s(), generation: 2, owner: id(), retired: end(hows[1]) },
            Outcome::Rotated { subject: s(), generation: 3 },
            Outcome::Noted { subject: s(), generation: 3, authoritative: true },
            Outcome::FencedAudit { subject: s(), count: 4 },
            Outcome::LeaseAcquired {
                lease: 1,
                resource: "r".into(),
                mode: LeaseMode::Write,
                token: 2,
                expires_ms: 3,
                displaced: vec![4],
            },
            Outcome::LeaseReleased { lease: 1, token: 2 },
            Outcome::LeaseAlreadyEnded { lease: 1, state: states[2].clone() },
            Outcome::LeaseReleaseFailed { lease: 1, code: "c".into(), attempts: 2, presented: 3 },
            Outcome::Checkpointed { snapshot_seq: 5 },
            Outcome::SpawnRecorded {
                process: 1,
                leases: vec![GrantedLease { lease: 1, resource: "r".into(), mode: LeaseMode::Read, token: 1 }],
                displaced: vec![],
            },
            Outcome::ProcessStarted { process: 1, command_pid: 2 },
            Outcome::CancelRecorded { process: 1 },
            Outcome::ProcessEnded { process: 1, status: ProcessStatus::Succeeded, leases_released: vec![1] },
            Outcome::CutoverRecorded { settled: 2 },
            Outcome::EvidenceRecorded { subject: s() },
        ];
        for o in &outcomes {
            round_trips(o);
            let json = serde_json::to_value(o).unwrap();
            let kind = json["kind"].as_str().unwrap_or_default().to_owned();
            assert!(!kind.is_empty() && kind.chars().all(|c| c.is_ascii_lowercase() || c == '_'), "{json}");
        }
        let j = serde_json::to_value(&outcomes[0]).unwrap();
        assert_eq!(j["kind"], "claimed");
        assert_eq!(j["retired"]["how"], serde_json::json!({"kind": "dead_owner", "reason": "exe_changed"}));
        assert_eq!(serde_json::to_value(&outcomes[8]).unwrap()["mode"], "write");
        assert_eq!(
            serde_json::to_value(&outcomes[10]).unwrap()["state"],
            serde_json::json!({"kind": "released", "seq": 9})
        );
        assert_eq!(serde_json::to_value(&states[0]).unwrap(), serde_json::json!({"kind": "held"}));
        assert_eq!(serde_json::to_value(&ends[0]).unwrap()["kind"], "exited");
        assert_eq!(serde_json::to_value(&ends[0]).unwrap()["exit"]["exit_code"], 0);
        // The capitalised spellings earlier builds sent are still read.
        assert_eq!(serde_json::from_str::<LeaseMode>("\"Write\"").unwrap(), LeaseMode::Write);
        assert_eq!(serde_json::from_str::<LeaseMode>("\"read\"").unwrap(), LeaseMode::Read);
    }
}
