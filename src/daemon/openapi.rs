//! The HTTP API's OpenAPI 3.1 document, generated from the types the daemon reads
//! and answers with (`utoipa`): the request bodies are the operations' own request
//! types, the answers the views the handlers serialize. `docs/openapi.json` is this
//! document, committed (a test fails when they differ: `FENCELOG_BLESS=1 cargo test
//! --lib openapi` rewrites it), and `GET /v1/openapi.json` serves it.
//!
//! The operations below are documentation only (`#[utoipa::path]` on empty
//! functions): the handlers in `http/handlers.rs` read raw bodies (strict JSON, request ids),
//! so the attribute cannot sit on them. `tests/openapi_conformance.rs` drives every
//! route against a real daemon and validates each answer against this document.

use std::sync::OnceLock;

use serde::Serialize;
use utoipa::openapi::schema::{AllOfBuilder, AnyOfBuilder, ObjectBuilder, Schema, Type};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{RefOr, Required};
use utoipa::{Modify, OpenApi, PartialSchema, ToSchema};

use crate::model::{Outcome, Refusal};
use crate::ops;
use crate::supervisor;

/// Every `code` an HTTP problem may carry (`docs/ERRORS.md`, the rows with an HTTP
/// status; a test holds the two together).
pub const HTTP_CODES: &[&str] = &[
    // State machine refusals.
    "INVALID_SUBJECT",
    "INVALID_INPUT",
    "ALREADY_ACTIVE",
    "STALE_REQUIRES_TAKEOVER",
    "TAKEOVER_RACE",
    "TAKEOVER_ACTIVE_REFUSED",
    "FENCED",
    "NOT_ACTIVE",
    "IDENTITY_UNCERTAIN",
    "BUSY",
    "LEASE_CONFLICT",
    "UNKNOWN_LEASE",
    "REQUEST_ID_CONFLICT",
    "CONDITION_FAILED",
    "GENERATION_EXHAUSTED",
    "UNKNOWN_PROCESS",
    "ALREADY_STARTED",
    "ALREADY_TERMINAL",
    "NOT_RUNNING",
    "LEASE_TOKEN_MISMATCH",
    // Input.
    "NO_SUCH_PROCESS",
    "COMMAND_NOT_FOUND",
    "INVALID_OPTION",
    "NOT_A_LOG",
    // Storage and the ledger.
    "IO_ERROR",
    "CORRUPTION",
    "UNSUPPORTED_FORMAT",
    "UNSAFE_PERMISSIONS",
    "RECORD_TOO_LARGE",
    "BATCH_TOO_LARGE",
    "EMPTY_BATCH",
    "HEAD_MOVED",
    "NOT_COMMITTED",
    "SYNC_FAILED",
    "WRITER_POISONED",
    "CUT_UNDER_READER",
    "ETCD_UNAVAILABLE",
    "ETCD_ERROR",
    "HISTORY_ARCHIVED",
    "LOCK_TIMEOUT",
    "CLOSED",
    "SNAPSHOT_NOT_IN_LOG",
    // The daemon's own.
    "UNAUTHENTICATED",
    "INSUFFICIENT_SCOPE",
    "NOT_FOUND",
    "METHOD_NOT_ALLOWED",
    "BODY_TOO_LARGE",
    "UNSUPPORTED_MEDIA_TYPE",
    "OVERLOADED",
    "REQUEST_TIMEOUT",
    "CUTOVER_IN_PROGRESS",
    "OUTCOME_UNKNOWN",
    "HOME_RESERVED",
    "EXPIRED",
];

/// The default `--listen` address, the document's server.
const SERVER: &str = "http://127.0.0.1:7411";

fn string_enum<I: IntoIterator<Item = S>, S: Into<String>>(values: I) -> ObjectBuilder {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .enum_values(Some(values.into_iter().map(Into::into).collect::<Vec<String>>()))
}

fn integer() -> ObjectBuilder {
    ObjectBuilder::new()
        .schema_type(Type::Integer)
        .format(Some(utoipa::openapi::SchemaFormat::KnownFormat(utoipa::openapi::KnownFormat::Int64)))
}

fn component(name: &str) -> RefOr<Schema> {
    RefOr::Ref(utoipa::openapi::Ref::from_schema_name(name))
}

/// The members of every problem document (RFC 9457), whatever its code.
pub struct ProblemBase;

impl PartialSchema for ProblemBase {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .description(Some("RFC 9457 members, then the error's own (`docs/ERRORS.md`)."))
            .property(
                "type",
                ObjectBuilder::new().schema_type(Type::String).description(Some("`urn:fencelog:problem:<code>`")),
            )
            .required("type")
            .property("title", ObjectBuilder::new().schema_type(Type::String).description(Some("The code.")))
            .required("title")
            .property("status", ObjectBuilder::new().schema_type(Type::Integer))
            .required("status")
            .property(
                "detail",
                ObjectBuilder::new().schema_type(Type::String).description(Some(
                    "What happened, for a person (a refusal's own `detail` evidence when it has one).",
                )),
            )
            .required("detail")
            .property("code", string_enum(HTTP_CODES.iter().copied()))
            .required("code")
            .property(
                "message",
                ObjectBuilder::new()
                    .schema_type(Type::String)
                    .description(Some("The CLI's message, for an operation's error.")),
            )
            .property(
                "retryable",
                ObjectBuilder::new().schema_type(Type::Boolean).description(Some(
                    "`NOT_COMMITTED`: true (known not in the log); `OUTCOME_UNKNOWN`: false (reconcile first).",
                )),
            )
            .into()
    }
}
impl ToSchema for ProblemBase {}

/// The evidence members a problem carries, by code: a refusal's (typed per code),
/// the storage's location of damage, the daemon's scope and reconcile members.
pub struct ProblemEvidence;

impl PartialSchema for ProblemEvidence {
    fn schema() -> RefOr<Schema> {
        let refusal_codes: Vec<&str> = <Refusal as strum::VariantNames>::VARIANTS.to_vec();
        let others: Vec<&str> = HTTP_CODES
            .iter()
            .copied()
            .filter(|c| {
                !refusal_codes.contains(c)
                    && !matches!(*c, "LEASE_TOKEN_MISMATCH" | "INSUFFICIENT_SCOPE" | "OUTCOME_UNKNOWN")
            })
            .collect();
        // One branch per code (a client narrows on `code`), each with the location of
        // damage a storage error may name.
        let per_code = |code: &str| {
            ObjectBuilder::new()
                .property("code", string_enum([code]))
                .required("code")
                .property("segment", ObjectBuilder::new().schema_type(Type::String))
                .property("offset", integer())
                .property("seq", integer())
        };
        // `INVALID_INPUT` refused by the front door has no evidence; by the state
        // machine, its `detail`: both are the same shape here.
        let scope = ObjectBuilder::new()
            .property("code", string_enum(["INSUFFICIENT_SCOPE"]))
            .required("code")
            .property("scope", string_enum(["read", "write", "admin"]))
            .required("scope")
            .property("token_scope", string_enum(["read", "write", "admin"]))
            .required("token_scope");
        let outcome_unknown = ObjectBuilder::new()
            .property("code", string_enum(["OUTCOME_UNKNOWN"]))
            .required("code")
            .property("action", string_enum(["reconcile"]))
            .required("action")
            .property("request_id", ObjectBuilder::new().schema_type(Type::String))
            .required("request_id")
            .property("process", integer())
            .required("process");
        let mut token_mismatch = ObjectBuilder::new()
            .description(Some("The release attempt is committed: the lease stays held, release pending."))
            .property("code", string_enum(["LEASE_TOKEN_MISMATCH"]))
            .required("code")
            .property("seq", integer())
            .required("seq")
            .property("deduplicated", ObjectBuilder::new().schema_type(Type::Boolean))
            .required("deduplicated");
        if let Some((_, RefOr::T(Schema::Object(o)))) =
            Outcome::variant_schemas().into_iter().find(|(k, _)| *k == "lease_release_failed")
        {
            for (name, s) in o.properties {
                if name != "code" {
                    token_mismatch = token_mismatch.property(name.clone(), s).required(name);
                }
            }
        }
        let any_of =
            AnyOfBuilder::new().item(component("Refusal")).item(token_mismatch).item(scope).item(outcome_unknown);
        others.iter().fold(any_of, |b, c| b.item(per_code(c))).into()
    }
}
impl ToSchema for ProblemEvidence {
    fn schemas(schemas: &mut Vec<(String, RefOr<Schema>)>) {
        schemas.push(("Refusal".into(), Refusal::schema()));
        <Refusal as ToSchema>::schemas(schemas);
    }
}

/// A problem document: the base members and the code's evidence.
pub struct Problem;

impl PartialSchema for Problem {
    fn schema() -> RefOr<Schema> {
        AllOfBuilder::new().item(component("ProblemBase")).item(component("ProblemEvidence")).into()
    }
}
impl ToSchema for Problem {
    fn schemas(schemas: &mut Vec<(String, RefOr<Schema>)>) {
        schemas.push(("ProblemBase".into(), ProblemBase::schema()));
        schemas.push(("ProblemEvidence".into(), ProblemEvidence::schema()));
        ProblemEvidence::schemas(schemas);
    }
}

/// What every mutation's answer carries beside its outcome.
pub struct MutationMeta;

impl PartialSchema for MutationMeta {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .property(
                "seq",
                utoipa::openapi::schema::OneOfBuilder::new()
                    .item(ObjectBuilder::new().schema_type(Type::Null))
                    .item(integer())
                    .description(Some("The record's sequence; null when nothing needed writing.")),
            )
            .required("seq")
            .property(
                "deduplicated",
                ObjectBuilder::new()
                    .schema_type(Type::Boolean)
                    .description(Some("The request id had already committed this content: this is that result.")),
            )
            .required("deduplicated")
            .property(
                "request_id",
                ObjectBuilder::new().schema_type(Type::String).description(Some(
                    "The `Idempotency-Key` (or one made by the daemon): ask `GET /v1/requests/{id}`.",
                )),
            )
            .required("request_id")
            .into()
    }
}
impl ToSchema for MutationMeta {}

/// A mutation's answer: one of its operation's outcomes (by `kind`) and
/// [`MutationMeta`].
macro_rules! mutation_answer {
    ($name:ident, $doc:literal, [$($kind:literal),+]) => {
        #[doc = $doc]
        pub struct $name;
        impl PartialSchema for $name {
            fn schema() -> RefOr<Schema> {
                let kinds = [$($kind),+];
                let mut outcomes: Vec<RefOr<Schema>> =
                    Outcome::variant_schemas().into_iter().filter(|(k, _)| kinds.contains(k)).map(|(_, s)| s).collect();
                let outcome: RefOr<Schema> = if outcomes.len() == 1 {
                    outcomes.remove(0)
                } else {
                    outcomes.into_iter().fold(AnyOfBuilder::new(), |b, s| b.item(s)).into()
                };
                AllOfBuilder::new().description(Some($doc)).item(outcome).item(component("MutationMeta")).into()
            }
        }
        impl ToSchema for $name {
            fn schemas(schemas: &mut Vec<(String, RefOr<Schema>)>) {
                schemas.push(("MutationMeta".into(), MutationMeta::schema()));
            }
        }
    };
}

mutation_answer!(
    ClaimAnswer,
    "A claim: the new tenure, or the same lock request's existing one.",
    ["claimed", "lock_reused"]
);
mutation_answer!(HeartbeatAnswer, "A heartbeat of the current generation.", ["heartbeat"]);
mutation_answer!(ReleaseAnswer, "A release: the subject has no owner now.", ["released"]);
mutation_answer!(TakeoverAnswer, "A takeover of a stale owner.", ["took_over"]);
mutation_answer!(RotateAnswer, "A fence rotation: the generation moved on, same owner.", ["rotated"]);
mutation_answer!(NoteAnswer, "A note under a generation.", ["noted"]);
mutation_answer!(LeaseAcquireAnswer, "A lease granted.", ["lease_acquired"]);
mutation_answer!(
    LeaseReleaseAnswer,
    "A lease released, or already ended (nothing written).",
    ["lease_released", "lease_already_ended"]
);

/// Bytes as they are (a process's output).
pub struct Binary;

impl PartialSchema for Binary {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .format(Some(utoipa::openapi::SchemaFormat::KnownFormat(utoipa::openapi::KnownFormat::Binary)))
            .into()
    }
}
impl ToSchema for Binary {}

/// `GET /v1/head`: the log's last sequence and its chain link.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct HeadAnswer {
    pub seq: u64,
    /// blake3 chain link of the record at `seq`, hex (64 characters).
    pub chain_head: String,
}

/// `POST /v1/admin/cutover`: accepted; the daemon hands over and exits.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct CutoverStarted {
    #[schema(value_type = String, example = "started")]
    pub cutover: &'static str,
}

/// The data of a watch stream's `record` event: one committed record, as `inspect
/// dump --json` shows it (without `segment` and `offset`).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct WatchRecord {
    pub seq: u64,
    pub time_ms: u64,
    /// `time_ms` as RFC 3339 UTC (or a note that it cannot be shown).
    pub time: String,
    #[schema(format = Uuid)]
    pub writer: String,
    /// The record's chain link, hex.
    pub link: String,
    /// The frame's size on disk.
    pub bytes: u64,
    /// The request id, if the transaction carried one.
    pub request: Option<String>,
    /// Each event's kind (`claim`, `heartbeat`, …; `undecodable` if the payload
    /// does not decode).
    pub kinds: Vec<String>,
    #[schema(required = false)]
    pub subjects: Vec<String>,
    /// Each condition as `{"kind": …, <fields>}`.
    #[schema(required = false)]
    pub conditions: Vec<serde_json::Map<String, serde_json::Value>>,
    /// Each event as `{"kind": …, <fields>}`.
    #[schema(required = false)]
    pub events: Vec<serde_json::Map<String, serde_json::Value>>,
    /// Why the payload does not decode (then `payload_bytes`).
    #[schema(required = false)]
    pub error: Option<String>,
    #[schema(required = false)]
    pub payload_bytes: Option<u64>,
}

/// The data of a watch stream's `cutover` event: the daemon is handing over; the
/// stream ends; reconnect (to the successor) with `Last-Event-ID`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct WatchCutover {
    pub cutover: bool,
}

/// `POST /v1/processes/{id}/wait`.
#[derive(Debug, Clone, Default, serde::Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct WaitBody {
    /// How long to wait for the process to end (default 30000, at most 60000).
    #[serde(default)]
    pub timeout_ms: Option<u64>,
}

/// `POST /v1/processes/{id}/cancel`.
#[derive(Debug, Clone, Default, serde::Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CancelBody {
    /// Cancel on behalf of this owner (with `generation`): fenced if it is not current.
    #[serde(default)]
    pub owner: Option<String>,
    #[serde(default)]
    pub generation: Option<u64>,
    /// How long after SIGTERM the group gets SIGKILL (default 2000, at most 60000).
    #[serde(default)]
    pub grace_ms: Option<u64>,
}

/// `GET /v1/processes`.
#[derive(Debug, serde::Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ProcessFilter {
    /// Only processes in this status.
    #[param(value_type = Option<crate::model::ProcessStatus>, inline)]
    pub status: Option<String>,
    /// Only processes held by this owner's tenures.
    pub owner: Option<String>,
}

/// `GET /v1/processes/{id}/logs`.
#[derive(Debug, serde::Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct LogsQuery {
    /// Which output (default `stdout`).
    #[param(inline)]
    pub stream: Option<supervisor::Stream>,
}

/// `GET /v1/state`.
#[derive(Debug, serde::Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct StateQuery {
    /// Only this subject (its leases are then not listed).
    pub subject: Option<String>,
}

/// `GET /v1/watch`.
#[derive(Debug, serde::Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct WatchQuery {
    /// The first sequence to send (`1`, or `0`: the whole log). Without it (and without
    /// `Last-Event-ID`) the stream starts at the head: only new records.
    pub from: Option<u64>,
}

/// `POST /v1/admin/cutover`.
#[derive(Debug, serde::Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct CutoverQuery {
    /// Wall-clock ms after which this request is void (a successor that asked and
    /// gave up must not cause a cutover later): then 409 `EXPIRED`.
    pub not_after_ms: Option<u64>,
}

struct Security;

impl Modify for Security {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        let components = doc.components.get_or_insert_with(Default::default);
        components.add_security_scheme("bearer", bearer_scheme());
        front_door_answers(&mut doc.paths);
        front_door_responses(components);
    }
}

/// The bearer tokens, one per scope.
fn bearer_scheme() -> SecurityScheme {
    SecurityScheme::Http(
        HttpBuilder::new()
            .scheme(HttpAuthScheme::Bearer)
            .description(Some(
                "The contents of a token file in the daemon's directory: `serve.read.token` (scope `read`: \
                 every GET, the watch, metrics), `serve.token` (`write`: and mutations and runs) or \
                 `serve.admin.token` (`admin`: and `/v1/admin/*`). Each scope includes the one before.",
            ))
            .build(),
    )
}

/// Each operation's answers from the front door, by reference to
/// [`front_door_responses`].
fn front_door_answers(paths: &mut utoipa::openapi::Paths) {
    // What the front door answers, one place for every operation: 413 for a
    // body announced too large (any route), 401 without a valid token (all but
    // the probes), 403 for a token without the scope (only where more than
    // `read` is needed: every POST).
    for (path, item) in paths.paths.iter_mut() {
        let probe = path == "/healthz" || path == "/readyz";
        if let Some(op) = item.get.as_mut() {
            op.responses
                .responses
                .insert("413".into(), RefOr::Ref(utoipa::openapi::Ref::from_response_name("BodyTooLarge")));
            if !probe {
                op.responses
                    .responses
                    .insert("401".into(), RefOr::Ref(utoipa::openapi::Ref::from_response_name("Unauthenticated")));
            }
        }
        if let Some(op) = item.post.as_mut() {
            for (status, name) in [("401", "Unauthenticated"), ("403", "InsufficientScope"), ("413", "BodyTooLarge")] {
                op.responses
                    .responses
                    .insert(status.into(), RefOr::Ref(utoipa::openapi::Ref::from_response_name(name)));
            }
        }
    }
}

/// The front door's answers as shared responses: `BodyTooLarge`,
/// `Unauthenticated`, `InsufficientScope`.
fn front_door_responses(components: &mut utoipa::openapi::Components) {
    let problem = |description: &str| {
        utoipa::openapi::ResponseBuilder::new()
            .description(description)
            .content(
                "application/problem+json",
                utoipa::openapi::ContentBuilder::new().schema(Some(component("Problem"))).build(),
            )
            .header(
                "WWW-Authenticate",
                utoipa::openapi::HeaderBuilder::new()
                    .schema(ObjectBuilder::new().schema_type(Type::String))
                    .description(Some(
                        "`Bearer`, `Bearer error=\"invalid_token\"` or `Bearer error=\"insufficient_scope\", scope=…`",
                    ))
                    .build(),
            )
            .build()
    };
    components.responses.insert(
        "BodyTooLarge".into(),
        RefOr::T(
            utoipa::openapi::ResponseBuilder::new()
                .description("`BODY_TOO_LARGE`: a body (or its `Content-Length`) over 65536 bytes.")
                .content(
                    "application/problem+json",
                    utoipa::openapi::ContentBuilder::new().schema(Some(component("Problem"))).build(),
                )
                .build(),
        ),
    );
    components.responses.insert(
        "Unauthenticated".into(),
        RefOr::T(problem("`UNAUTHENTICATED`: no bearer token, or not one of this daemon's.")),
    );
    components.responses.insert(
        "InsufficientScope".into(),
        RefOr::T(problem("`INSUFFICIENT_SCOPE`: the token's scope does not cover this route.")),
    );
}

fn operations(item: &mut utoipa::openapi::PathItem) -> impl Iterator<Item = &mut utoipa::openapi::path::Operation> {
    [&mut item.get, &mut item.post].into_iter().filter_map(Option::as_mut)
}

/// Every operation's problems, and the `Idempotency-Key` header of a mutation.
struct Problems;

impl Modify for Problems {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        for (_, item) in doc.paths.paths.iter_mut() {
            for op in operations(item) {
                for (status, r) in op.responses.responses.iter_mut() {
                    let RefOr::T(r) = r else { continue };
                    if status.starts_with('4') || status.starts_with('5') {
                        if r.content.is_empty() {
                            r.content.insert(
                                "application/problem+json".into(),
                                utoipa::openapi::ContentBuilder::new().schema(Some(component("Problem"))).build(),
                            );
                        }
                        if status == "503" {
                            r.headers.insert(
                                "Retry-After".into(),
                                utoipa::openapi::HeaderBuilder::new()
                                    .schema(integer())
                                    .description(Some("Seconds to wait before retrying."))
                                    .build(),
                            );
                        }
                    }
                }
                let mutation =
                    op.request_body.is_some() && op.tags.as_ref().is_some_and(|t| t.iter().any(|t| t == "mutations"));
                if mutation {
                    let key = utoipa::openapi::path::ParameterBuilder::new()
                        .name("Idempotency-Key")
                        .parameter_in(utoipa::openapi::path::ParameterIn::Header)
                        .required(Required::False)
                        .description(Some(
                            "The request id (else the body's `request_id`, else one the daemon makes). The same id \
                             with the same content is answered from the log, never applied twice; every answer \
                             echoes it.",
                        ))
                        .schema(Some(ObjectBuilder::new().schema_type(Type::String).min_length(Some(1))))
                        .build();
                    op.parameters.get_or_insert_with(Vec::new).push(key);
                    for (_, r) in op.responses.responses.iter_mut() {
                        if let RefOr::T(r) = r {
                            r.headers.insert(
                                "Idempotency-Key".into(),
                                utoipa::openapi::HeaderBuilder::new()
                                    .schema(ObjectBuilder::new().schema_type(Type::String))
                                    .description(Some("The request id of this mutation."))
                                    .build(),
                            );
                        }
                    }
                }
            }
        }
    }
}

/// The watch stream's events and their data's schemas (OpenAPI 3.1 has no word for
/// the items of a `text/event-stream`: an extension names them).
struct WatchEvents;

impl Modify for WatchEvents {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        let Some(op) = doc.paths.paths.get_mut("/v1/watch").and_then(|i| i.get.as_mut()) else { return };
        let Some(RefOr::T(ok)) = op.responses.responses.get_mut("200") else { return };
        let json = |s: RefOr<Schema>| serde_json::to_value(s).expect("a schema serializes");
        let events = serde_json::json!({
            "record": json(WatchRecord::schema()),
            "cutover": json(WatchCutover::schema()),
            "error": {"type": "string", "description": "Why the stream ends (the record that could not be read or shown)."},
        });
        let schema = ObjectBuilder::new()
            .schema_type(Type::String)
            .description(Some(
                "Server-Sent Events. `record`: `id:` its sequence, data a record (`x-sse-events`). `cutover`: data `{\"cutover\": true}`; \
                 the stream ends. `error`: data text; the stream ends. Comments: the start (`: from N`) and keep-alives.",
            ))
            .extensions(Some(utoipa::openapi::extensions::ExtensionsBuilder::new().add("x-sse-events", events).build()));
        if let Some(c) = ok.content.get_mut("text/event-stream") {
            c.schema = Some(schema.into());
        }
    }
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "fencelog daemon",
        description = "The HTTP API of `fencelog serve`: compare-and-append ownership, leases and supervised \
                       processes over one checksummed, hash-chained log. Errors are `application/problem+json` \
                       with a stable `code` (docs/ERRORS.md). Mutations take an `Idempotency-Key`; a lost answer \
                       is asked again at `GET /v1/requests/{id}`, never retried blindly.",
        license(name = "MIT", identifier = "MIT"),
    ),
    servers((url = "http://127.0.0.1:7411", description = "The default `--listen` address")),
    paths(
        claim, heartbeat, release, takeover, rotate_fence, note, lease_acquire, lease_release, run, processes,
        process_show, process_wait, process_cancel, process_logs, request_show, state, head, version, watch,
        admin_cutover, openapi_json, metrics, healthz, readyz
    ),
    components(schemas(
        Problem, ProblemBase, ProblemEvidence, MutationMeta, HeadAnswer, CutoverStarted
    )),
    modifiers(&Security, &Problems, &WatchEvents),
    security(("bearer" = [])),
    tags(
        (name = "mutations", description = "Compare-and-append: lands only if the generations it names still hold."),
        (name = "processes", description = "Supervised processes: spawn intents, starts and terminal outcomes in the log."),
        (name = "reads", description = "Answers from the log's whole history, never a partial one."),
        (name = "operations", description = "Health, readiness, metrics, cutover.")
    )
)]
struct ApiDoc;

/// The document, built once.
pub fn document() -> &'static utoipa::openapi::OpenApi {
    static DOC: OnceLock<utoipa::openapi::OpenApi> = OnceLock::new();
    DOC.get_or_init(|| {
        let mut d = ApiDoc::openapi();
        debug_assert_eq!(d.servers.as_ref().map(|s| s[0].url.as_str()), Some(SERVER));
        d.info.version = env!("CARGO_PKG_VERSION").into();
        d
    })
}

/// The document as `docs/openapi.json` holds it (pretty, with a final newline).
pub fn document_json() -> &'static str {
    static JSON: OnceLock<String> = OnceLock::new();
    JSON.get_or_init(|| {
        let mut v = serde_json::to_value(document()).expect("the document serializes");
        // A JSON Schema 2020-12 keyword utoipa does not build (its extensions take
        // only `x-` names): a cancel on an owner's behalf names both, or neither.
        v["components"]["schemas"]["CancelBody"]["dependentRequired"] =
            serde_json::json!({"owner": ["generation"], "generation": ["owner"]});
        // An answer's `Option` members are always sent (`null` when empty): utoipa
        // marks them optional; every member of these answers is required.
        for name in ALWAYS_SENT {
            let schema = v["components"]["schemas"].get_mut(*name);
            every_member_required(schema.unwrap_or_else(|| panic!("{name} is not a component")), &[]);
        }
        // A refusal's evidence is always sent, but `FENCED`'s `retired` (skipped
        // when the generation was not retired by a takeover or a dead-owner claim).
        if let Some(variants) = v["components"]["schemas"]["Refusal"]["oneOf"].as_array_mut() {
            for variant in variants {
                every_member_required(variant, &["retired"]);
            }
        }
        // `Last-Event-ID` is optional (utoipa makes a header that is not an
        // `Option` required, and an `Option` nullable).
        if let Some(params) = v["paths"]["/v1/watch"]["get"]["parameters"].as_array_mut() {
            for p in params.iter_mut().filter(|p| p["name"] == "Last-Event-ID") {
                p["required"] = serde_json::json!(false);
            }
        }
        // The probes take no credentials: `security: []`, not `[{}]`.
        for probe in ["/healthz", "/readyz"] {
            v["paths"][probe]["get"]["security"] = serde_json::json!([]);
        }
        serde_json::to_string_pretty(&v).expect("the document serializes") + "\n"
    })
}

/// The answers whose every member is always present (see `document_json`).
const ALWAYS_SENT: &[&str] = &[
    "SubjectState",
    "StateResponse",
    "Lease",
    "OwnerRef",
    "ProcessView",
    "CancelResponse",
    "ListResponse",
    "CaptureView",
    "HeadAnswer",
    "VersionInfo",
    "Identity",
    "TenureEnd",
    "CommandSpec",
    "EnvDigest",
    "LockIntent",
    "Blocker",
    "Retired",
];

/// Mark every property of an object schema (or of the inline objects of its
/// `allOf`) required, but `except`.
fn every_member_required(schema: &mut serde_json::Value, except: &[&str]) {
    if let Some(parts) = schema.get_mut("allOf").and_then(serde_json::Value::as_array_mut) {
        for part in parts {
            if part.get("properties").is_some() {
                every_member_required(part, except);
            }
        }
    }
    let Some(props) = schema.get("properties").and_then(serde_json::Value::as_object) else { return };
    let names: Vec<serde_json::Value> =
        props.keys().filter(|k| !except.contains(&k.as_str())).map(|k| serde_json::Value::String(k.clone())).collect();
    schema["required"] = serde_json::Value::Array(names);
}

// --- The operations (documentation only; the handlers are in http/handlers.rs). ---

/// Claim a subject.
///
/// Free, or its owner provably dead: a new generation. A live owner: 409
/// `ALREADY_ACTIVE`; a stale one not provably dead: 409 `STALE_REQUIRES_TAKEOVER`.
#[utoipa::path(post, path = "/v1/claim", operation_id = "claim", tag = "mutations",
    security(("bearer" = ["write"])),
    request_body = ops::ClaimRequest,
    responses(
        (status = 200, description = "Claimed (or the same lock request's holding)", body = ClaimAnswer),
        (status = 400, description = "Invalid input"),
        (status = 409, description = "Refused by the state machine"),
        (status = 500, description = "The log failed"),
        (status = 503, description = "Overloaded, handing over, or etcd unreachable: retry"),
    ))]
#[allow(dead_code)]
fn claim() {}

/// Heartbeat the generation held.
#[utoipa::path(post, path = "/v1/heartbeat", operation_id = "heartbeat", tag = "mutations",
    security(("bearer" = ["write"])),
    request_body = ops::GenerationRequest,
    responses(
        (status = 200, description = "Heartbeat recorded", body = HeartbeatAnswer),
        (status = 400, description = "Invalid input"),
        (status = 409, description = "`FENCED` or `NOT_ACTIVE`: this owner lost the subject"),
        (status = 500, description = "The log failed"),
        (status = 503, description = "Overloaded, handing over, or etcd unreachable: retry"),
    ))]
#[allow(dead_code)]
fn heartbeat() {}

/// Release the generation held.
#[utoipa::path(post, path = "/v1/release", operation_id = "release", tag = "mutations",
    security(("bearer" = ["write"])),
    request_body = ops::GenerationRequest,
    responses(
        (status = 200, description = "Released", body = ReleaseAnswer),
        (status = 400, description = "Invalid input"),
        (status = 409, description = "Refused by the state machine"),
        (status = 500, description = "The log failed"),
        (status = 503, description = "Overloaded, handing over, or etcd unreachable: retry"),
    ))]
#[allow(dead_code)]
fn release() {}

/// Take over a stale owner, naming exactly the generation and heartbeat seen.
#[utoipa::path(post, path = "/v1/takeover", operation_id = "takeover", tag = "mutations",
    security(("bearer" = ["write"])),
    request_body = ops::TakeoverRequest,
    responses(
        (status = 200, description = "Taken over", body = TakeoverAnswer),
        (status = 400, description = "Invalid input"),
        (status = 409, description = "`TAKEOVER_RACE`, `TAKEOVER_ACTIVE_REFUSED`, …"),
        (status = 500, description = "The log failed"),
        (status = 503, description = "Overloaded, handing over, or etcd unreachable: retry"),
    ))]
#[allow(dead_code)]
fn takeover() {}

/// Rotate the fence: a new generation for the same owner.
#[utoipa::path(post, path = "/v1/rotate-fence", operation_id = "rotateFence", tag = "mutations",
    security(("bearer" = ["write"])),
    request_body = ops::GenerationRequest,
    responses(
        (status = 200, description = "Rotated", body = RotateAnswer),
        (status = 400, description = "Invalid input"),
        (status = 409, description = "Refused by the state machine"),
        (status = 500, description = "The log failed"),
        (status = 503, description = "Overloaded, handing over, or etcd unreachable: retry"),
    ))]
#[allow(dead_code)]
fn rotate_fence() {}

/// A note under a generation (authoritative only while it is current).
#[utoipa::path(post, path = "/v1/note", operation_id = "note", tag = "mutations",
    security(("bearer" = ["write"])),
    request_body = ops::NoteRequest,
    responses(
        (status = 200, description = "Noted", body = NoteAnswer),
        (status = 400, description = "Invalid input"),
        (status = 409, description = "Refused by the state machine"),
        (status = 500, description = "The log failed"),
        (status = 503, description = "Overloaded, handing over, or etcd unreachable: retry"),
    ))]
#[allow(dead_code)]
fn note() {}

/// Acquire a read or write lease on a resource.
#[utoipa::path(post, path = "/v1/lease/acquire", operation_id = "leaseAcquire", tag = "mutations",
    security(("bearer" = ["write"])),
    request_body = ops::LeaseAcquireRequest,
    responses(
        (status = 200, description = "Granted", body = LeaseAcquireAnswer),
        (status = 400, description = "Invalid input"),
        (status = 409, description = "`LEASE_CONFLICT` (with its blockers), `FENCED`, …"),
        (status = 500, description = "The log failed"),
        (status = 503, description = "Overloaded, handing over, or etcd unreachable: retry"),
    ))]
#[allow(dead_code)]
fn lease_acquire() {}

/// Release a lease with its token.
#[utoipa::path(post, path = "/v1/lease/release", operation_id = "leaseRelease", tag = "mutations",
    security(("bearer" = ["write"])),
    request_body = ops::LeaseReleaseRequest,
    responses(
        (status = 200, description = "Released, or already ended", body = LeaseReleaseAnswer),
        (status = 400, description = "Invalid input"),
        (status = 404, description = "`UNKNOWN_LEASE`"),
        (status = 409, description = "`LEASE_TOKEN_MISMATCH`: the attempt is committed, the lease stays held"),
        (status = 500, description = "The log failed"),
        (status = 503, description = "Overloaded, handing over, or etcd unreachable: retry"),
    ))]
#[allow(dead_code)]
fn lease_release() {}

/// Run a command under supervision: its spawn intent, start and outcome go to the
/// log. Waits up to `wait_ms` for it to end; a lost answer is reconciled through
/// `GET /v1/requests/{id}`, never retried blindly.
#[utoipa::path(post, path = "/v1/run", operation_id = "run", tag = "mutations",
    security(("bearer" = ["write"])),
    request_body = supervisor::RunRequest,
    responses(
        (status = 200, description = "The process as it is when the wait ends (terminal or not)", body = supervisor::ProcessView),
        (status = 400, description = "Invalid input, `COMMAND_NOT_FOUND`"),
        (status = 409, description = "`LEASE_CONFLICT`, `FENCED`, `OUTCOME_UNKNOWN` at a cutover (reconcile first), …"),
        (status = 500, description = "The log failed"),
        (status = 503, description = "Overloaded, handing over, or etcd unreachable: retry"),
    ))]
#[allow(dead_code)]
fn run() {}

/// Every supervised process (optionally filtered).
#[utoipa::path(get, path = "/v1/processes", operation_id = "listProcesses", tag = "processes",
    security(("bearer" = ["read"])),
    params(ProcessFilter),
    responses(
        (status = 200, description = "The processes", body = supervisor::ListResponse),
        (status = 400, description = "Invalid filter"),
        (status = 500, description = "The log failed"),
        (status = 503, description = "Overloaded or etcd unreachable: retry"),
    ))]
#[allow(dead_code)]
fn processes() {}

/// One process (a process left without its runner is settled first).
#[utoipa::path(get, path = "/v1/processes/{id}", operation_id = "showProcess", tag = "processes",
    security(("bearer" = ["read"])),
    params(("id" = u64, Path, description = "The process id")),
    responses(
        (status = 200, description = "The process", body = supervisor::ProcessView),
        (status = 400, description = "The id is not an integer"),
        (status = 404, description = "`UNKNOWN_PROCESS`"),
        (status = 500, description = "The log failed"),
        (status = 503, description = "Overloaded or etcd unreachable: retry"),
    ))]
#[allow(dead_code)]
fn process_show() {}

/// Wait for a process to end (at most 60 s per request).
#[utoipa::path(post, path = "/v1/processes/{id}/wait", operation_id = "waitProcess", tag = "processes",
    security(("bearer" = ["write"])),
    params(("id" = u64, Path, description = "The process id")),
    request_body(content = WaitBody, description = "May be empty"),
    responses(
        (status = 200, description = "The process when it ended or the wait did (check `status`)", body = supervisor::ProcessView),
        (status = 400, description = "Invalid input"),
        (status = 404, description = "`UNKNOWN_PROCESS`"),
        (status = 500, description = "The log failed"),
        (status = 503, description = "Overloaded or etcd unreachable: retry"),
    ))]
#[allow(dead_code)]
fn process_wait() {}

/// Cancel a process: SIGTERM to its group, SIGKILL after `grace_ms`.
#[utoipa::path(post, path = "/v1/processes/{id}/cancel", operation_id = "cancelProcess", tag = "processes",
    security(("bearer" = ["write"])),
    params(("id" = u64, Path, description = "The process id")),
    request_body(content = CancelBody, description = "May be empty"),
    responses(
        (status = 200, description = "Cancel recorded (and whether a signal was sent)", body = supervisor::CancelResponse),
        (status = 400, description = "Invalid input"),
        (status = 404, description = "`UNKNOWN_PROCESS`"),
        (status = 409, description = "`NOT_RUNNING`, `FENCED`, `HOME_RESERVED`"),
        (status = 500, description = "The log failed"),
        (status = 503, description = "Overloaded, handing over, or etcd unreachable: retry"),
    ))]
#[allow(dead_code)]
fn process_cancel() {}

/// A process's captured output (the bytes kept, checked against its exit record).
#[utoipa::path(get, path = "/v1/processes/{id}/logs", operation_id = "processLogs", tag = "processes",
    security(("bearer" = ["read"])),
    params(("id" = u64, Path, description = "The process id"), LogsQuery),
    responses(
        (status = 200, description = "The output's bytes", content_type = "application/octet-stream", body = Binary),
        (status = 400, description = "Invalid query"),
        (status = 404, description = "`UNKNOWN_PROCESS`"),
        (status = 500, description = "The output does not match its record, or the log failed"),
        (status = 503, description = "Too many outputs streaming: retry"),
    ))]
#[allow(dead_code)]
fn process_logs() {}

/// What became of a request id: committed at a sequence (with its outcomes), or
/// never committed.
#[utoipa::path(get, path = "/v1/requests/{id}", operation_id = "showRequest", tag = "reads",
    security(("bearer" = ["read"])),
    params(("id" = String, Path, description = "The request id (`Idempotency-Key`)")),
    responses(
        (status = 200, description = "Its status", body = ops::RequestShowResponse),
        (status = 500, description = "The log failed"),
        (status = 503, description = "Overloaded or etcd unreachable: retry"),
    ))]
#[allow(dead_code)]
fn request_show() {}

/// The owners (each judged now), and the leases.
#[utoipa::path(get, path = "/v1/state", operation_id = "state", tag = "reads",
    security(("bearer" = ["read"])),
    params(StateQuery),
    responses(
        (status = 200, description = "The state", body = ops::StateResponse),
        (status = 400, description = "Invalid query or subject"),
        (status = 500, description = "The log failed"),
        (status = 503, description = "Overloaded or etcd unreachable: retry"),
    ))]
#[allow(dead_code)]
fn state() {}

/// The log's head.
#[utoipa::path(get, path = "/v1/head", operation_id = "head", tag = "reads",
    security(("bearer" = ["read"])),
    responses(
        (status = 200, description = "The head", body = HeadAnswer),
        (status = 500, description = "The log failed"),
        (status = 503, description = "Overloaded or etcd unreachable: retry"),
    ))]
#[allow(dead_code)]
fn head() {}

/// This build's version, the log formats it writes and reads, its features.
#[utoipa::path(get, path = "/v1/version", operation_id = "version", tag = "operations",
    security(("bearer" = ["read"])),
    responses(
        (status = 200, description = "The version", body = ops::version::VersionInfo),
    ))]
#[allow(dead_code)]
fn version() {}

/// Committed records as Server-Sent Events.
///
/// Events: `record` (data: `WatchRecord`; `id:` its sequence), `cutover` (data:
/// `WatchCutover`; the stream ends: reconnect to the successor), `error` (data:
/// text; the stream ends). The first message carries `retry: 1000` and `id:` the
/// sequence before the first to be sent; a comment `: keep-alive` is sent after 15 s
/// without a record. Resume with `Last-Event-ID` (the last `id:` seen): nothing is
/// missed or repeated.
#[utoipa::path(get, path = "/v1/watch", operation_id = "watch", tag = "reads",
    security(("bearer" = ["read"])),
    params(
        WatchQuery,
        ("Last-Event-ID" = u64, Header, description = "Resume after this sequence (takes precedence over `from`)"),
    ),
    responses(
        (status = 200, description = "The stream: events `record` (WatchRecord), `cutover` (WatchCutover), `error` (text)",
            content_type = "text/event-stream", body = String),
        (status = 400, description = "Invalid `from` or `Last-Event-ID`"),
        (status = 500, description = "The log failed"),
        (status = 503, description = "Too many watch streams, or etcd unreachable: retry"),
    ))]
#[allow(dead_code)]
fn watch() {}

/// Hand over to a successor: stop admitting, settle every admitted request,
/// record the cutover, exit.
#[utoipa::path(post, path = "/v1/admin/cutover", operation_id = "cutover", tag = "operations",
    security(("bearer" = ["admin"])),
    params(CutoverQuery),
    responses(
        (status = 202, description = "The cutover started", body = CutoverStarted),
        (status = 400, description = "A body with fields, or an invalid query"),
        (status = 409, description = "`EXPIRED`: the request came after `not_after_ms`"),
        (status = 503, description = "A cutover is already under way"),
    ))]
#[allow(dead_code)]
fn admin_cutover() {}

/// This document.
#[utoipa::path(get, path = "/v1/openapi.json", operation_id = "openapi", tag = "operations",
    security(("bearer" = ["read"])),
    responses(
        (status = 200, description = "The OpenAPI document", body = serde_json::Value),
    ))]
#[allow(dead_code)]
fn openapi_json() {}

/// Prometheus metrics: text format 0.0.4, or OpenMetrics when `Accept` asks for it.
#[utoipa::path(get, path = "/metrics", operation_id = "metrics", tag = "operations",
    security(("bearer" = ["read"])),
    responses(
        (status = 200, description = "The metrics", content(
            (String = "text/plain; version=0.0.4; charset=utf-8"),
            (String = "application/openmetrics-text; version=1.0.0; charset=utf-8"),
        )),
        (status = 500, description = "Encoding failed"),
        (status = 503, description = "Overloaded: retry"),
    ))]
#[allow(dead_code)]
fn metrics() {}

/// Liveness: the process answers.
#[utoipa::path(get, path = "/healthz", operation_id = "healthz", tag = "operations",
    security(()),
    responses(
        (status = 200, description = "`ok`", content_type = "text/plain", body = String),
    ))]
#[allow(dead_code)]
fn healthz() {}

/// Readiness: the log can be written and the daemon admits requests.
#[utoipa::path(get, path = "/readyz", operation_id = "readyz", tag = "operations",
    security(()),
    responses(
        (status = 200, description = "`ready`", content_type = "text/plain", body = String),
        (status = 503, description = "`WRITER_POISONED`, `ETCD_UNAVAILABLE` or `CUTOVER_IN_PROGRESS`"),
    ))]
#[allow(dead_code)]
fn readyz() {}

#[cfg(test)]
mod tests {
    use super::*;

    /// Proves: `docs/openapi.json` is exactly what the code generates (run with
    /// `FENCELOG_BLESS=1` to rewrite it after a deliberate change).
    #[test]
    fn the_committed_openapi_document_is_the_generated_one() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/openapi.json");
        if std::env::var_os("FENCELOG_BLESS").is_some() {
            std::fs::write(&path, document_json()).unwrap();
        }
        let committed = std::fs::read_to_string(&path).unwrap();
        assert!(
            committed == document_json(),
            "docs/openapi.json differs from the generated document: run `FENCELOG_BLESS=1 cargo test --lib openapi` \
             and review the diff"
        );
    }

    /// Proves: the bounds the document gives a run and a lease are the ones the
    /// server enforces (the attributes take literals; the constants are these).
    #[test]
    fn the_documented_bounds_are_the_enforced_ones() {
        let v: serde_json::Value = serde_json::from_str(document_json()).unwrap();
        let run = &v["components"]["schemas"]["RunRequest"]["properties"];
        assert_eq!(run["wait_ms"]["maximum"], crate::daemon::HTTP_WAIT_MS_MAX);
        assert_eq!(run["lease_wait_ms"]["maximum"], supervisor::LEASE_WAIT_MS_MAX);
        assert_eq!(run["timeout_ms"]["maximum"], supervisor::TIMEOUT_MS_MAX);
        assert_eq!(run["output_bytes_max"]["maximum"], supervisor::OUTPUT_BYTES_MAX_LIMIT);
        assert_eq!(run["command"]["minItems"], 1);
        let ttl = &v["components"]["schemas"]["LeaseAcquireRequest"]["properties"]["ttl_ms"];
        assert_eq!(ttl["maximum"], ops::LEASE_TTL_MS_MAX);
        assert_eq!(ttl["minimum"], 1);
    }

    /// Proves: the problem `code` enum is exactly the codes docs/ERRORS.md gives an
    /// HTTP status (a row whose HTTP column is not "—").
    #[test]
    fn the_problem_codes_are_the_documented_http_codes() {
        let doc =
            std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/ERRORS.md")).unwrap();
        let (errors, _) = doc.split_once("### Supervisor: process end codes").unwrap();
        let mut documented: Vec<&str> = errors
            .lines()
            .filter_map(|l| {
                let cells: Vec<&str> = l.split('|').map(str::trim).collect();
                let code = cells.get(1)?.strip_prefix('`')?.strip_suffix('`')?;
                let http = cells.get(3)?;
                (!http.starts_with('—') && http.chars().next()?.is_ascii_digit()).then_some(code)
            })
            .collect();
        documented.sort_unstable();
        let mut ours = HTTP_CODES.to_vec();
        ours.sort_unstable();
        assert_eq!(ours, documented);
    }
}
