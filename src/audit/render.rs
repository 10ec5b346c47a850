//! The audit report as text (terminals) and as one self-contained HTML file (inline
//! CSS and SVG, no network). JSON is the report's serde form.

use std::fmt::Write;

use serde_json::Value;

use super::{Began, Cutover, Ended, Fenced, Gap, Report, SubjectStory, Tenure};
use crate::view::time::format_ms;

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
        Began::TakeoverOfStaleOwner { previous_generation, expected_heartbeat_ms, reason, staleness_observed } => {
            let watched = staleness_observed
                .as_ref()
                .map(|o| format!("; watched unchanged for {} ms on host {:?}'s own clock", o.watched_ms, o.host))
                .unwrap_or_default();
            format!(
                "takeover of the stale owner of generation {previous_generation} (expected heartbeat {}; reason \
                 {reason:?}{watched})",
                format_ms(*expected_heartbeat_ms)
            )
        }
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
    let who = f.caller.as_ref().map_or_else(|| format!("writer {}", f.writer), crate::view::record::caller_text);
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
    let _ = crate::text_line!(out, "subject {:?}", s.subject);
    for (i, t) in s.tenures.iter().enumerate() {
        if i > 0
            && let Some(g) = s.gaps.get(i - 1)
        {
            gap_text(g, out);
        }
        tenure_text(t, out);
    }
    for c in &s.cutovers {
        cutover_text(c, out);
    }
    attempts_text(s, out);
    let _ = crate::text_line!(out, "verdict {:?}: {}", s.subject, s.verdict);
}

/// The gap before a tenure: how long, and who was authoritative meanwhile.
fn gap_text(g: &Gap, out: &mut String) {
    let who = match g.authoritative_during.as_str() {
        "none" => "no owner meanwhile (the subject was free)",
        "handed_over_in_one_record" => "no ownerless instant (replaced in one record)",
        other => other,
    };
    let _ = crate::text_line!(
        out,
        "  gap {} ms between generation {} and {}: {who}",
        g.gap_ms,
        g.after_generation,
        g.before_generation
    );
}

/// A tenure: its owner, how it began and ended, what was attempted against it.
fn tenure_text(t: &Tenure, out: &mut String) {
    let _ = crate::text_line!(
        out,
        "  tenure generation {}: instance {} pid {} (start {} boot {} exe {})",
        t.generation,
        t.owner.instance,
        t.owner.pid,
        t.owner.start_ticks,
        t.owner.boot_id,
        t.owner.exe
    );
    let _ = crate::text_line!(out, "    began seq {} at {}: {}", t.began_seq, format_ms(t.began_ms), began(&t.began));
    let _ = crate::text_line!(out, "    heartbeats {}, last {}", t.heartbeats, format_ms(t.last_heartbeat_ms));
    let _ = crate::text_line!(out, "    ended: {}", ended(t));
    if t.refused_attempts + t.late_records > 0 {
        let _ = crate::text_line!(
            out,
            "    against this tenure: {} refused attempt(s) recorded, {} late record(s)",
            t.refused_attempts,
            t.late_records
        );
    }
}

/// A cutover and what was in flight across it: leases, processes, requests.
fn cutover_text(c: &Cutover, out: &mut String) {
    let _ = crate::text_line!(
        out,
        "  cutover at seq {} ({}): generation {} -> {}: {}",
        c.seq,
        format_ms(c.time_ms),
        c.from_generation,
        c.to_generation,
        c.how
    );
    if c.leases_live.is_empty() {
        let _ = crate::text_line!(out, "    leases held across it: none");
    }
    for l in &c.leases_live {
        let _ = crate::text_line!(
            out,
            "    lease {} on {} (holder {:?}, token {}): {}",
            l.lease,
            l.resource,
            l.holder,
            l.token,
            l.fate
        );
    }
    for x in &c.processes_in_flight {
        let ended = x.ended_seq.map(|s| format!(" at seq {s}")).unwrap_or_default();
        let _ = crate::text_line!(
            out,
            "    process {} {:?} (owner generation {}): {}{ended}",
            x.process,
            x.argv,
            x.owner_generation,
            x.status
        );
    }
    if c.requests_in_flight.is_empty() {
        let _ = crate::text_line!(out, "    requests in flight: none");
    }
    for r in &c.requests_in_flight {
        let _ = crate::text_line!(out, "    request {:?} ({}): {}", r.request, r.kinds.join(","), r.said);
    }
}

/// The refused attempts (each record, then by caller) and the late records.
fn attempts_text(s: &SubjectStory, out: &mut String) {
    for f in &s.fenced_attempts {
        let _ = crate::text_line!(out, "  {}", refusal_text(f));
        if let Some(c) = &f.refused_content {
            let retired = c.retired_cut_off_seq.map_or(String::new(), |s| format!(", retired after seq {s}"));
            let _ = crate::text_line!(
                out,
                "    refused content: {} bytes blake3 {} {:?}{retired}",
                c.bytes,
                c.blake3,
                c.first_bytes
            );
        }
    }
    for c in &s.attempts_by_caller {
        let codes: Vec<String> = c.codes.iter().map(|(k, n)| format!("{k} x{n}")).collect();
        let gens: Vec<String> = c.generations.iter().map(u64::to_string).collect();
        let _ = crate::text_line!(
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
        let _ = crate::text_line!(
            out,
            "  late record at seq {}: {} by writer {} under retired generation {} (current {}): kept, not authoritative",
            l.seq,
            l.kind,
            l.writer,
            l.presented_generation,
            l.current_generation
        );
    }
}

pub fn text(r: &Report) -> String {
    let mut out = String::new();
    let last = r.last_seq.map_or("none".into(), |s| s.to_string());
    let _ = crate::text_line!(out, "audit of {} records (last seq {last}), chain head {}", r.records, r.chain_head);
    for p in &r.log_problems {
        let _ = crate::text_line!(out, "log problem: {p} (the story stops being complete there)");
    }
    for f in &r.findings {
        let _ = crate::text_line!(out, "finding: {f}");
    }
    for s in &r.subjects {
        out.push('\n');
        story_text(s, &mut out);
    }
    for c in &r.daemon_cutovers {
        // A blank line before each, as before each subject's story (`text_line!`
        // escapes a newline inside its text: it must not start the format).
        out.push('\n');
        let _ = crate::text_line!(
            out,
            "daemon cutover at seq {} ({}): {}@{} ({}), {} request(s) settled",
            c.seq,
            format_ms(c.time_ms),
            c.home,
            c.generation,
            c.reason,
            c.settled.len() as u64 + c.more
        );
        for r in &c.settled {
            let at = r.seq.map(|s| format!(" at seq {s}")).unwrap_or_default();
            let _ = crate::text_line!(out, "  request {:?} ({}): {}{at}", r.request, r.op, r.how);
        }
        if c.more > 0 {
            let _ = crate::text_line!(out, "  … and {} more", c.more);
        }
    }
    out
}

/// HTML text: the markup characters as entities, and every control character but
/// newline and tab (whitespace in HTML) as its escape, so that the page shown in a
/// terminal (`cat`, `less -r`) sends it nothing either.
fn esc(s: &str) -> String {
    let s: String = s
        .split(['\n', '\t'])
        .map(|part| crate::view::escape_controls(part).into_owned())
        .zip(s.match_indices(['\n', '\t']).map(|(_, m)| m).chain(std::iter::once("")))
        .map(|(part, sep)| part + sep)
        .collect();
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;").replace('\'', "&#39;")
}

/// Timeline geometry: x by time, shared by every subject of the report.
struct Axis {
    from_ms: u64,
    to_ms: u64,
}

const SVG_W: f64 = 960.0;
const SVG_LEFT: f64 = 12.0;
const SVG_RIGHT: f64 = 948.0;

impl Axis {
    /// From the first to the last time a subject's story mentions (each subject
    /// has its own axis: a short story is not squeezed into a long log's).
    fn of(s: &SubjectStory) -> Axis {
        let mut times = vec![];
        for t in &s.tenures {
            times.extend([t.began_ms, t.last_heartbeat_ms]);
            times.extend(t.ended_ms);
        }
        times.extend(s.cutovers.iter().map(|c| c.time_ms));
        times.extend(s.fenced_attempts.iter().flat_map(|f| [f.first_ms, f.last_ms]));
        times.extend(s.late_records.iter().map(|l| l.time_ms));
        let from_ms = times.iter().copied().min().unwrap_or(0);
        let to_ms = times.iter().copied().max().unwrap_or(0);
        // A little room on the right for the still-active tenure, at least a second.
        // Saturating: a record's time is whatever its writer (or a forger) wrote.
        let to_ms = to_ms.saturating_add((to_ms - from_ms) / 20).max(from_ms.saturating_add(1000));
        Axis { from_ms, to_ms }
    }

    fn x(&self, ms: u64) -> f64 {
        let span = (self.to_ms - self.from_ms) as f64;
        SVG_LEFT + (SVG_RIGHT - SVG_LEFT) * (ms.clamp(self.from_ms, self.to_ms) - self.from_ms) as f64 / span
    }
}

const TENURE_FILLS: [&str; 5] = ["#4e79a7", "#59a14f", "#9c755f", "#76b7b2", "#b07aa1"];

/// One SVG timeline: x = wall-clock time (the records' `time_ms`), one bar per
/// tenure, diamonds for cutovers, red ticks for refused attempts, orange dots for
/// late records; a time axis with five ticks and a legend. Every mark has a
/// `<title>`: what, when, who, which sequence.
fn svg(s: &SubjectStory, axis: &Axis) -> String {
    let mut g = format!(
        r##"<svg xmlns="http://www.w3.org/2000/svg" class="timeline" width="{SVG_W}" height="150" viewBox="0 0 {SVG_W} 150" role="img" aria-label="timeline of {}">"##,
        esc(&s.subject)
    );
    axis_marks(axis, &mut g);
    tenure_bars(s, axis, &mut g);
    cutover_marks(s, axis, &mut g);
    refusal_marks(s, axis, &mut g);
    late_marks(s, axis, &mut g);
    g.push_str(
        r##"<g class="legend" font-size="11" fill="#333"><rect x="12" y="120" width="14" height="10" fill="#4e79a7"/><text x="30" y="129">tenure (one colour per generation)</text><path d="M250 119 l6 6 l-6 6 l-6 -6 z" fill="#222"/><text x="262" y="129">cutover</text><rect x="330" y="120" width="14" height="10" fill="#e15759"/><text x="348" y="129">refused attempts (first..last)</text><circle cx="545" cy="125" r="5" fill="#f28e2b"/><text x="555" y="129">late record (kept, not authoritative)</text><text x="790" y="129">x: time (UTC)</text></g>"##,
    );
    g.push_str("</svg>");
    g
}

/// The time axis: a line and five ticks with their times.
fn axis_marks(axis: &Axis, g: &mut String) {
    g.push_str(r##"<g class="axis">"##);
    let _ = write!(g, r##"<line x1="{SVG_LEFT}" y1="86" x2="{SVG_RIGHT}" y2="86" stroke="#888"/>"##);
    for i in 0..5u64 {
        let ms = axis.from_ms + (axis.to_ms - axis.from_ms) * i / 4;
        let x = axis.x(ms);
        let anchor = match i {
            0 => "start",
            4 => "end",
            _ => "middle",
        };
        let _ = write!(
            g,
            r##"<line x1="{x:.1}" y1="86" x2="{x:.1}" y2="91" stroke="#888"/><text x="{x:.1}" y="103" font-size="10" text-anchor="{anchor}" fill="#444">{}</text>"##,
            esc(&format_ms(ms))
        );
    }
    g.push_str("</g>");
}

/// One bar per tenure, from its beginning to its end (or the axis's end).
fn tenure_bars(s: &SubjectStory, axis: &Axis, g: &mut String) {
    for (i, t) in s.tenures.iter().enumerate() {
        let (x0, x1) = (axis.x(t.began_ms), axis.x(t.ended_ms.unwrap_or(axis.to_ms)));
        let title = format!(
            "generation {}: owner pid {} instance {}; seq {}..{} ({} .. {}); {}; {}; {} heartbeat(s)",
            t.generation,
            t.owner.pid,
            t.owner.instance,
            t.began_seq,
            t.ended_seq.map_or("now".into(), |s| s.to_string()),
            format_ms(t.began_ms),
            t.ended_ms.map_or("now".into(), format_ms),
            began(&t.began),
            ended(t),
            t.heartbeats
        );
        let _ = write!(
            g,
            r##"<g class="tenure" data-generation="{}"><rect x="{x0:.1}" y="30" width="{:.1}" height="34" rx="3" fill="{}"><title>{}</title></rect><text x="{:.1}" y="51" font-size="11" fill="#fff">gen {}</text></g>"##,
            t.generation,
            (x1 - x0).max(2.0),
            TENURE_FILLS[i % TENURE_FILLS.len()],
            esc(&title),
            x0 + 4.0,
            t.generation
        );
    }
}

/// A diamond per cutover.
fn cutover_marks(s: &SubjectStory, axis: &Axis, g: &mut String) {
    for c in &s.cutovers {
        let x = axis.x(c.time_ms);
        let title = format!(
            "seq {} at {}: cutover, generation {} to {} ({})",
            c.seq,
            format_ms(c.time_ms),
            c.from_generation,
            c.to_generation,
            c.how
        );
        let _ = write!(
            g,
            r##"<path class="cutover" d="M{x:.1} 18 l6 6 l-6 6 l-6 -6 z" fill="#222"><title>{}</title></path>"##,
            esc(&title)
        );
    }
}

/// A red tick per refusal record, from its first attempt to its last.
fn refusal_marks(s: &SubjectStory, axis: &Axis, g: &mut String) {
    for f in &s.fenced_attempts {
        let (x0, x1) = (axis.x(f.first_ms), axis.x(f.last_ms));
        let _ = write!(
            g,
            r##"<rect class="refused" x="{:.1}" y="68" width="{:.1}" height="12" fill="#e15759"><title>{}</title></rect>"##,
            x0 - 1.0,
            (x1 - x0).max(2.0),
            esc(&refusal_text(f))
        );
    }
}

/// An orange dot per late record.
fn late_marks(s: &SubjectStory, axis: &Axis, g: &mut String) {
    for l in &s.late_records {
        let title = format!(
            "seq {} at {}: late {} by writer {} under retired generation {} (current {})",
            l.seq,
            format_ms(l.time_ms),
            l.kind,
            l.writer,
            l.presented_generation,
            l.current_generation
        );
        let _ = write!(
            g,
            r##"<circle class="late" cx="{:.1}" cy="74" r="5" fill="#f28e2b"><title>{}</title></circle>"##,
            axis.x(l.time_ms),
            esc(&title)
        );
    }
}

/// `s` as one shell word: as it is when it is plain, else in single quotes.
fn shell_quote(s: &str) -> String {
    if !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || "/._-+:@%,=".contains(c)) {
        return s.to_owned();
    }
    format!("'{}'", s.replace('\'', "'\\''"))
}

/// The last time a subject's story mentions.
fn last_time(s: &SubjectStory) -> Option<u64> {
    let tenures = s.tenures.iter().flat_map(|t| [Some(t.last_heartbeat_ms), t.ended_ms]).flatten();
    let attempts = s.fenced_attempts.iter().map(|f| f.last_ms);
    tenures.chain(attempts).chain(s.late_records.iter().map(|l| l.time_ms)).max()
}

fn td(s: &str) -> String {
    format!("<td>{}</td>", esc(s))
}

fn owner_cell(o: &crate::model::Identity) -> String {
    format!(
        "pid {} start {}<br/><small>instance {}<br/>boot {}<br/>image {}</small>",
        o.pid,
        o.start_ticks,
        esc(&o.instance.to_string()),
        esc(&o.boot_id),
        esc(&o.exe)
    )
}

fn tenures_table(s: &SubjectStory, h: &mut String) {
    h.push_str("<h3>Tenures</h3>\n<table class=\"tenures\"><thead><tr><th>generation</th><th>owner</th><th>began</th><th>ended</th><th>cut-off</th><th>heartbeats</th><th>refused / late against it</th></tr></thead><tbody>\n");
    for t in &s.tenures {
        let cut_off = match &t.ended {
            Ended::Retired { cut_off_seq, .. } => format!("seq {cut_off_seq}"),
            _ => "—".into(),
        };
        let _ = writeln!(
            h,
            "<tr class=\"tenure-row\" data-generation=\"{}\"><td>{}</td><td>{}</td>{}{}{}{}<td>{} / {}</td></tr>",
            t.generation,
            t.generation,
            owner_cell(&t.owner),
            td(&format!("seq {} at {}: {}", t.began_seq, format_ms(t.began_ms), began(&t.began))),
            td(&ended(t)),
            td(&cut_off),
            td(&format!("{} (last {})", t.heartbeats, format_ms(t.last_heartbeat_ms))),
            t.refused_attempts,
            t.late_records
        );
    }
    h.push_str("</tbody></table>\n");
}

fn cutover_panels(s: &SubjectStory, h: &mut String) {
    if s.cutovers.is_empty() {
        return;
    }
    h.push_str("<h3>Cutovers</h3>\n");
    for c in &s.cutovers {
        let _ = writeln!(
            h,
            "<div class=\"cutover-panel\"><h4>seq {} at {}: generation {} &rarr; {}</h4><p>{}</p>",
            c.seq,
            esc(&format_ms(c.time_ms)),
            c.from_generation,
            c.to_generation,
            esc(&c.how)
        );
        h.push_str("<table class=\"in-flight\"><thead><tr><th>in flight</th><th>what</th><th>how it settled</th></tr></thead><tbody>\n");
        if c.leases_live.is_empty() && c.processes_in_flight.is_empty() && c.requests_in_flight.is_empty() {
            h.push_str(
                "<tr><td colspan=\"3\">nothing: no lease, process or request of this subject was in flight</td></tr>\n",
            );
        }
        for l in &c.leases_live {
            let fate = match l.fate.as_object() {
                Some(o) => o
                    .iter()
                    .filter(|(k, _)| *k != "kind")
                    .fold(o.get("kind").and_then(Value::as_str).unwrap_or("?").to_owned(), |acc, (k, v)| {
                        format!("{acc}, {k} {}", v.as_str().map_or_else(|| v.to_string(), str::to_owned))
                    }),
                None => l.fate.to_string(),
            };
            let _ = writeln!(
                h,
                "<tr class=\"lease\">{}{}{}</tr>",
                td(&format!("lease {}", l.lease)),
                td(&format!("{} held by {} (token {})", l.resource, l.holder, l.token)),
                td(&fate)
            );
        }
        for x in &c.processes_in_flight {
            let ended = x.ended_seq.map(|s| format!(" at seq {s}")).unwrap_or_default();
            let _ = writeln!(
                h,
                "<tr class=\"process\">{}{}{}</tr>",
                td(&format!("process {}", x.process)),
                td(&format!("{:?} (owner generation {})", x.argv, x.owner_generation)),
                td(&format!("{}{ended}", x.status))
            );
        }
        for r in &c.requests_in_flight {
            let _ = writeln!(
                h,
                "<tr class=\"request\">{}{}{}</tr>",
                td(&format!("request {:?}", r.request)),
                td(&r.kinds.join(", ")),
                td(&r.said)
            );
        }
        h.push_str("</tbody></table></div>\n");
    }
}

fn attempts_tables(s: &SubjectStory, h: &mut String) {
    if s.fenced_attempts.is_empty() && s.late_records.is_empty() {
        return;
    }
    h.push_str("<h3>Refused and late attempts, by caller</h3>\n");
    if !s.attempts_by_caller.is_empty() {
        h.push_str("<table class=\"callers\"><thead><tr><th>caller</th><th>attempts</th><th>records</th><th>codes</th><th>against generation(s)</th><th>first</th><th>last</th><th>sequences</th></tr></thead><tbody>\n");
        for c in &s.attempts_by_caller {
            let codes: Vec<String> = c.codes.iter().map(|(k, n)| format!("{k} ×{n}")).collect();
            let gens: Vec<String> = c.generations.iter().map(u64::to_string).collect();
            let seqs: Vec<String> = c.seqs.iter().map(u64::to_string).collect();
            let _ = writeln!(
                h,
                "<tr class=\"caller\">{}<td>{}</td><td>{}</td>{}{}{}{}{}</tr>",
                td(&c.who),
                c.attempts,
                c.records,
                td(&codes.join(", ")),
                td(&gens.join(", ")),
                td(&format_ms(c.first_ms)),
                td(&format_ms(c.last_ms)),
                td(&seqs.join(", "))
            );
        }
        h.push_str("</tbody></table>\n");
    }
    if !s.fenced_attempts.is_empty() {
        h.push_str("<table class=\"refusals\"><thead><tr><th>seq</th><th>refused</th><th>what it tried to write</th></tr></thead><tbody>\n");
        for f in &s.fenced_attempts {
            let content = f
                .refused_content
                .as_ref()
                .map_or(String::new(), |c| format!("{} bytes, blake3 {}: {:?}", c.bytes, c.blake3, c.first_bytes));
            let _ =
                writeln!(h, "<tr class=\"refusal\"><td>{}</td>{}{}</tr>", f.seq, td(&refusal_text(f)), td(&content));
        }
        h.push_str("</tbody></table>\n");
    }
    if !s.late_records.is_empty() {
        h.push_str("<table class=\"late-records\"><thead><tr><th>seq</th><th>late record (kept, not authoritative)</th></tr></thead><tbody>\n");
        for l in &s.late_records {
            let _ = writeln!(
                h,
                "<tr class=\"late-record\"><td>{}</td>{}</tr>",
                l.seq,
                td(&format!(
                    "{} at {} by writer {} under retired generation {} (current {})",
                    l.kind,
                    format_ms(l.time_ms),
                    l.writer,
                    l.presented_generation,
                    l.current_generation
                ))
            );
        }
        h.push_str("</tbody></table>\n");
    }
}

const STYLE: &str = "body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1000px;color:#222;line-height:1.4}\
h1{margin-bottom:.2em}h2{margin-top:2.2em;border-bottom:2px solid #ddd;padding-bottom:.2em}\
table{border-collapse:collapse;margin:.6em 0;width:100%;font-size:14px}th,td{border:1px solid #ddd;padding:4px 8px;text-align:left;vertical-align:top;overflow-wrap:anywhere}\
th{background:#f3f3f3;white-space:nowrap;overflow-wrap:normal}code,small{font-family:ui-monospace,monospace;font-size:12px;overflow-wrap:anywhere}\
.ok{color:#1a7f37;font-weight:600}.bad{color:#c62828;font-weight:600}\
.cutover-panel{border:1px solid #ccc;border-left:5px solid #222;border-radius:4px;padding:.2em 1em;margin:.8em 0;background:#fafafa}\
.findings li{color:#c62828}pre{background:#f6f6f6;padding:1em;overflow-x:auto;font-size:12px}";

/// The report as one self-contained HTML page (inline CSS and SVG; no script, no
/// link, no network): a summary, then per subject a timeline over time with a
/// legend, the tenures as a table, each cutover as a panel, and refused and late
/// attempts grouped by caller; the text report last. `dir` is the log's directory,
/// for the command that pins its head.
pub fn html(r: &Report, dir: &str) -> String {
    let mut h = String::new();
    let _ = writeln!(
        h,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"/><title>fencelog audit: {} subject(s), {} record(s)</title>\n<style>{STYLE}</style>\n</head><body>",
        r.subjects.len(),
        r.records
    );
    summary_table(r, dir, &mut h);
    findings_list(r, &mut h);
    subjects_table(r, &mut h);
    for (i, s) in r.subjects.iter().enumerate() {
        subject_section(i, s, &mut h);
    }
    daemon_cutovers_section(r, &mut h);
    let _ = writeln!(h, "<section class=\"text-report\"><h2>Text report</h2><pre>{}</pre></section>", esc(&text(r)));
    h.push_str("</body></html>\n");
    h
}

/// The page's header, and the summary section's first table: the log, its records,
/// its chain head and the command that pins it, the verdicts.
fn summary_table(r: &Report, dir: &str, h: &mut String) {
    let last = r.last_seq.map_or("none".into(), |s| s.to_string());
    let verdicts_ok = r.subjects.iter().filter(|s| s.verdict == "consistent").count();
    h.push_str("<header><h1>fencelog audit</h1></header>\n<section id=\"summary\" class=\"summary\"><h2>Summary</h2>\n<table class=\"summary\"><tbody>\n");
    let _ = writeln!(h, "<tr><th>log</th><td><code>{}</code></td></tr>", esc(dir));
    let spans: Vec<Axis> = r.subjects.iter().map(Axis::of).collect();
    let span = match (spans.iter().map(|a| a.from_ms).min(), r.subjects.iter().flat_map(last_time).max()) {
        (Some(a), Some(b)) => format!(", {} .. {}", format_ms(a), format_ms(b)),
        _ => String::new(),
    };
    let _ = writeln!(h, "<tr><th>records</th><td>{} (sequence 1..{last}){}</td></tr>", r.records, esc(&span));
    let _ = writeln!(h, "<tr><th>chain head</th><td><code>{}</code></td></tr>", esc(&r.chain_head));
    if let Some(seq) = r.last_seq {
        let _ = writeln!(
            h,
            "<tr><th>pin this history</th><td><code>fencelog inspect verify {} --expect-head {seq}:{}</code><br/><small>fails later if the log no longer holds this head</small></td></tr>",
            esc(&shell_quote(dir)),
            esc(&r.chain_head)
        );
    }
    let class = if verdicts_ok == r.subjects.len() && r.findings.is_empty() { "ok" } else { "bad" };
    let _ = writeln!(
        h,
        "<tr><th>verdicts</th><td class=\"{class}\">{verdicts_ok} of {} subject(s) consistent; {} finding(s); {} log problem(s)</td></tr>",
        r.subjects.len(),
        r.findings.len(),
        r.log_problems.len()
    );
    h.push_str("</tbody></table>\n");
}

/// The findings and log problems, when there are any.
fn findings_list(r: &Report, h: &mut String) {
    if !r.findings.is_empty() || !r.log_problems.is_empty() {
        h.push_str("<ul class=\"findings\">\n");
        for p in &r.log_problems {
            let _ = writeln!(h, "<li>log problem: {} (the story stops being complete there)</li>", esc(&p.to_string()));
        }
        for f in &r.findings {
            let _ = writeln!(h, "<li>finding: {}</li>", esc(f));
        }
        h.push_str("</ul>\n");
    }
}

/// The summary section's last table: one row per subject, linking to its section;
/// it closes the summary section.
fn subjects_table(r: &Report, h: &mut String) {
    h.push_str("<table class=\"subjects\"><thead><tr><th>subject</th><th>verdict</th><th>tenures</th><th>cutovers</th><th>refused attempts</th><th>late records</th></tr></thead><tbody>\n");
    for (i, s) in r.subjects.iter().enumerate() {
        let class = if s.verdict == "consistent" { "ok" } else { "bad" };
        let refused: u64 = s.fenced_attempts.iter().map(|f| f.count).sum();
        let _ = writeln!(
            h,
            "<tr><td><a href=\"#subject-{i}\">{}</a></td><td class=\"{class}\">{}</td><td>{}</td><td>{}</td><td>{refused}</td><td>{}</td></tr>",
            esc(&format!("{:?}", s.subject)),
            esc(&s.verdict),
            s.tenures.len(),
            s.cutovers.len(),
            s.late_records.len()
        );
    }
    h.push_str("</tbody></table></section>\n");
}

/// A subject's section: its timeline, tenures, cutovers and refused and late
/// attempts.
fn subject_section(i: usize, s: &SubjectStory, h: &mut String) {
    let class = if s.verdict == "consistent" { "ok" } else { "bad" };
    let _ = writeln!(
        h,
        "<section class=\"subject\" id=\"subject-{i}\"><h2>{} <span class=\"{class}\">{}</span></h2>",
        esc(&format!("{:?}", s.subject)),
        esc(&s.verdict)
    );
    let _ = writeln!(h, "<figure>{}</figure>", svg(s, &Axis::of(s)));
    tenures_table(s, h);
    cutover_panels(s, h);
    attempts_tables(s, h);
    h.push_str("</section>\n");
}

/// Daemon cutovers, when there are any: each with how every request it had
/// admitted was settled.
fn daemon_cutovers_section(r: &Report, h: &mut String) {
    if !r.daemon_cutovers.is_empty() {
        h.push_str("<section class=\"daemon-cutovers\"><h2>Daemon cutovers</h2>\n");
        for c in &r.daemon_cutovers {
            let _ = writeln!(
                h,
                "<div class=\"cutover-panel\"><h4>seq {} at {}: {} at generation {} ({})</h4><table><thead><tr><th>request</th><th>operation</th><th>settled</th></tr></thead><tbody>",
                c.seq,
                esc(&format_ms(c.time_ms)),
                esc(&format!("{:?}", c.home)),
                c.generation,
                esc(&c.reason)
            );
            for q in &c.settled {
                let at = q.seq.map(|s| format!(" at seq {s}")).unwrap_or_default();
                let _ = writeln!(h, "<tr>{}{}{}</tr>", td(&q.request), td(&q.op), td(&format!("{}{at}", q.how)));
            }
            if c.more > 0 {
                let _ = writeln!(h, "<tr><td colspan=\"3\">… and {} more</td></tr>", c.more);
            }
            h.push_str("</tbody></table></div>\n");
        }
        h.push_str("</section>\n");
    }
}
