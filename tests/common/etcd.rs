//! A real etcd cluster on loopback for the tests, started by the repository's
//! `scripts/etcd-cluster.sh` (Debian's etcd-server 3.4). Each test that needs one
//! either shares the binary's cluster (a prefix of its own: [`shared`]) or starts
//! its own (to kill its members: [`Cluster::start`]). Members are killed when the
//! cluster is dropped, and the shared one when the test binary exits.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, OnceLock};

use serde_json::Value;

pub struct Member {
    pub name: String,
    pub pid: u32,
    pub client: u16,
}

pub struct Cluster {
    dir: PathBuf,
    _tmp: Option<tempfile::TempDir>,
    pub endpoints: String,
    pub members: Vec<Member>,
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/etcd-cluster.sh")
}

/// Pids to kill when the test binary exits (the shared cluster's members).
static AT_EXIT: Mutex<Vec<u32>> = Mutex::new(Vec::new());

extern "C" fn kill_at_exit() {
    if let Ok(pids) = AT_EXIT.lock() {
        for &pid in pids.iter() {
            // SAFETY: kill(2) with a pid we started.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        }
    }
}

impl Cluster {
    /// Start `members` (1 or 3) members on free loopback ports.
    pub fn start(members: usize) -> Cluster {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().to_path_buf();
        let out =
            Command::new("bash").arg(script()).args(["start", dir.to_str().unwrap(), &members.to_string()]).output();
        let out = out.expect("bash runs scripts/etcd-cluster.sh");
        assert!(
            out.status.success(),
            "etcd did not start ({}): {}. The test command (scripts/test.sh) installs etcd-server and etcd-client",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        let members = v["members"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| Member {
                name: m["name"].as_str().unwrap().to_owned(),
                pid: m["pid"].as_u64().unwrap() as u32,
                client: m["client"].as_u64().unwrap() as u16,
            })
            .collect();
        Cluster { dir, _tmp: Some(tmp), endpoints: v["endpoints"].as_str().unwrap().to_owned(), members }
    }

    /// kill -9 of member `i`.
    pub fn kill(&self, i: usize) {
        // SAFETY: kill(2) of a member we started.
        unsafe { libc::kill(self.members[i].pid as i32, libc::SIGKILL) };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while std::fs::read_to_string(format!("/proc/{}/stat", self.members[i].pid)).is_ok_and(|s| !s.contains(") Z "))
        {
            assert!(std::time::Instant::now() < deadline, "etcd member survived kill -9");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }

    /// Start member `i` again, with its data.
    pub fn restart(&mut self, i: usize) {
        let out = Command::new("bash")
            .arg(script())
            .args(["restart", self.dir.to_str().unwrap(), &self.members[i].name])
            .output()
            .unwrap();
        assert!(out.status.success(), "restart: {}", String::from_utf8_lossy(&out.stderr));
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        self.members[i].pid = v["pid"].as_u64().unwrap() as u32;
    }

    /// The member that is the Raft leader now, if one is (asked of each member).
    pub fn leader(&self) -> Option<usize> {
        for (i, m) in self.members.iter().enumerate() {
            let out = Command::new("etcdctl")
                .env("ETCDCTL_API", "3")
                .args([&format!("--endpoints=127.0.0.1:{}", m.client), "endpoint", "status", "-w", "json"])
                .output()
                .ok()?;
            let v: Value = serde_json::from_slice(&out.stdout).ok()?;
            let s = &v[0]["Status"];
            if s["leader"].as_u64().is_some() && s["leader"] == s["header"]["member_id"] {
                return Some(i);
            }
        }
        None
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for m in &self.members {
            // SAFETY: kill(2) of a member we started.
            unsafe { libc::kill(m.pid as i32, libc::SIGKILL) };
        }
    }
}

/// The test binary's shared 3-member cluster (started on first use).
pub fn shared() -> &'static Cluster {
    static SHARED: OnceLock<Cluster> = OnceLock::new();
    SHARED.get_or_init(|| {
        let c = Cluster::start(3);
        AT_EXIT.lock().unwrap().extend(c.members.iter().map(|m| m.pid));
        // SAFETY: registers a plain extern "C" function.
        unsafe { libc::atexit(kill_at_exit) };
        c
    })
}

/// A prefix no other test uses.
pub fn fresh_prefix(what: &str) -> String {
    format!("/t/{what}/{}/", uuid::Uuid::new_v4().simple())
}

/// `fencelog`'s location of a fresh log on the shared cluster (not created yet).
pub fn fresh_location(what: &str) -> fencelog::storage::Location {
    fencelog::storage::Location::Etcd(
        fencelog::storage::etcd::EtcdOptions::parse(&shared().endpoints, &fresh_prefix(what)).unwrap(),
    )
}

/// A fresh log (created) under a new prefix on `endpoints`, and the etcd backend
/// open on it, as a writer opens it.
pub fn new_backend(
    endpoints: &str,
    what: &str,
) -> (fencelog::storage::etcd::EtcdOptions, fencelog::storage::etcd::EtcdBackend) {
    let opts = fencelog::storage::etcd::EtcdOptions::parse(endpoints, &fresh_prefix(what)).unwrap();
    fencelog::storage::etcd::EtcdBackend::init(&opts).unwrap();
    let backend = open_backend(&opts);
    (opts, backend)
}

/// Another writer's backend on the log under `opts`.
pub fn open_backend(opts: &fencelog::storage::etcd::EtcdOptions) -> fencelog::storage::etcd::EtcdBackend {
    let loc = fencelog::storage::Location::Etcd(opts.clone());
    fencelog::storage::etcd::EtcdBackend::open(opts, &loc.log_options(Default::default())).unwrap()
}
