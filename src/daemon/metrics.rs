//! `GET /metrics`: what a Prometheus server scrapes. Counters are counters (named
//! `_total`), units are base units in the names (`_seconds`, `_bytes`), and the
//! process metrics a Prometheus user expects are there (`process_*`, unprefixed).
//!
//! Two formats from one registry: OpenMetrics 1.0 when the scraper asks for it
//! (`Accept: application/openmetrics-text`), else the Prometheus text format 0.0.4
//! — what `promtool check metrics` and a plain `curl` get. prometheus-client
//! writes OpenMetrics only; [`text_004`] rewrites its output (a counter's HELP and
//! TYPE name the `_total` series, `info` becomes a gauge, no `# UNIT`, no `# EOF`).

use prometheus_client::encoding::text::{encode_eof, encode_registry};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::{Registry, Unit};

use super::{App, CONCURRENT_REQUESTS_MAX, CONNECTIONS_MAX, WATCH_STREAMS_MAX};
use crate::ops;

type Labels = Vec<(String, String)>;

/// The content type of each format.
pub(crate) const OPENMETRICS_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
pub(crate) const TEXT_004_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

pub(crate) struct Metrics {
    registry: Registry,
    /// `process_*`: no `fencelog_` prefix (the names every exporter uses).
    process: Registry,
    pub(crate) requests: Family<Labels, Counter>,
    pub(crate) refusals: Family<Labels, Counter>,
    /// Admission to answer, by operation (`claim`, `heartbeat`, `run`, …).
    pub(crate) commit_seconds: Family<Labels, Histogram>,
    appends: Counter,
    syncs: Counter,
    inline_leads: Counter,
    inline_leads_declined: Counter,
    head_seq: Gauge,
    log_bytes: Gauge,
    subjects: Family<Labels, Gauge>,
    processes: Family<Labels, Gauge>,
    leases: Family<Labels, Gauge>,
    requests_in_flight: Gauge,
    connections_open: Gauge,
    watch_streams: Gauge,
    home_heartbeat_age_seconds: Gauge<f64, std::sync::atomic::AtomicU64>,
    ready: Gauge,
    cpu_seconds: Counter<f64, std::sync::atomic::AtomicU64>,
    resident_memory_bytes: Gauge,
    open_fds: Gauge,
    start_time_seconds: Gauge<f64, std::sync::atomic::AtomicU64>,
    /// One scrape at a time: the counters brought up to date by difference, and
    /// the families cleared and refilled, must not interleave (two Prometheus
    /// servers scraping at once).
    scraping: std::sync::Mutex<()>,
}

fn histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.000_05, 2.0, 18))
}

impl Metrics {
    pub(crate) fn new() -> Metrics {
        let m = Metrics {
            registry: Registry::default(),
            process: Registry::default(),
            requests: Family::default(),
            refusals: Family::default(),
            commit_seconds: Family::new_with_constructor(histogram),
            appends: Counter::default(),
            syncs: Counter::default(),
            inline_leads: Counter::default(),
            inline_leads_declined: Counter::default(),
            head_seq: Gauge::default(),
            log_bytes: Gauge::default(),
            subjects: Family::default(),
            processes: Family::default(),
            leases: Family::default(),
            requests_in_flight: Gauge::default(),
            connections_open: Gauge::default(),
            watch_streams: Gauge::default(),
            home_heartbeat_age_seconds: Gauge::default(),
            ready: Gauge::default(),
            cpu_seconds: Counter::default(),
            resident_memory_bytes: Gauge::default(),
            open_fds: Gauge::default(),
            start_time_seconds: Gauge::default(),
            scraping: std::sync::Mutex::new(()),
        };
        let (registry, process) = (m.fencelog_registry(), m.process_registry());
        Metrics { registry, process, ..m }
    }

    /// The `fencelog_*` families, in the order they are written out.
    fn fencelog_registry(&self) -> Registry {
        let mut r = Registry::with_prefix("fencelog");
        r.register("http_requests", "HTTP requests answered, by route template and status", self.requests.clone());
        r.register(
            "refusals",
            "Problems answered, by code (operations' refusals and the front door's)",
            self.refusals.clone(),
        );
        r.register_with_unit(
            "commit",
            "Mutation latency from admission to answer, by operation",
            Unit::Seconds,
            self.commit_seconds.clone(),
        );
        r.register("appends", "Records appended to the log by this daemon's writer", self.appends.clone());
        r.register(
            "syncs",
            "Syncs (or etcd transactions) made: records per sync = appends / syncs",
            self.syncs.clone(),
        );
        r.register(
            "inline_leads",
            "Commit groups a lone request led on its own runtime worker, not handed to the blocking pool",
            self.inline_leads.clone(),
        );
        r.register(
            "inline_leads_declined",
            "Leads on a request's own worker that declined (the lock taken, others' records to read) and went to \
             the blocking pool",
            self.inline_leads_declined.clone(),
        );
        r.register("head_seq", "Last sequence of the log", self.head_seq.clone());
        r.register_with_unit("log", "Bytes of the log's segment files", Unit::Bytes, self.log_bytes.clone());
        r.register("subjects", "Subjects by owner status", self.subjects.clone());
        r.register("processes", "Supervised processes by status", self.processes.clone());
        r.register("leases", "Leases by state", self.leases.clone());
        r.register("requests_in_flight", "Requests holding a slot now", self.requests_in_flight.clone());
        r.register(
            "requests_in_flight_limit",
            "Requests that may hold a slot at once (more are answered 503 OVERLOADED)",
            Gauge::<i64>::default().tap(CONCURRENT_REQUESTS_MAX as i64),
        );
        r.register("connections_open", "Open HTTP connections (TCP and Unix)", self.connections_open.clone());
        r.register(
            "connections_limit",
            "Connections that may be open at once",
            Gauge::<i64>::default().tap(CONNECTIONS_MAX as i64),
        );
        r.register("watch_streams", "Open /v1/watch streams", self.watch_streams.clone());
        r.register(
            "watch_streams_limit",
            "Watch streams that may be open at once",
            Gauge::<i64>::default().tap(WATCH_STREAMS_MAX as i64),
        );
        r.register_with_unit(
            "home_heartbeat_age",
            "Time since the daemon's home heartbeat last landed in the log",
            Unit::Seconds,
            self.home_heartbeat_age_seconds.clone(),
        );
        r.register("ready", "1 while the daemon admits requests (as /readyz answers 200), else 0", self.ready.clone());
        r.register(
            "build",
            "This build (1, with its version and the log format it writes)",
            Info::new(vec![
                ("version".to_owned(), env!("CARGO_PKG_VERSION").to_owned()),
                ("format_version".to_owned(), crate::format::FORMAT_VERSION.to_string()),
            ]),
        );
        r
    }

    /// The `process_*` families (no prefix), in the order they are written out.
    fn process_registry(&self) -> Registry {
        let mut p = Registry::default();
        p.register_with_unit("process_cpu", "User and system CPU time spent", Unit::Seconds, self.cpu_seconds.clone());
        p.register_with_unit(
            "process_resident_memory",
            "Resident memory size",
            Unit::Bytes,
            self.resident_memory_bytes.clone(),
        );
        p.register("process_open_fds", "Open file descriptors", self.open_fds.clone());
        p.register_with_unit(
            "process_start_time",
            "Start time of the process since the Unix epoch",
            Unit::Seconds,
            self.start_time_seconds.clone(),
        );
        p
    }

    /// Bring the gauges that are read rather than counted up to date (the ledger's
    /// figures, the process's), then encode. Runs on a blocking thread: it walks
    /// the projection and reads `/proc`.
    pub(crate) fn scrape(app: &App, openmetrics: bool) -> Result<String, std::fmt::Error> {
        let m = &app.metrics;
        let _one = m.scraping.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let crate::storage::CommitStats { records: appends, syncs } = app.ledger.commit_stats();
        m.appends.inc_by(appends.saturating_sub(m.appends.get()));
        m.syncs.inc_by(syncs.saturating_sub(m.syncs.get()));
        let inline = app.ledger.inline_leads();
        m.inline_leads.inc_by(inline.led.saturating_sub(m.inline_leads.get()));
        m.inline_leads_declined.inc_by(inline.declined.saturating_sub(m.inline_leads_declined.get()));
        let now = crate::storage::LogOptions::default().now_ms();
        let _ = app.ledger.refresh_with(|p| {
            m.head_seq.set(p.last_seq() as i64);
            m.subjects.clear();
            m.processes.clear();
            m.leases.clear();
            for s in p.subjects().values() {
                let status =
                    serde_json::to_value(ops::status(app.ledger.here(), s.owner.as_ref(), now)).expect("status");
                m.subjects.get_or_create(&vec![("status".into(), status.as_str().unwrap_or("").into())]).inc();
            }
            for x in p.processes().values() {
                m.processes.get_or_create(&vec![("status".into(), x.status().as_str().into())]).inc();
            }
            for l in p.leases().values() {
                let state = crate::model::flatten_tagged(&l.state)["kind"].as_str().unwrap_or("").to_owned();
                m.leases.get_or_create(&vec![("state".into(), state)]).inc();
            }
        });
        let bytes: u64 = crate::storage::list_segments(&app.dir)
            .map(|segs| segs.iter().filter_map(|(_, p)| std::fs::metadata(p).ok()).map(|m| m.len()).sum())
            .unwrap_or(0);
        m.log_bytes.set(bytes as i64);
        m.requests_in_flight.set((CONCURRENT_REQUESTS_MAX - app.inflight.available_permits()) as i64);
        m.connections_open.set((CONNECTIONS_MAX - app.connections.available_permits()) as i64);
        m.watch_streams.set((WATCH_STREAMS_MAX - app.watchers.available_permits()) as i64);
        m.home_heartbeat_age_seconds.set(app.home_heartbeat_landed.lock().expect("heartbeat").elapsed().as_secs_f64());
        m.ready.set(i64::from(app.is_ready()));
        if let Some(p) = ProcessFigures::read() {
            m.cpu_seconds.inc_by((p.cpu_seconds - m.cpu_seconds.get()).max(0.0));
            m.resident_memory_bytes.set(p.resident_bytes as i64);
            m.open_fds.set(p.open_fds as i64);
            m.start_time_seconds.set(p.start_time_seconds);
        }
        let mut out = String::new();
        encode_registry(&mut out, &m.registry)?;
        encode_registry(&mut out, &m.process)?;
        encode_eof(&mut out)?;
        Ok(if openmetrics { out } else { text_004(&out) })
    }
}

/// A gauge set once (the limits).
trait Tap {
    fn tap(self, v: i64) -> Self;
}

impl Tap for Gauge<i64> {
    fn tap(self, v: i64) -> Self {
        self.set(v);
        self
    }
}

/// The Prometheus text format 0.0.4 from prometheus-client's OpenMetrics: the
/// same samples; HELP and TYPE of a counter name its `_total` series and of an
/// info its `_info` series (a gauge there); no `# UNIT` and no `# EOF`.
pub(crate) fn text_004(openmetrics: &str) -> String {
    let mut types = std::collections::HashMap::new();
    for l in openmetrics.lines() {
        if let Some(rest) = l.strip_prefix("# TYPE ")
            && let Some((name, kind)) = rest.split_once(' ')
        {
            types.insert(name.to_owned(), kind.to_owned());
        }
    }
    let renamed = |name: &str| match types.get(name).map(String::as_str) {
        Some("counter") if !name.ends_with("_total") => format!("{name}_total"),
        Some("info") => format!("{name}_info"),
        _ => name.to_owned(),
    };
    let mut out = String::with_capacity(openmetrics.len());
    for l in openmetrics.lines() {
        if l == "# EOF" || l.starts_with("# UNIT ") {
            continue;
        }
        let line = if let Some(rest) = l.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').unwrap_or((rest, ""));
            format!("# HELP {} {help}", renamed(name))
        } else if let Some(rest) = l.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or((rest, "untyped"));
            let kind = match kind {
                "info" => "gauge",
                "counter" | "gauge" | "histogram" | "summary" => kind,
                _ => "untyped",
            };
            format!("# TYPE {} {kind}", renamed(name))
        } else {
            l.to_owned()
        };
        out.push_str(&line);
        out.push('\n');
    }
    out
}

/// This process's figures from `/proc/self`.
struct ProcessFigures {
    cpu_seconds: f64,
    resident_bytes: u64,
    open_fds: u64,
    start_time_seconds: f64,
}

impl ProcessFigures {
    fn read() -> Option<ProcessFigures> {
        let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
        // Fields after the command (which may hold spaces) in its parentheses.
        let after = &stat[stat.rfind(')')? + 2..];
        let f: Vec<&str> = after.split(' ').collect();
        // stat(5): utime 14, stime 15, starttime 22, rss 24 (1-based; `after`
        // starts at field 3).
        let field = |n: usize| f.get(n - 3)?.parse::<u64>().ok();
        let ticks = crate::sys::clock_ticks_per_second()? as f64;
        let page = crate::sys::page_bytes()?;
        let btime: u64 = std::fs::read_to_string("/proc/stat")
            .ok()?
            .lines()
            .find_map(|l| l.strip_prefix("btime ")?.trim().parse().ok())?;
        Some(ProcessFigures {
            cpu_seconds: (field(14)? + field(15)?) as f64 / ticks,
            resident_bytes: field(24)? * page,
            open_fds: std::fs::read_dir("/proc/self/fd").ok()?.count() as u64,
            start_time_seconds: btime as f64 + field(22)? as f64 / ticks,
        })
    }
}
