//! HTTP compare-and-append, one run, one machine: a real `fencelog serve` on
//! loopback (heartbeats on distinct subjects; claims of new subjects) at 1, 16, 64
//! and 256 concurrent keep-alive clients — txn/s, p50, p99 — and, side by side in
//! the same run, etcd (one member on loopback, started here by
//! `scripts/etcd-cluster.sh`) doing the equivalent transaction (compare
//! mod_revision, put) through its v3 JSON gateway. The daemon's resident memory is
//! measured after 100,000 subjects exist.
//!
//! With `--etcd`: the daemon with its log *in* etcd, on a 1-member and on a
//! 3-member loopback cluster, at 1, 16 and 64 clients, beside raw etcd doing the
//! equivalent compare-and-put `Txn` through the same client crate (etcd-client,
//! gRPC) on the same cluster; and the boot of a ledger from etcd holding
//! 1,000,000 records and a snapshot (100,000 with `--quick`).
//!
//!   scripts/deps.sh test                           # once: Debian's etcd-server, etcd-client
//!   cargo bench --bench serve                      # full run
//!   cargo bench --bench serve -- --quick --json --etcd   # the log in etcd
//!   cargo bench --bench serve -- --quick --json    # short run, one JSON object
//!   cargo bench --bench serve -- --rss-only        # the resident-memory figure alone
//!   cargo bench --bench serve -- --clients 64 --no-etcd   # one row, fencelog alone, no RSS
//!   cargo bench --bench serve -- --reads [--fencelog-a OLD/fencelog]  # what reads cost (issue 23)
//!   cargo bench --bench serve -- --quick --json --daemon-a OLD/fencelog [--clients 1,64]
//!       # paired daemons: OLD's and this build's heartbeats, alternated window by window
//!
//! Every row runs in 3 rounds, the contenders alternating within each round: a
//! burst of raw fdatasyncs (the weather of that round), the daemon's heartbeats,
//! the log's own async appends at the same fan-in in this process (what the disk
//! and the commit engine sustain with no HTTP: the daemon's ratio to it is issue
//! 28's item 4), the daemon's claims, then etcd's. Each figure is the median of
//! the rounds, with its spread (max − min) and each round's value; a ratio is the
//! median of the rounds' ratios.
//!
//! Without etcd the bench says so and reports fencelog alone. Files live under
//! $FENCELOG_BENCH_DIR (default target/bench-tmp).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

const FENCELOG: &str = env!("CARGO_BIN_EXE_fencelog");
const CLIENTS: [usize; 4] = [1, 16, 64, 256];

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(30)))
        .max_idle_connections_per_host(1)
        .build()
        .into()
}

fn post(a: &ureq::Agent, url: &str, auth: Option<&str>, body: &str) -> (u16, String) {
    let mut r = a.post(url).header("Content-Type", "application/json");
    if let Some(t) = auth {
        r = r.header("Authorization", t);
    }
    match r.send(body) {
        Ok(mut resp) => (resp.status().as_u16(), resp.body_mut().read_to_string().unwrap_or_default()),
        Err(e) => (0, e.to_string()),
    }
}

struct Figures {
    /// Transactions completed.
    count: u64,
    txn_per_s: f64,
    p50_us: f64,
    p99_us: f64,
    errors: u64,
}

impl Figures {
    /// The figures of workers that each report their latencies (µs), their
    /// errors and how long they ran.
    fn of(results: impl IntoIterator<Item = (Vec<f64>, u64, Duration)>) -> Figures {
        let (mut all, mut errors, mut longest) = (Vec::new(), 0, Duration::ZERO);
        for (lat, e, took) in results {
            all.extend(lat);
            errors += e;
            longest = longest.max(took);
        }
        all.sort_by(f64::total_cmp);
        let pct = |q: f64| all.get(((all.len() as f64 - 1.0) * q).round() as usize).copied().unwrap_or(0.0);
        Figures {
            count: all.len() as u64,
            txn_per_s: all.len() as f64 / longest.as_secs_f64(),
            p50_us: pct(0.5),
            p99_us: pct(0.99),
            errors,
        }
    }

    fn json(&self) -> Value {
        json!({
            "txn_per_s": self.txn_per_s.round(),
            "p50_us": self.p50_us.round(),
            "p99_us": self.p99_us.round(),
            "errors": self.errors,
        })
    }
}

/// One keep-alive HTTP/1.1 connection of the load generator: the request is
/// written in one piece and the answer read by its `Content-Length` (or chunks),
/// so the clients spend little of the two cores they share with the server. Both
/// servers (fencelog and etcd) are measured through it.
struct Conn {
    addr: std::net::SocketAddr,
    stream: Option<tokio::net::TcpStream>,
    buf: Vec<u8>,
    out: Vec<u8>,
}

impl Conn {
    fn new(addr: std::net::SocketAddr) -> Conn {
        Conn { addr, stream: None, buf: Vec::with_capacity(8192), out: Vec::with_capacity(1024) }
    }

    /// POST `body` to `path`: the status and the body, or an error (the connection
    /// is then dropped and made again on the next call).
    async fn post(&mut self, path: &str, auth: Option<&str>, body: &str) -> Result<(u16, Vec<u8>), String> {
        let r = self.exchange(path, auth, body).await;
        if r.is_err() {
            self.stream = None;
        }
        r
    }

    async fn exchange(&mut self, path: &str, auth: Option<&str>, body: &str) -> Result<(u16, Vec<u8>), String> {
        use std::io::Write;
        use tokio::io::AsyncWriteExt;
        if self.stream.is_none() {
            let s = tokio::net::TcpStream::connect(self.addr).await.map_err(|e| e.to_string())?;
            s.set_nodelay(true).map_err(|e| e.to_string())?;
            self.stream = Some(s);
            self.buf.clear();
        }
        let stream = self.stream.as_mut().expect("connected");
        self.out.clear();
        write!(self.out, "POST {path} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\n", self.addr)
            .expect("to a Vec");
        if let Some(a) = auth {
            write!(self.out, "Authorization: {a}\r\n").expect("to a Vec");
        }
        write!(self.out, "Content-Length: {}\r\n\r\n{body}", body.len()).expect("to a Vec");
        stream.write_all(&self.out).await.map_err(|e| e.to_string())?;
        // The head.
        let head_end = loop {
            if let Some(i) = self.buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            if self.buf.len() > 64 * 1024 {
                return Err("an answer's head over 64 KiB".into());
            }
            read_more(stream, &mut self.buf).await?;
        };
        let head = std::str::from_utf8(&self.buf[..head_end]).map_err(|e| e.to_string())?.to_owned();
        self.buf.drain(..head_end);
        let status: u16 =
            head.split(' ').nth(1).and_then(|c| c.parse().ok()).ok_or_else(|| format!("no status in {head:?}"))?;
        let header = |name: &str| {
            head.lines().find_map(|l| {
                let (k, v) = l.split_once(':')?;
                k.trim().eq_ignore_ascii_case(name).then(|| v.trim().to_owned())
            })
        };
        let close = header("connection").is_some_and(|v| v.eq_ignore_ascii_case("close"));
        let body = if let Some(n) = header("content-length") {
            let n: usize = n.parse().map_err(|_| format!("Content-Length {n:?}"))?;
            while self.buf.len() < n {
                read_more(stream, &mut self.buf).await?;
            }
            self.buf.drain(..n).collect()
        } else if header("transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case("chunked")) {
            let mut body = Vec::new();
            loop {
                let line_end = loop {
                    if let Some(i) = self.buf.windows(2).position(|w| w == b"\r\n") {
                        break i;
                    }
                    read_more(stream, &mut self.buf).await?;
                };
                let size = std::str::from_utf8(&self.buf[..line_end]).map_err(|e| e.to_string())?;
                let size = usize::from_str_radix(size.split(';').next().unwrap_or("").trim(), 16)
                    .map_err(|_| format!("chunk size {size:?}"))?;
                while self.buf.len() < line_end + 2 + size + 2 {
                    read_more(stream, &mut self.buf).await?;
                }
                body.extend_from_slice(&self.buf[line_end + 2..line_end + 2 + size]);
                self.buf.drain(..line_end + 2 + size + 2);
                if size == 0 {
                    break body;
                }
            }
        } else {
            return Err(format!("an answer with neither Content-Length nor chunks: {head:?}"));
        };
        if close {
            self.stream = None;
        }
        Ok((status, body))
    }
}

async fn read_more(stream: &mut tokio::net::TcpStream, buf: &mut Vec<u8>) -> Result<(), String> {
    use tokio::io::AsyncReadExt;
    let mut chunk = [0u8; 16 * 1024];
    match stream.read(&mut chunk).await {
        Ok(0) => Err("the server closed the connection".into()),
        Ok(n) => {
            buf.extend_from_slice(&chunk[..n]);
            Ok(())
        }
        Err(e) => Err(e.to_string()),
    }
}

/// Where a load goes: the server's address, the route, the `Authorization` value.
struct Target {
    addr: std::net::SocketAddr,
    path: String,
    auth: Option<String>,
}

impl Target {
    fn new(base_url: &str, path: &str, auth: Option<&str>) -> Target {
        let hostport = base_url.strip_prefix("http://").expect("an http:// URL");
        let addr = std::net::ToSocketAddrs::to_socket_addrs(hostport).expect("address").next().expect("an address");
        Target { addr, path: path.to_owned(), auth: auth.map(str::to_owned) }
    }
}

/// `clients` keep-alive connections, each with one request outstanding at a time,
/// driven by one thread (like `wrk -t1`): each client is prepared once (`prep(i)`
/// → its state, over ureq, untimed), then sends `body(state, n)` and judges the
/// answer with `check(state, status, body)` until `run_for` passed.
fn load<S: Send + 'static>(
    clients: usize,
    run_for: Duration,
    target: Target,
    prep: impl Fn(&ureq::Agent, usize) -> S,
    body: impl Fn(&mut S, u64) -> String + Send + Sync + 'static,
    check: impl Fn(&mut S, u16, &[u8]) -> bool + Send + Sync + 'static,
) -> Figures {
    let a = agent();
    let states: Vec<S> = (0..clients).map(|i| prep(&a, i)).collect();
    let (body, check, target) = (Arc::new(body), Arc::new(check), Arc::new(target));
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let results = rt.block_on(async move {
        let start = Instant::now();
        let tasks: Vec<_> = states
            .into_iter()
            .map(|mut state| {
                let (body, check, target) = (Arc::clone(&body), Arc::clone(&check), Arc::clone(&target));
                tokio::spawn(async move {
                    let mut conn = Conn::new(target.addr);
                    let (mut lat, mut errors, mut n) = (Vec::new(), 0u64, 0u64);
                    while start.elapsed() < run_for {
                        let b = body(&mut state, n);
                        let t = Instant::now();
                        let ok = match conn.post(&target.path, target.auth.as_deref(), &b).await {
                            Ok((status, out)) => check(&mut state, status, &out),
                            Err(_) => false,
                        };
                        lat.push(t.elapsed().as_secs_f64() * 1e6);
                        errors += u64::from(!ok);
                        n += 1;
                    }
                    (lat, errors, start.elapsed())
                })
            })
            .collect();
        let mut results = Vec::new();
        for t in tasks {
            results.push(t.await.expect("a client task"));
        }
        results
    });
    Figures::of(results)
}

/// Rounds per row of the throughput table.
const ROUNDS: usize = 3;

/// A row's figures, round by round, in the order first added.
#[derive(Default)]
struct Rounds(Vec<(String, Vec<f64>)>);

impl Rounds {
    fn add(&mut self, name: &str, x: f64) {
        match self.0.iter_mut().find(|(n, _)| n == name) {
            Some((_, v)) => v.push(x),
            None => self.0.push((name.to_owned(), vec![x])),
        }
    }

    fn figures(&mut self, name: &str, f: &Figures) {
        self.add(&format!("{name}.txn_per_s"), f.txn_per_s);
        self.add(&format!("{name}.p50_us"), f.p50_us);
        self.add(&format!("{name}.p99_us"), f.p99_us);
        self.add(&format!("{name}.errors"), f.errors as f64);
    }

    /// Each figure's median (`a.b` names nest as `{"a": {"b": …}}`), then its
    /// spread and each round's value.
    fn json(&self) -> Value {
        let r2 = |x: f64| (x * 100.0).round() / 100.0;
        let (mut row, mut spread, mut each) = (json!({}), serde_json::Map::new(), serde_json::Map::new());
        for (name, v) in &self.0 {
            let mut s = v.clone();
            s.sort_by(f64::total_cmp);
            let median = if name.ends_with(".errors") { s.iter().sum() } else { s[s.len() / 2] };
            match name.split_once('.') {
                Some((a, b)) => row[a][b] = json!(r2(median)),
                None => row[name.as_str()] = json!(r2(median)),
            }
            spread.insert(name.clone(), json!(r2(s[s.len() - 1] - s[0])));
            each.insert(name.clone(), json!(v.iter().map(|&x| r2(x)).collect::<Vec<_>>()));
        }
        row["spread"] = Value::Object(spread);
        row["per_round"] = Value::Object(each);
        row["rounds"] = json!(self.0.first().map_or(0, |(_, v)| v.len()));
        row
    }
}

/// The raw fdatasync's p50 over 50 appends of 200 bytes to a new file at `path`.
fn raw_sync_p50_us(path: &Path) -> f64 {
    use std::io::Write;
    let mut f = std::fs::File::create(path).unwrap();
    let mut lat: Vec<f64> = (0..50)
        .map(|_| {
            let t = Instant::now();
            f.write_all(&[b'x'; 200]).unwrap();
            f.sync_data().unwrap();
            t.elapsed().as_secs_f64() * 1e6
        })
        .collect();
    lat.sort_by(f64::total_cmp);
    lat[lat.len() / 2]
}

/// The log itself, with no daemon: `appenders` tasks on a 2-worker runtime (the
/// daemon's), each appending a record of a heartbeat's size with
/// `Log::append_async` and waiting for it to be durable, for `run_for`, in a new
/// log at `dir`.
fn raw_async_appends(dir: &Path, appenders: usize, run_for: Duration) -> Figures {
    use fencelog::storage::{Log, LogOptions};
    const HEARTBEAT_PAYLOAD_BYTES: usize = 120;
    let log = Arc::new(Log::open(dir, LogOptions::default()).unwrap());
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    let results = rt.block_on(async {
        let start = Instant::now();
        let tasks: Vec<_> = (0..appenders)
            .map(|_| {
                let log = Arc::clone(&log);
                tokio::spawn(async move {
                    let mut lat = Vec::new();
                    while start.elapsed() < run_for {
                        let t = Instant::now();
                        log.append_async(vec![b'h'; HEARTBEAT_PAYLOAD_BYTES]).await.unwrap();
                        lat.push(t.elapsed().as_secs_f64() * 1e6);
                    }
                    (lat, start.elapsed())
                })
            })
            .collect();
        let mut out = Vec::new();
        for t in tasks {
            out.push(t.await.expect("an appender"));
        }
        out
    });
    Figures::of(results.into_iter().map(|(lat, took)| (lat, 0, took)))
}

struct Daemon {
    child: Child,
    url: String,
    auth: String,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let _ = self.child.wait();
    }
}

fn start_daemon(dir: &Path) -> Daemon {
    start_daemon_args(dir, &[])
}

fn start_daemon_args(dir: &Path, extra: &[&str]) -> Daemon {
    start_daemon_of(Path::new(FENCELOG), dir, extra)
}

/// `bin serve` on a log at `dir` (with `extra` arguments), once it said it listens.
fn start_daemon_of(bin: &Path, dir: &Path, extra: &[&str]) -> Daemon {
    let mut child = Command::new(bin)
        .args(["serve", "--dir", dir.to_str().unwrap(), "--listen", "127.0.0.1:0"])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("serve");
    let mut line = String::new();
    BufReader::new(child.stdout.as_mut().unwrap()).read_line(&mut line).unwrap();
    let ready: Value = serde_json::from_str(line.trim()).expect("ready line");
    let token = std::fs::read_to_string(dir.join("serve.token")).unwrap();
    Daemon {
        child,
        url: format!("http://{}", ready["listening"].as_str().unwrap()),
        auth: format!("Bearer {}", token.trim()),
    }
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// CPU time (user + system) a process has used so far, in µs (`/proc/PID/stat`).
fn cpu_us_of(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The fields after the command name (which may hold spaces), from field 3 on.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<f64> = rest.split_whitespace().map(|x| x.parse().unwrap_or(0.0)).collect();
    // SAFETY: sysconf has no preconditions.
    let tick = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    (f.get(11).copied().unwrap_or(0.0) + f.get(12).copied().unwrap_or(0.0)) * 1e6 / tick
}

/// The daemon's CPU per heartbeat (µs) over `f`, `cpu_before` being its CPU when
/// the load began.
fn daemon_cpu_per_txn(d: &Daemon, cpu_before: f64, f: &Figures) -> f64 {
    (cpu_us_of(d.child.id()) - cpu_before) / f.count.max(1) as f64
}

fn fencelog_heartbeats(d: &Daemon, clients: usize, run_for: Duration, round: usize) -> Figures {
    let (claim, auth) = (format!("{}/v1/claim", d.url), d.auth.clone());
    load(
        clients,
        run_for,
        Target::new(&d.url, "/v1/heartbeat", Some(&d.auth)),
        move |a, i| {
            let subject = format!("hb/{round}/{clients}/{i}");
            let (s, body) = post(a, &claim, Some(&auth), &json!({"subject": subject}).to_string());
            assert_eq!(s, 200, "{body}");
            let g: Value = serde_json::from_str(&body).unwrap();
            (subject, g["generation"].as_u64().unwrap())
        },
        |(subject, generation), _| json!({"subject": subject, "generation": generation}).to_string(),
        |_, status, _| status == 200,
    )
}

fn fencelog_claims(d: &Daemon, clients: usize, run_for: Duration, round: usize) -> Figures {
    load(
        clients,
        run_for,
        Target::new(&d.url, "/v1/claim", Some(&d.auth)),
        |_, i| i,
        move |i, n| json!({"subject": format!("claim/{round}/{clients}/{i}/{n}")}).to_string(),
        |_, status, _| status == 200,
    )
}

fn b64(s: &str) -> String {
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let b = s.as_bytes();
    let mut out = String::new();
    for c in b.chunks(3) {
        let n =
            (u32::from(c[0]) << 16) | (u32::from(*c.get(1).unwrap_or(&0)) << 8) | u32::from(*c.get(2).unwrap_or(&0));
        for (k, shift) in [18, 12, 6, 0].into_iter().enumerate() {
            if k <= c.len() {
                out.push(T[((n >> shift) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// etcd's equivalent of a heartbeat: put the key if its mod_revision is still the
/// one this client wrote last (compare-and-put), one member, through the gateway.
fn etcd_heartbeats(endpoint: &str, clients: usize, run_for: Duration, round: usize) -> Figures {
    let url = format!("{endpoint}/v3/kv/txn");
    load(
        clients,
        run_for,
        Target::new(endpoint, "/v3/kv/txn", None),
        move |a, i| {
            let key = b64(&format!("hb/{round}/{clients}/{i}"));
            let body = json!({"compare": [{"key": key, "target": "MOD", "result": "EQUAL", "mod_revision": "0"}],
                "success": [{"request_put": {"key": key, "value": b64("1")}}]});
            let (s, out) = post(a, &url, None, &body.to_string());
            assert_eq!(s, 200, "{out}");
            let v: Value = serde_json::from_str(&out).unwrap();
            (key, v["header"]["revision"].as_str().unwrap_or("0").to_owned())
        },
        |(key, rev), _| {
            json!({"compare": [{"key": key, "target": "MOD", "result": "EQUAL", "mod_revision": rev}],
                "success": [{"request_put": {"key": key, "value": b64("1")}}]})
            .to_string()
        },
        |(_, rev), status, out| {
            let v: Value = serde_json::from_slice(out).unwrap_or(Value::Null);
            if status == 200 && v["succeeded"] == true {
                *rev = v["header"]["revision"].as_str().unwrap_or("0").to_owned();
                true
            } else {
                false
            }
        },
    )
}

fn etcd_claims(endpoint: &str, clients: usize, run_for: Duration, round: usize) -> Figures {
    load(
        clients,
        run_for,
        Target::new(endpoint, "/v3/kv/txn", None),
        |_, i| i,
        move |i, n| {
            let key = b64(&format!("claim/{round}/{clients}/{i}/{n}"));
            json!({"compare": [{"key": key, "target": "MOD", "result": "EQUAL", "mod_revision": "0"}],
                "success": [{"request_put": {"key": key, "value": b64("owner")}}]})
            .to_string()
        },
        |_, status, out| {
            status == 200 && serde_json::from_slice::<Value>(out).map(|v| v["succeeded"] == true).unwrap_or(false)
        },
    )
}

struct Etcd {
    pid: u32,
}

impl Drop for Etcd {
    fn drop(&mut self) {
        unsafe { libc::kill(self.pid as i32, libc::SIGTERM) };
    }
}

/// A loopback cluster of `members` started by the repository's script: its
/// members (stopped when dropped) and its endpoints (`127.0.0.1:P,…`).
fn start_cluster(dir: &Path, members: usize) -> Result<(Vec<Etcd>, String), String> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/etcd-cluster.sh");
    let out = Command::new("bash")
        .arg(&script)
        .args(["start", dir.to_str().unwrap(), &members.to_string()])
        .output()
        .map_err(|e| format!("{}: {e}", script.display()))?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).trim().to_owned());
    }
    let v: Value = serde_json::from_slice(&out.stdout).map_err(|e| e.to_string())?;
    let pids =
        v["members"].as_array().into_iter().flatten().map(|m| Etcd { pid: m["pid"].as_u64().unwrap_or(0) as u32 });
    Ok((pids.collect(), v["endpoints"].as_str().unwrap_or("").to_owned()))
}

/// One member, and the URL of its v3 JSON gateway.
fn start_etcd(dir: &Path) -> Result<(Vec<Etcd>, String), String> {
    let (members, endpoints) = start_cluster(dir, 1)?;
    Ok((members, format!("http://{endpoints}")))
}

fn start_daemon_with(bin: &Path, dir: &Path) -> Daemon {
    start_daemon_of(bin, dir, &[])
}

/// A log like the one issue 23 measured reads on: 8,000 subjects, then heartbeats
/// with request ids up to 65,000 records — written through the embedded ledger
/// (8 threads share its syncs), before any daemon starts.
fn populate_for_reads(dir: &Path, subjects: u64, records: u64) {
    use fencelog::ledger::{Ledger, LedgerOptions, identity, intent_digest};
    use fencelog::model::{Event, Txn};
    let ledger = Ledger::open(dir, LedgerOptions::default()).expect("ledger");
    let me = identity::probe(std::process::id(), uuid::Uuid::new_v4()).expect("own identity");
    std::thread::scope(|s| {
        for t in 0..8u64 {
            let (ledger, me) = (&ledger, &me);
            s.spawn(move || {
                for i in (t..records).step_by(8) {
                    let subject = format!("r/{}", i % subjects);
                    let id = format!("pre-{i}");
                    let event = if i < subjects {
                        Event::Claim {
                            subject,
                            owner: me.clone(),
                            stale_after_ms: 3_600_000,
                            lock: None,
                            previous: None,
                        }
                    } else {
                        Event::Heartbeat { subject, generation: 1 }
                    };
                    ledger
                        .submit(
                            Some(fencelog::model::RequestTag { id: id.clone(), digest: intent_digest(&id) }),
                            |_, t, w| Ok(Txn::new(t, w, vec![event.clone()])),
                        )
                        .expect("populate");
                }
            });
        }
    });
}

/// A file log of `records` transactions in `dir` (created), written through the
/// embedded ledger as the load generator (`examples/demo.rs`) writes one: 8 threads
/// each claim `fill/<pid>/appender-T`, then write 200-byte notes under its
/// generation (the ledger adds its own checkpoint records besides).
fn fill_log(dir: &Path, records: u64) {
    use fencelog::ledger::{Ledger, LedgerOptions};
    use fencelog::model::Outcome;
    use fencelog::ops::{Caller, ClaimRequest, NoteRequest, claim, note};
    const THREADS: u64 = 8;
    let mut opts = LedgerOptions::default();
    opts.log.create = true;
    let ledger = Ledger::open(dir, opts).expect("ledger");
    let pid = std::process::id();
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let ledger = &ledger;
            let count = records / THREADS + u64::from(t < records % THREADS);
            s.spawn(move || {
                if count == 0 {
                    return;
                }
                let subject = format!("fill/{pid}/appender-{t}");
                let req = ClaimRequest {
                    subject: subject.clone(),
                    pid: Some(pid),
                    instance: None,
                    stale_after_ms: 60_000,
                    action: None,
                    request_id: None,
                };
                let claimed = claim(ledger, &req, Caller::default()).expect("claim");
                let Outcome::Claimed { generation, .. } = claimed.outcome.0 else {
                    unreachable!("a committed claim reports Claimed")
                };
                for i in 1..count {
                    let mut text = format!("fill appender {t} record {i} ");
                    text.extend(std::iter::repeat_n('.', 200usize.saturating_sub(text.len())));
                    let req =
                        NoteRequest { subject: subject.clone(), generation, text, request_id: None, instance: None };
                    note(ledger, &req, Caller::default()).expect("note");
                }
            });
        }
    });
}

/// p50 (µs) of `n` sequential GETs of `path`.
fn get_p50_us(d: &Daemon, path: &str, n: usize) -> f64 {
    let a = agent();
    let url = format!("{}{path}", d.url);
    let mut lat: Vec<f64> = (0..n)
        .map(|_| {
            let t = Instant::now();
            let r = a.get(&url).header("Authorization", &d.auth).call().expect("GET");
            assert_eq!(r.status().as_u16(), 200, "{path}");
            t.elapsed().as_secs_f64() * 1e6
        })
        .collect();
    lat.sort_by(f64::total_cmp);
    lat[lat.len() / 2]
}

/// Issue 23, item 12: what reads cost, and what they cost writers. For each
/// daemon binary (`--fencelog-a PATH`, the code before, and this build), in one
/// run, on the same kind of log: p50 of `GET /v1/head` and `GET
/// /v1/requests/{id}`, and one client's heartbeat p50 alone and beside four loops
/// of `GET /v1/head`.
fn reads_bench(root: &Path, bins: &[(String, PathBuf)], quick: bool) -> Value {
    let (subjects, records) = (8_000, if quick { 20_000 } else { 65_000 });
    let run_for = Duration::from_millis(if quick { 2000 } else { 5000 });
    let mut out = serde_json::Map::new();
    out.insert("subjects".into(), json!(subjects));
    out.insert("records".into(), json!(records));
    for (name, bin) in bins {
        let tmp = tempfile::Builder::new().prefix("reads").tempdir_in(root).unwrap();
        let dir = tmp.path().join("log");
        populate_for_reads(&dir, subjects, records);
        let d = start_daemon_with(bin, &dir);
        let head_p50 = get_p50_us(&d, "/v1/head", 200);
        let request_p50 = get_p50_us(&d, "/v1/requests/pre-1234", 200);
        let alone = fencelog_heartbeats(&d, 1, run_for, 0);
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let loops: Vec<_> = (0..4)
            .map(|_| {
                let (url, auth, stop) = (format!("{}/v1/head", d.url), d.auth.clone(), Arc::clone(&stop));
                std::thread::spawn(move || {
                    let a = agent();
                    let mut n = 0u64;
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        let _ = a.get(&url).header("Authorization", &auth).call();
                        n += 1;
                    }
                    n
                })
            })
            .collect();
        let beside = fencelog_heartbeats(&d, 1, run_for, 1);
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let reads: u64 = loops.into_iter().map(|t| t.join().unwrap()).sum();
        let row = json!({
            "binary": bin.display().to_string(),
            "get_head_p50_us": head_p50.round(),
            "get_request_p50_us": request_p50.round(),
            "heartbeat_alone": alone.json(),
            "heartbeat_beside_4_head_loops": beside.json(),
            "head_reads_per_s": (reads as f64 / run_for.as_secs_f64()).round(),
        });
        eprintln!("reads, {name}: {row}");
        out.insert(name.clone(), row);
    }
    Value::Object(out)
}

/// Two daemon binaries side by side (`--daemon-a PATH`, the code before, and
/// this build), each on a log of its own: for each client count, rounds of
/// heartbeat windows alternating A, B then B, A, each round beside a burst of
/// raw fdatasyncs. Each side's median of the rounds' figures, and the median of
/// the rounds' paired differences (B − A) — what tells a change from the
/// machine's weather, which moves both sides of a round alike.
fn paired_daemons(root: &Path, a: &Path, clients: &[usize], quick: bool) -> Value {
    let rounds_n = if quick { 6 } else { 10 };
    let run_for = Duration::from_millis(if quick { 1500 } else { 3000 });
    let tmp = tempfile::Builder::new().prefix("paired").tempdir_in(root).unwrap();
    let (da, db) = (
        start_daemon_with(a, &tmp.path().join("log-a")),
        start_daemon_with(Path::new(FENCELOG), &tmp.path().join("log-b")),
    );
    let mut out = serde_json::Map::new();
    out.insert("daemon_a".into(), json!(a.display().to_string()));
    out.insert("daemon_b".into(), json!(FENCELOG));
    for &k in clients {
        let mut rounds = Rounds::default();
        for r in 0..rounds_n {
            let round = 1000 + r;
            rounds.add("raw_fdatasync_p50_us", raw_sync_p50_us(&tmp.path().join(format!("raw-{k}-{r}"))));
            let (fa, fb) = if r % 2 == 0 {
                let fa = fencelog_heartbeats(&da, k, run_for, round);
                (fa, fencelog_heartbeats(&db, k, run_for, round))
            } else {
                let fb = fencelog_heartbeats(&db, k, run_for, round);
                (fencelog_heartbeats(&da, k, run_for, round), fb)
            };
            rounds.figures("a", &fa);
            rounds.figures("b", &fb);
            rounds.add("b_minus_a.p50_us", fb.p50_us - fa.p50_us);
            rounds.add("b_over_a.txn_per_s", fb.txn_per_s / fa.txn_per_s.max(1.0));
        }
        let row = rounds.json();
        eprintln!("paired daemons, {k} clients: {row}");
        out.insert(format!("clients_{k}"), row);
    }
    Value::Object(out)
}

/// Raw etcd through the same client crate fencelog uses: `clients` tasks, each
/// a compare-and-put `Txn` on a key of its own (compare its mod_revision with the
/// one it wrote last, put) — the equivalent of a heartbeat — until `run_for`.
fn raw_etcd_txns(endpoints: &str, clients: usize, run_for: Duration, round: &str) -> Figures {
    use etcd_client::{Client, Compare, CompareOp, Txn, TxnOp};
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().expect("runtime");
    let eps: Vec<String> = endpoints.split(',').map(str::to_owned).collect();
    let results = rt.block_on(async move {
        let client = Client::connect(eps, None).await.expect("etcd");
        let start = Instant::now();
        let tasks: Vec<_> = (0..clients)
            .map(|i| {
                let mut c = client.clone();
                let key = format!("/raw/{round}/{clients}/{i}");
                tokio::spawn(async move {
                    let (mut lat, mut errors) = (Vec::new(), 0u64);
                    let mut rev = 0i64;
                    while start.elapsed() < run_for {
                        let txn = Txn::new()
                            .when([Compare::mod_revision(key.as_str(), CompareOp::Equal, rev)])
                            .and_then([TxnOp::put(key.as_str(), "1", None)]);
                        let t = Instant::now();
                        match c.txn(txn).await {
                            Ok(r) if r.succeeded() => rev = r.header().map_or(0, |h| h.revision()),
                            _ => errors += 1,
                        }
                        lat.push(t.elapsed().as_secs_f64() * 1e6);
                    }
                    (lat, errors, start.elapsed())
                })
            })
            .collect();
        let mut results = Vec::new();
        for t in tasks {
            results.push(t.await.expect("a client task"));
        }
        results
    });
    Figures::of(results)
}

fn fl_cli(args: &[&str]) -> Value {
    let out = Command::new(FENCELOG).args(args).output().expect("fencelog");
    assert!(out.status.success(), "fencelog {args:?}: {}", String::from_utf8_lossy(&out.stdout));
    serde_json::from_slice(&out.stdout).unwrap_or(Value::Null)
}

/// The `--etcd` bench (see the module).
fn etcd_bench(root: &Path, quick: bool) -> Value {
    let run_for = Duration::from_millis(if quick { 2000 } else { 5000 });
    let mut out = serde_json::Map::new();
    out.insert("quick".into(), json!(quick));
    out.insert("cores".into(), json!(std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0)));
    for members in [1usize, 3] {
        let tmp = tempfile::Builder::new().prefix("etcd-serve").tempdir_in(root).unwrap();
        let (_cluster, endpoints) = start_cluster(&tmp.path().join("etcd"), members).expect("an etcd cluster");
        let prefix = "/bench/";
        fl_cli(&["init", "--etcd", &endpoints, "--etcd-prefix", prefix]);
        let d = start_daemon_args(&tmp.path().join("state"), &["--etcd", &endpoints, "--etcd-prefix", prefix]);
        let mut rows = serde_json::Map::new();
        for (round, k) in [1usize, 16, 64].into_iter().enumerate() {
            let fl_hb = fencelog_heartbeats(&d, k, run_for, round);
            let fl_claim = fencelog_claims(&d, k, run_for, round);
            let raw = raw_etcd_txns(&endpoints, k, run_for, &format!("{members}-{round}"));
            let row = json!({
                "fencelog_heartbeat": fl_hb.json(),
                "fencelog_claim": fl_claim.json(),
                "raw_etcd_txn": raw.json(),
                "heartbeat_vs_raw": ((fl_hb.txn_per_s / raw.txn_per_s.max(1.0)) * 100.0).round() / 100.0,
                "p50_minus_raw_us": (fl_hb.p50_us - raw.p50_us).round(),
            });
            eprintln!("{members} member(s), {k} clients: {row}");
            rows.insert(format!("clients_{k}"), row);
        }
        out.insert(format!("members_{members}"), Value::Object(rows));
    }
    // Boot from etcd: a log of N records (a file log imported), a snapshot, then
    // a ledger opened on it, as the daemon opens one.
    let records: u64 = if quick { 100_000 } else { 1_000_000 };
    let tmp = tempfile::Builder::new().prefix("etcd-boot").tempdir_in(root).unwrap();
    let (_cluster, endpoints) = start_cluster(&tmp.path().join("etcd"), 1).expect("an etcd cluster");
    let src = tmp.path().join("src");
    fill_log(&src, records);
    let t = Instant::now();
    fl_cli(&["import", "--dir", src.to_str().unwrap(), "--etcd", &endpoints, "--etcd-prefix", "/boot/"]);
    let import_s = t.elapsed().as_secs_f64();
    let loc = fencelog::storage::Location::Etcd(
        fencelog::storage::etcd::EtcdOptions::parse(&endpoints, "/boot/").expect("options"),
    );
    let opts = fencelog::ledger::LedgerOptions::default;
    let full = {
        let t = Instant::now();
        let l = fencelog::ledger::Ledger::open_at(&loc, opts()).expect("open");
        let took = t.elapsed().as_secs_f64() * 1e3;
        l.snapshot_now().expect("snapshot");
        took
    };
    let mut boots = vec![];
    for _ in 0..3 {
        let t = Instant::now();
        let l = fencelog::ledger::Ledger::open_at(&loc, opts()).expect("open");
        boots.push(t.elapsed().as_secs_f64() * 1e3);
        assert!(l.open_report().snapshot_seq.is_some(), "booted from the snapshot");
    }
    boots.sort_by(f64::total_cmp);
    out.insert(
        "boot".into(),
        json!({"records": records, "import_s": (import_s * 10.0).round() / 10.0,
               "replay_all_ms": full.round(), "boot_from_snapshot_ms_median": boots[1].round()}),
    );
    Value::Object(out)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "--quick");
    let as_json = args.iter().any(|a| a == "--json");
    if args.iter().any(|a| a == "--etcd") {
        let root =
            std::env::var_os("FENCELOG_BENCH_DIR").map_or_else(|| PathBuf::from("target/bench-tmp"), PathBuf::from);
        std::fs::create_dir_all(&root).unwrap();
        let out = etcd_bench(&std::path::absolute(root).unwrap(), quick);
        println!("{}", if as_json { out.to_string() } else { serde_json::to_string_pretty(&out).unwrap() });
        return;
    }
    if let Some(a) = args.iter().position(|a| a == "--daemon-a").and_then(|i| args.get(i + 1)) {
        let root =
            std::env::var_os("FENCELOG_BENCH_DIR").map_or_else(|| PathBuf::from("target/bench-tmp"), PathBuf::from);
        std::fs::create_dir_all(&root).unwrap();
        let clients: Vec<usize> = args
            .iter()
            .position(|a| a == "--clients")
            .and_then(|i| args.get(i + 1))
            .map_or_else(|| vec![1], |v| v.split(',').map(|n| n.parse().expect("--clients takes numbers")).collect());
        let out = paired_daemons(&std::path::absolute(root).unwrap(), Path::new(a), &clients, quick);
        println!("{}", if as_json { out.to_string() } else { serde_json::to_string_pretty(&out).unwrap() });
        return;
    }
    if args.iter().any(|a| a == "--reads") {
        let root =
            std::env::var_os("FENCELOG_BENCH_DIR").map_or_else(|| PathBuf::from("target/bench-tmp"), PathBuf::from);
        std::fs::create_dir_all(&root).unwrap();
        let root = std::path::absolute(root).unwrap();
        let mut bins = vec![];
        if let Some(a) = args.iter().position(|a| a == "--fencelog-a").and_then(|i| args.get(i + 1)) {
            bins.push(("a".to_owned(), PathBuf::from(a)));
        }
        bins.push(("this_build".to_owned(), PathBuf::from(FENCELOG)));
        let out = reads_bench(&root, &bins, quick);
        println!("{}", if as_json { out.to_string() } else { serde_json::to_string_pretty(&out).unwrap() });
        return;
    }
    // Only the resident-memory figure (no throughput rounds, no etcd).
    let rss_only = args.iter().any(|a| a == "--rss-only");
    // `--clients 1,64`: only these rows; `--no-etcd`: fencelog alone (both for
    // profiling one figure; the figures come from a run without them).
    let clients: Vec<usize> = args
        .iter()
        .position(|a| a == "--clients")
        .and_then(|i| args.get(i + 1))
        .map(|v| v.split(',').map(|n| n.parse().expect("--clients takes numbers, e.g. 1,64")).collect())
        .unwrap_or_else(|| CLIENTS.to_vec());
    let no_etcd = args.iter().any(|a| a == "--no-etcd");
    let root = std::env::var_os("FENCELOG_BENCH_DIR").map_or_else(|| PathBuf::from("target/bench-tmp"), PathBuf::from);
    std::fs::create_dir_all(&root).unwrap();
    let root = std::path::absolute(root).unwrap();
    let run_for = Duration::from_millis(if quick { 2000 } else { 5000 });
    let tmp = tempfile::Builder::new().prefix("serve").tempdir_in(&root).unwrap();
    let d = start_daemon(&tmp.path().join("log"));
    let etcd = if rss_only {
        Err("--rss-only".to_owned())
    } else if no_etcd {
        Err("--no-etcd".to_owned())
    } else {
        start_etcd(&tmp.path().join("etcd"))
    };
    if let Err(why) = &etcd {
        eprintln!("etcd not measured: {why} (scripts/deps.sh test installs it)");
    }
    let mut out = serde_json::Map::new();
    out.insert("quick".into(), json!(quick));
    out.insert("cores".into(), json!(std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0)));
    out.insert(
        "etcd".into(),
        json!(etcd.as_ref().map(|_| "3.4 single member, v3 JSON gateway").map_err(|e| e.clone())),
    );
    let raw = {
        let mut f = std::fs::File::create(tmp.path().join("raw")).unwrap();
        let mut lat = vec![];
        for _ in 0..200 {
            use std::io::Write;
            let t = Instant::now();
            f.write_all(&[b'x'; 200]).unwrap();
            f.sync_data().unwrap();
            lat.push(t.elapsed().as_secs_f64() * 1e6);
        }
        lat.sort_by(f64::total_cmp);
        lat[lat.len() / 2]
    };
    out.insert("raw_fdatasync_p50_us".into(), json!(raw.round()));
    for (row_no, &k) in clients.iter().enumerate().filter(|_| !rss_only) {
        let mut rounds = Rounds::default();
        for r in 0..ROUNDS {
            let round = row_no * ROUNDS + r;
            let sync_us = raw_sync_p50_us(&tmp.path().join(format!("raw-{round}")));
            rounds.add("raw_fdatasync_p50_us", sync_us);
            let cpu = cpu_us_of(d.child.id());
            let fl_hb = fencelog_heartbeats(&d, k, run_for, round);
            rounds.add("daemon_cpu_us_per_heartbeat", daemon_cpu_per_txn(&d, cpu, &fl_hb));
            let cpu = cpu_us_of(std::process::id());
            let raw = raw_async_appends(&tmp.path().join(format!("raw-log-{round}")), k, run_for);
            rounds.add("log_cpu_us_per_append", (cpu_us_of(std::process::id()) - cpu) / raw.count.max(1) as f64);
            let fl_claim = fencelog_claims(&d, k, run_for, round);
            rounds.figures("fencelog_heartbeat", &fl_hb);
            rounds.figures("raw_async_append", &raw);
            rounds.figures("fencelog_claim", &fl_claim);
            rounds.add("heartbeat_vs_raw_async", fl_hb.txn_per_s / raw.txn_per_s.max(1.0));
            rounds.add("heartbeat_p50_minus_raw_fdatasync_us", fl_hb.p50_us - sync_us);
            if let Ok((_, endpoint)) = &etcd {
                let e_hb = etcd_heartbeats(endpoint, k, run_for, round);
                let e_claim = etcd_claims(endpoint, k, run_for, round);
                rounds.figures("etcd_heartbeat", &e_hb);
                rounds.figures("etcd_claim", &e_claim);
                rounds.add("heartbeat_vs_etcd", fl_hb.txn_per_s / e_hb.txn_per_s.max(1.0));
            }
        }
        let row = rounds.json();
        eprintln!("{k} clients: {row}");
        out.insert(format!("clients_{k}"), row);
    }
    // Resident memory of a fresh daemon once 100,000 subjects (20,000 with
    // --quick) were claimed by 16 clients. Not with `--clients` (one figure).
    drop(d);
    if args.iter().any(|a| a == "--clients") {
        let out = Value::Object(out);
        println!("{}", if as_json { out.to_string() } else { serde_json::to_string_pretty(&out).unwrap() });
        return;
    }
    let d = start_daemon(&tmp.path().join("log-rss"));
    let subjects = if quick { 20_000 } else { 100_000 };
    let (claim, auth) = (format!("{}/v1/claim", d.url), d.auth.clone());
    let per = subjects / 16;
    let threads: Vec<_> = (0..16)
        .map(|t| {
            let (claim, auth) = (claim.clone(), auth.clone());
            std::thread::spawn(move || {
                let a = agent();
                for n in 0..per {
                    post(&a, &claim, Some(&auth), &json!({"subject": format!("mem/{t}/{n}")}).to_string());
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    out.insert("subjects_for_rss".into(), json!(per * 16));
    out.insert("daemon_rss_mib".into(), json!((rss_kib(d.child.id()) as f64 / 1024.0).round()));
    let out = Value::Object(out);
    if as_json {
        println!("{out}");
    } else {
        println!("{}", serde_json::to_string_pretty(&out).unwrap());
    }
}
