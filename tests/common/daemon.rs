//! A real `fencelog serve` child process on loopback, and plain HTTP calls to it.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};

pub const FENCELOG: &str = env!("CARGO_BIN_EXE_fencelog");

/// A real `fencelog serve` child process, killed when dropped.
pub struct Daemon {
    pub child: Child,
    pub addr: String,
    pub token: String,
    pub ready: Value,
}

impl Daemon {
    pub fn start(dir: &Path, extra: &[&str]) -> Daemon {
        Self::try_start(dir, extra).unwrap_or_else(|(code, out)| panic!("serve exited {code:?}: {out}"))
    }

    /// Start `fencelog serve`, wait for its ready line (or its exit: code, stdout).
    pub fn try_start(dir: &Path, extra: &[&str]) -> Result<Daemon, (Option<i32>, String)> {
        Self::try_start_with(dir, extra, &[])
    }

    /// [`Daemon::try_start`] with environment variables set (a simulated host's
    /// `FENCELOG_HOST_ID`).
    pub fn try_start_with(dir: &Path, extra: &[&str], env: &[(&str, &str)]) -> Result<Daemon, (Option<i32>, String)> {
        let mut child = Command::new(FENCELOG)
            .args(["serve", "--dir", dir.to_str().unwrap(), "--listen", "127.0.0.1:0"])
            .args(extra)
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            // FENCELOG_TEST_STDERR=1 shows the daemons' logs (debugging a test).
            .stderr(if std::env::var_os("FENCELOG_TEST_STDERR").is_some() { Stdio::inherit() } else { Stdio::null() })
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.as_mut().unwrap()).read_line(&mut line).unwrap();
        let Ok(ready) = serde_json::from_str::<Value>(line.trim()) else {
            let code = child.wait().unwrap().code();
            return Err((code, line));
        };
        if ready.get("listening").is_none() {
            let code = child.wait().unwrap().code();
            return Err((code, line));
        }
        let token = std::fs::read_to_string(dir.join("serve.token")).unwrap().trim().to_owned();
        Ok(Daemon { addr: ready["listening"].as_str().unwrap().to_owned(), child, token, ready })
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    pub fn call(
        &self,
        method: &str,
        path: &str,
        body: Option<Value>,
        headers: &[(&str, &str)],
    ) -> (u16, Value, Vec<(String, String)>) {
        call(&self.url(path), method, Some(&self.token), body, headers)
    }

    pub fn post(&self, path: &str, body: Value) -> (u16, Value) {
        let (s, v, _) = self.call("POST", path, Some(body), &[]);
        (s, v)
    }

    pub fn get(&self, path: &str) -> (u16, Value) {
        let (s, v, _) = self.call("GET", path, None, &[]);
        (s, v)
    }

    pub fn term(mut self) -> Option<i32> {
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        self.child.wait().unwrap().code()
    }

    pub fn kill9(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }
}

/// A test that fails leaves no daemon behind.
impl Drop for Daemon {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

pub fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(30)))
        .build()
        .into()
}

/// One request: (status, JSON body or Null, headers).
pub fn call(
    url: &str,
    method: &str,
    token: Option<&str>,
    body: Option<Value>,
    headers: &[(&str, &str)],
) -> (u16, Value, Vec<(String, String)>) {
    let a = agent();
    let auth = token.map(|t| format!("Bearer {t}"));
    let resp = match method {
        "GET" => {
            let mut r = a.get(url);
            if let Some(v) = &auth {
                r = r.header("Authorization", v);
            }
            for (k, v) in headers {
                r = r.header(*k, *v);
            }
            r.call()
        }
        _ => {
            let mut r = a.post(url);
            if let Some(v) = &auth {
                r = r.header("Authorization", v);
            }
            for (k, v) in headers {
                r = r.header(*k, *v);
            }
            r.send(body.map(|b| b.to_string()).unwrap_or_default())
        }
    };
    let mut resp = match resp {
        Ok(r) => r,
        Err(e) => return (0, json!({"transport_error": e.to_string()}), vec![]),
    };
    let status = resp.status().as_u16();
    let hs = resp.headers().iter().map(|(k, v)| (k.as_str().to_owned(), v.to_str().unwrap_or("").to_owned())).collect();
    let text = resp.body_mut().read_to_string().unwrap_or_default();
    (status, serde_json::from_str(&text).unwrap_or(Value::String(text)), hs)
}

pub fn header<'a>(hs: &'a [(String, String)], name: &str) -> Option<&'a str> {
    hs.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
}
