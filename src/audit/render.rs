//! The audit report as text (terminals) and as one self-contained HTML file (inline
//! CSS and SVG, no network). JSON is the report's serde form.

use std::fmt::Write;

use super::{Began, Ended, Fenced, Report, SubjectStory, Tenure};
use crate::inspect::format_ms;

fn began(b: &Began) -> String {
    match b {
        Began::ClaimOfFreeSubject => "claim of a free subject".into(),
        Began::ClaimOverDeadOwner { previous_generation, evidence, observed } => {
            let seen = match observed {
                None => String::new(),
                Some(o) => match (o.start_ticks, &o.exe) {
                    (None, _) => "; observed: no such process".to_owned(),
                    (Some(t), exe) => format!(
                        "; observed: start ticks {t}{}",
                        exe.as_deref().map(|e| format!(", image {e}")).unwrap_or_default()
                    ),
                },
            };
            format!(
                "claim over the provably dead owner of generation {previous_generation} ({}{seen})",
                evidence.code()
            )
        }
        Began::TakeoverOfStaleOwner { previous_generation, expected_heartbeat_ms, reason } => format!(
            "takeover of the stale owner of generation {previous_generation} (expected heartbeat {}; reason {reason:?})",
            format_ms(*expected_heartbeat_ms)
        ),
        Began::FenceRotation { previous_generation } => format!("fence rotation from generation {previous_generation}"),
    }
}

fn ended(t: &Tenure) -> String {
    let at = |s: Option<u64>| s.map(|s| format!(" at seq {s}")).unwrap_or_default();
    match &t.ended {
        Ended::StillActive => "still active".into(),
        Ended::Released => format!("released{}", at(t.ended_seq)),
        Ended::Retired { cut_off_seq, by } => {
            format!("retired{} by {by}; authoritative history ends at seq {cut_off_seq}", at(t.ended_seq))
        }
        Ended::Rotated { new_generation } => format!("rotated to generation {new_generation}{}", at(t.ended_seq)),
    }
}

/// One refusal record as a line: what, how many, by whom, when.
fn refusal_text(f: &Fenced) -> String {
    let who = f.caller.as_ref().map_or_else(|| format!("writer {}", f.writer), crate::inspect::caller_text);
    let presented = f.presented.map(|g| format!(" presented generation {g}")).unwrap_or_default();
    format!(
        "refused at seq {}: {} x{} {} by {who}{presented} (current {}) {} .. {}",
        f.seq,
        f.op,
        f.count,
        f.code,
        f.current,
        format_ms(f.first_ms),
        format_ms(f.last_ms)
    )
}

fn story_text(s: &SubjectStory, out: &mut String) {
    let _ = writeln!(out, "subject {:?}", s.subject);
    for (i, t) in s.tenures.iter().enumerate() {
        if i > 0
            && let Some(g) = s.gaps.get(i - 1)
        {
            let who = match g.authoritative_during.as_str() {
                "none" => "no owner meanwhile (the subject was free)",
                "handed_over_in_one_record" => "no ownerless instant (replaced in one record)",
                other => other,
            };
            let _ = writeln!(
                out,
                "  gap {} ms between generation {} and {}: {who}",
                g.gap_ms, g.after_generation, g.before_generation
            );
        }
        let _ = writeln!(
            out,
            "  tenure generation {}: instance {} pid {} (start {} boot {} exe {})",
            t.generation, t.owner.instance, t.owner.pid, t.owner.start_ticks, t.owner.boot_id, t.owner.exe
        );
        let _ = writeln!(out, "    began seq {} at {}: {}", t.began_seq, format_ms(t.began_ms), began(&t.began));
        let _ = writeln!(out, "    heartbeats {}, last {}", t.heartbeats, format_ms(t.last_heartbeat_ms));
        let _ = writeln!(out, "    ended: {}", ended(t));
    }
    for c in &s.cutovers {
        let _ = writeln!(
            out,
            "  cutover at seq {} ({}): generation {} -> {}: {}",
            c.seq,
            format_ms(c.time_ms),
            c.from_generation,
            c.to_generation,
            c.how
        );
        if c.leases_live.is_empty() {
            let _ = writeln!(out, "    leases held across it: none");
        }
        for l in &c.leases_live {
            let _ = writeln!(
                out,
                "    lease {} on {} (holder {:?}, token {}): {}",
                l.lease, l.resource, l.holder, l.token, l.fate
            );
        }
        for x in &c.processes_in_flight {
            let ended = x.ended_seq.map(|s| format!(" at seq {s}")).unwrap_or_default();
            let _ = writeln!(
                out,
                "    process {} {:?} (owner generation {}): {}{ended}",
                x.process, x.argv, x.owner_generation, x.status
            );
        }
        if c.requests_in_flight.is_empty() {
            let _ = writeln!(out, "    requests in flight: none");
        }
        for r in &c.requests_in_flight {
            let _ = writeln!(out, "    request {:?} ({}): {}", r.request, r.kinds.join(","), r.said);
        }
    }
    for f in &s.fenced_attempts {
        let _ = writeln!(out, "  {}", refusal_text(f));
        if let Some(c) = &f.refused_content {
            let retired = c.retired_cut_off_seq.map_or(String::new(), |s| format!(", retired after seq {s}"));
            let _ = writeln!(out, "    refused content: {} bytes blake3 {} {:?}{retired}", c.bytes, c.blake3, c.head);
        }
    }
    for c in &s.attempts_by_caller {
        let codes: Vec<String> = c.codes.iter().map(|(k, n)| format!("{k} x{n}")).collect();
        let gens: Vec<String> = c.generations.iter().map(u64::to_string).collect();
        let _ = writeln!(
            out,
            "  refused caller {}: {} attempt(s) in {} record(s) ({}) against generation(s) {}, {} .. {}",
            c.who,
            c.attempts,
            c.records,
            codes.join(", "),
            gens.join(", "),
            format_ms(c.first_ms),
            format_ms(c.last_ms)
        );
    }
    for l in &s.late_records {
        let _ = writeln!(
            out,
            "  late record at seq {}: {} by writer {} under retired generation {} (current {}): kept, not authoritative",
            l.seq, l.kind, l.writer, l.presented_generation, l.current_generation
        );
    }
    let _ = writeln!(out, "verdict {:?}: {}", s.subject, s.verdict);
}

pub fn text(r: &Report) -> String {
    let mut out = String::new();
    let last = r.last_seq.map_or("none".into(), |s| s.to_string());
    let _ = writeln!(out, "audit of {} records (last seq {last}), chain head {}", r.records, r.chain_head);
    for p in &r.log_problems {
        let _ = writeln!(out, "log problem: {p} (the story stops being complete there)");
    }
    for f in &r.findings {
        let _ = writeln!(out, "finding: {f}");
    }
    for s in &r.subjects {
        out.push('\n');
        story_text(s, &mut out);
    }
    for c in &r.daemon_cutovers {
        let _ = writeln!(
            out,
            "\ndaemon cutover at seq {} ({}): {}@{} ({}), {} request(s) settled",
            c.seq,
            format_ms(c.time_ms),
            c.home,
            c.generation,
            c.reason,
            c.settled.len() as u64 + c.more
        );
        for r in &c.settled {
            let at = r.seq.map(|s| format!(" at seq {s}")).unwrap_or_default();
            let _ = writeln!(out, "  request {:?} ({}): {}{at}", r.request, r.op, r.how);
        }
        if c.more > 0 {
            let _ = writeln!(out, "  … and {} more", c.more);
        }
    }
    out
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;").replace('\'', "&#39;")
}

/// One SVG timeline per subject, x = log sequence: one bar per tenure, red ticks for
/// fenced attempts, orange dots for late records.
fn svg(s: &SubjectStory, max_seq: u64) -> String {
    let (w, left, right) = (900.0, 10.0, 890.0);
    let x = |seq: u64| left + (right - left) * (seq as f64 / max_seq.max(1) as f64);
    let mut g = format!(
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="90" viewBox="0 0 {w} 90" role="img">"##
    );
    let _ = write!(g, r##"<line x1="{left}" y1="70" x2="{right}" y2="70" stroke="#999"/>"##);
    for (i, t) in s.tenures.iter().enumerate() {
        let (x0, x1) = (x(t.began_seq), x(t.ended_seq.unwrap_or(max_seq)));
        let fill = ["#4e79a7", "#59a14f", "#9c755f", "#76b7b2", "#edc948"][i % 5];
        let _ = write!(
            g,
            r##"<g class="tenure" data-generation="{}"><rect x="{x0:.1}" y="20" width="{:.1}" height="30" fill="{fill}"><title>{}</title></rect><text x="{:.1}" y="40" font-size="11" fill="#fff">gen {}</text></g>"##,
            t.generation,
            (x1 - x0).max(2.0),
            esc(&format!(
                "generation {} pid {} seq {}..{}: {}; {}",
                t.generation,
                t.owner.pid,
                t.began_seq,
                t.ended_seq.map_or("now".into(), |s| s.to_string()),
                began(&t.began),
                ended(t)
            )),
            x0 + 3.0,
            t.generation
        );
    }
    for f in &s.fenced_attempts {
        let _ = write!(
            g,
            r##"<line class="fenced" x1="{0:.1}" y1="10" x2="{0:.1}" y2="60" stroke="#e15759" stroke-width="2"><title>{1}</title></line>"##,
            x(f.seq),
            esc(&refusal_text(f))
        );
    }
    for l in &s.late_records {
        let _ = write!(
            g,
            r##"<circle class="late" cx="{:.1}" cy="62" r="4" fill="#f28e2b"><title>{}</title></circle>"##,
            x(l.seq),
            esc(&format!("seq {}: late {} under generation {}", l.seq, l.kind, l.presented_generation))
        );
    }
    let _ = write!(
        g,
        r##"<text x="{left}" y="86" font-size="10">seq 0</text><text x="{:.1}" y="86" font-size="10">seq {max_seq}</text></svg>"##,
        right - 60.0
    );
    g
}

pub fn html(r: &Report) -> String {
    let max_seq = r.last_seq.unwrap_or(1);
    let mut h = String::from(
        r#"<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"/><title>fencelog audit</title>
<style>body{font-family:system-ui,sans-serif;margin:2em;color:#222}h2{margin-top:2em}pre{background:#f6f6f6;padding:1em;overflow-x:auto}.ok{color:#2a7}.bad{color:#c33}</style>
</head><body>
"#,
    );
    let last = r.last_seq.map_or("none".into(), |s| s.to_string());
    let _ = writeln!(
        h,
        "<h1>fencelog audit</h1><p>{} records, last sequence {last}, chain head <code>{}</code></p>",
        r.records,
        esc(&r.chain_head)
    );
    for p in &r.log_problems {
        let _ = writeln!(h, "<p class=\"bad\">log problem: {}</p>", esc(&p.to_string()));
    }
    for f in &r.findings {
        let _ = writeln!(h, "<p class=\"bad\">finding: {}</p>", esc(f));
    }
    for s in &r.subjects {
        let class = if s.verdict == "consistent" { "ok" } else { "bad" };
        let _ = writeln!(h, "<h2>{}</h2><p class=\"{class}\">verdict: {}</p>", esc(&s.subject), esc(&s.verdict));
        h.push_str(&svg(s, max_seq));
        let mut t = String::new();
        story_text(s, &mut t);
        let _ = writeln!(h, "\n<pre>{}</pre>", esc(&t));
    }
    h.push_str("</body></html>\n");
    h
}
