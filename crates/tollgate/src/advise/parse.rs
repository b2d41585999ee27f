//! Reading access-log lines into [`Record`]s: nginx/Caddy combined, JSON lines (Caddy's JSON
//! access log by default), Envoy's default access-log format, and `simulate`'s CSV trace.
//!
//! The combined and Envoy readers scan the line by hand and borrow every field from it: no
//! allocation and no regular expression per line, since `advise` is meant to read logs of
//! millions of lines. JSON lines go through `serde_json` into buffers reused from line to line.

use super::json::{scan, Found, Target, MAX_HEADERS};
use crate::trace::{parse_line, Event};
use tollgate_core::internals::days_from_civil;

/// The input formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Format {
    /// Decide per file from its first non-blank line.
    Auto,
    /// nginx's `combined` (Apache's, Caddy's with a combined encoder).
    Combined,
    /// One JSON object per line (Caddy's access log as is; field names set by flags).
    Json,
    /// Envoy's default access-log format.
    Envoy,
    /// `tollgate simulate`'s trace: `t_ms,domain,descriptor,hits`.
    Csv,
}

impl Format {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Format::Auto => "auto",
            Format::Combined => "combined",
            Format::Json => "json",
            Format::Envoy => "envoy",
            Format::Csv => "csv",
        }
    }

    /// The format of a file whose first non-blank line is `line`.
    pub(crate) fn detect(line: &str) -> Format {
        let l = line.trim_start();
        let b = l.as_bytes();
        if l.starts_with('{') {
            Format::Json
        } else if l.starts_with('[') && b.len() > 5 && b[1..5].iter().all(u8::is_ascii_digit) {
            Format::Envoy
        } else if l.starts_with('#')
            || l.split(',').count() == 4
                && l.split(',')
                    .next()
                    .is_some_and(|t| t.trim().parse::<u64>().is_ok())
        {
            Format::Csv
        } else {
            Format::Combined
        }
    }
}

/// Where the JSON reader finds each field: dotted paths into the object.
#[derive(Debug, Clone)]
pub(crate) struct JsonFields {
    pub time: Vec<String>,
    /// Tried in order; the first present wins (Caddy 2.7+ writes `client_ip`, older `remote_ip`).
    pub client: Vec<Vec<String>>,
    pub path: Vec<String>,
    pub method: Vec<String>,
    pub host: Vec<String>,
    /// An object of header name to value (or to a list of values, as Caddy writes them).
    pub headers: Vec<String>,
    /// Every path with what it fills, for the reader.
    wanted: Vec<(Vec<String>, Target)>,
}

fn dotted(s: &str) -> Vec<String> {
    s.split('.').map(str::to_owned).collect()
}

impl JsonFields {
    pub(crate) fn new(
        time: &str,
        client: &str,
        path: &str,
        method: &str,
        host: &str,
        headers: &str,
    ) -> Self {
        let mut f = JsonFields {
            time: dotted(time),
            client: client.split(',').map(dotted).collect(),
            path: dotted(path),
            method: dotted(method),
            host: dotted(host),
            headers: dotted(headers),
            wanted: Vec::new(),
        };
        let mut wanted = vec![(f.time.clone(), Target::Time)];
        wanted.extend(
            f.client
                .iter()
                .enumerate()
                .map(|(i, c)| (c.clone(), Target::Client(i))),
        );
        wanted.push((f.path.clone(), Target::Path));
        wanted.push((f.method.clone(), Target::Method));
        wanted.push((f.host.clone(), Target::Host));
        wanted.push((f.headers.clone(), Target::Headers));
        // The reader tracks paths in a 64-bit set.
        wanted.truncate(64);
        f.wanted = wanted;
        f
    }
}

/// One request read from a log line. Fields the format does not have are empty.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Record<'a> {
    /// Microseconds since the Unix epoch (a CSV trace: since its own zero).
    pub t_us: u64,
    pub ip: &'a str,
    pub method: &'a str,
    /// Path and query, as sent.
    pub path: &'a str,
    pub host: &'a str,
    headers: [(&'a str, &'a str); MAX_HEADERS],
    n_headers: usize,
    /// CSV only: the trace's event.
    pub event: Option<&'a Event>,
}

impl<'a> Record<'a> {
    fn new(t_us: u64) -> Self {
        Record {
            t_us,
            ip: "",
            method: "",
            path: "",
            host: "",
            headers: [("", ""); MAX_HEADERS],
            n_headers: 0,
            event: None,
        }
    }

    fn push_header(&mut self, name: &'a str, value: &'a str) {
        if self.n_headers < MAX_HEADERS && value != "-" {
            self.headers[self.n_headers] = (name, value);
            self.n_headers += 1;
        }
    }

    /// The headers, names as the log wrote them.
    pub(crate) fn headers(&self) -> &[(&'a str, &'a str)] {
        &self.headers[..self.n_headers]
    }

    /// The first value of header `name` (any case).
    pub(crate) fn header(&self, name: &str) -> Option<&'a str> {
        self.headers()
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| *v)
    }
}

/// A line reader for one format, with the buffers it reuses.
pub(crate) struct Parser {
    pub format: Format,
    fields: JsonFields,
    json: Found,
    event: Option<Event>,
}

impl Parser {
    pub(crate) fn new(format: Format, fields: JsonFields) -> Self {
        Parser {
            format,
            fields,
            json: Found::default(),
            event: None,
        }
    }

    /// Read one line: `Ok(None)` for a blank (or, in a CSV trace, comment) line.
    pub(crate) fn parse<'a>(&'a mut self, line: &'a str) -> Result<Option<Record<'a>>, String> {
        let line = line.trim_end_matches(['\n', '\r']);
        if line.trim().is_empty() {
            return Ok(None);
        }
        match self.format {
            Format::Combined | Format::Auto => combined(line).map(Some),
            Format::Envoy => envoy(line).map(Some),
            Format::Json => json(line, &self.fields, &mut self.json).map(Some),
            Format::Csv => {
                let Some(ev) = parse_line(line)? else {
                    return Ok(None);
                };
                let ev = self.event.insert(ev);
                let mut r = Record::new(ev.t_ms.saturating_mul(1000));
                r.event = Some(ev);
                Ok(Some(r))
            }
        }
    }
}

/// `s` up to the first `delim` and the rest after it.
fn split_at_byte(s: &str, delim: u8) -> Option<(&str, &str)> {
    let i = memchr(delim, s.as_bytes())?;
    Some((&s[..i], &s[i + 1..]))
}

fn memchr(b: u8, s: &[u8]) -> Option<usize> {
    s.iter().position(|&c| c == b)
}

/// A double-quoted field at the start of `s` (after spaces): its content (escapes kept as
/// written: `\"` does not end it) and the rest.
fn quoted(s: &str) -> Option<(&str, &str)> {
    let s = s.trim_start_matches(' ');
    let b = s.as_bytes();
    if b.first() != Some(&b'"') {
        return None;
    }
    let mut i = 1;
    while i < b.len() {
        match b[i] {
            b'\\' => i += 2,
            b'"' => return Some((&s[1..i], &s[i + 1..])),
            _ => i += 1,
        }
    }
    None
}

/// `METHOD PATH PROTO` of a request line; a line that is not one (nginx logs `-` or garbage for
/// a bad request) is taken as a path alone.
fn request_line(r: &str) -> (&str, &str) {
    let mut parts = r.splitn(3, ' ');
    match (parts.next(), parts.next()) {
        (Some(m), Some(p)) => (m, p),
        _ => ("", r),
    }
}

fn digits(b: &[u8]) -> Option<u64> {
    if b.is_empty() {
        return None;
    }
    let mut v: u64 = 0;
    for &c in b {
        if !c.is_ascii_digit() {
            return None;
        }
        v = v * 10 + u64::from(c - b'0');
    }
    Some(v)
}

fn month(m: &[u8]) -> Option<u32> {
    const NAMES: [&[u8; 3]; 12] = [
        b"Jan", b"Feb", b"Mar", b"Apr", b"May", b"Jun", b"Jul", b"Aug", b"Sep", b"Oct", b"Nov",
        b"Dec",
    ];
    NAMES.iter().position(|n| n[..] == *m).map(|i| i as u32 + 1)
}

/// Microseconds since the epoch of a civil date and time in UTC, offset by `offset_s`.
fn epoch_us(
    (y, mo, d): (i64, u32, u32),
    (h, mi, s): (u64, u64, u64),
    frac_us: u64,
    offset_s: i64,
) -> Option<u64> {
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || s > 60 {
        return None;
    }
    let days = days_from_civil(y, mo, d);
    let secs = days * 86_400 + (h * 3600 + mi * 60 + s) as i64 - offset_s;
    u64::try_from(secs).ok().map(|s| s * 1_000_000 + frac_us)
}

/// `10/Oct/2000:13:55:36 -0700`.
fn clf_time(t: &str) -> Option<u64> {
    let b = t.as_bytes();
    if b.len() != 26 || b[2] != b'/' || b[6] != b'/' || b[11] != b':' || b[20] != b' ' {
        return None;
    }
    let sign = match b[21] {
        b'+' => 1,
        b'-' => -1,
        _ => return None,
    };
    let off = digits(&b[22..24])? * 3600 + digits(&b[24..26])? * 60;
    epoch_us(
        (
            digits(&b[7..11])? as i64,
            month(&b[3..6])?,
            digits(&b[0..2])? as u32,
        ),
        (
            digits(&b[12..14])?,
            digits(&b[15..17])?,
            digits(&b[18..20])?,
        ),
        0,
        sign * off as i64,
    )
}

/// RFC 3339: `2016-04-15T20:17:00.310Z`, `2016-04-15T20:17:00+02:00`.
pub(crate) fn rfc3339(t: &str) -> Option<u64> {
    let b = t.as_bytes();
    if b.len() < 20
        || b[4] != b'-'
        || b[7] != b'-'
        || !matches!(b[10], b'T' | b't' | b' ')
        || b[13] != b':'
        || b[16] != b':'
    {
        return None;
    }
    let mut i = 19;
    let mut frac_us = 0;
    if b[i] == b'.' {
        let start = i + 1;
        i = start;
        while i < b.len() && b[i].is_ascii_digit() {
            i += 1;
        }
        let f = &b[start..i.min(start + 6)];
        frac_us = digits(f)? * 10u64.pow(6 - f.len() as u32);
    }
    let offset = match &b[i..] {
        [b'Z' | b'z'] => 0,
        [sign @ (b'+' | b'-'), h1, h2, b':', m1, m2] => {
            let off = (digits(&[*h1, *h2])? * 3600 + digits(&[*m1, *m2])? * 60) as i64;
            if *sign == b'-' {
                -off
            } else {
                off
            }
        }
        _ => return None,
    };
    epoch_us(
        (
            digits(&b[0..4])? as i64,
            digits(&b[5..7])? as u32,
            digits(&b[8..10])? as u32,
        ),
        (
            digits(&b[11..13])?,
            digits(&b[14..16])?,
            digits(&b[17..19])?,
        ),
        frac_us,
        offset,
    )
}

/// `IP IDENT USER [TIME] "REQUEST" STATUS BYTES ["REFERER" "USER-AGENT"]`.
fn combined(line: &str) -> Result<Record<'_>, String> {
    let (ip, rest) = split_at_byte(line, b' ').ok_or("no client address")?;
    let (_, rest) = split_at_byte(rest, b'[').ok_or("no [time]")?;
    let (time, rest) = split_at_byte(rest, b']').ok_or("no ] after the time")?;
    let t_us =
        clf_time(time).ok_or_else(|| format!("time '{time}' is not dd/Mon/yyyy:HH:MM:SS +zzzz"))?;
    let (request, rest) = quoted(rest).ok_or("no quoted request line")?;
    let mut r = Record::new(t_us);
    r.ip = ip;
    (r.method, r.path) = request_line(request);
    // Status and size, then the optional referer and user agent.
    let mut rest = rest.trim_start_matches(' ');
    for _ in 0..2 {
        rest = split_at_byte(rest, b' ').map_or("", |(_, r)| r);
    }
    if let Some((referer, rest)) = quoted(rest) {
        r.push_header("referer", referer);
        if let Some((agent, _)) = quoted(rest) {
            r.push_header("user-agent", agent);
        }
    }
    Ok(r)
}

/// `[START] "METHOD PATH PROTO" CODE FLAGS RECEIVED SENT DURATION UPSTREAM_TIME "XFF" "UA"
/// "REQUEST_ID" "AUTHORITY" "UPSTREAM_HOST"`: the client is the first address of
/// `X-Forwarded-For`, the only one the default format holds.
fn envoy(line: &str) -> Result<Record<'_>, String> {
    let rest = line.strip_prefix('[').ok_or("no [time]")?;
    let (time, rest) = split_at_byte(rest, b']').ok_or("no ] after the time")?;
    let t_us = rfc3339(time).ok_or_else(|| format!("time '{time}' is not RFC 3339"))?;
    let (request, rest) = quoted(rest).ok_or("no quoted request line")?;
    let mut r = Record::new(t_us);
    (r.method, r.path) = request_line(request);
    let mut rest = rest.trim_start_matches(' ');
    for _ in 0..6 {
        rest = split_at_byte(rest, b' ')
            .map(|(_, r)| r)
            .ok_or("fewer than 6 fields after the request line")?;
    }
    let (xff, rest) = quoted(rest).ok_or("no quoted X-Forwarded-For")?;
    r.ip = xff.split(',').next().unwrap_or("").trim();
    r.push_header("x-forwarded-for", xff);
    if let Some((agent, rest)) = quoted(rest) {
        r.push_header("user-agent", agent);
        if let Some((id, rest)) = quoted(rest) {
            r.push_header("x-request-id", id);
            if let Some((authority, _)) = quoted(rest) {
                if authority != "-" {
                    r.host = authority;
                }
            }
        }
    }
    Ok(r)
}

/// A JSON time: seconds since the epoch (a number, fractions allowed; a number too large to be
/// seconds is read as milliseconds, then microseconds), or an RFC 3339 string (or a number in
/// a string).
fn json_time(text: &str, is_string: bool) -> Option<u64> {
    if is_string {
        if let Some(t) = rfc3339(text) {
            return Some(t);
        }
    }
    let f: f64 = text.parse().ok()?;
    if !f.is_finite() || f < 0.0 {
        return None;
    }
    Some(if f < 1e11 {
        (f * 1e6).round() as u64
    } else if f < 1e14 {
        (f * 1e3).round() as u64
    } else {
        f as u64
    })
}

fn json<'a>(line: &str, f: &JsonFields, s: &'a mut Found) -> Result<Record<'a>, String> {
    scan(line, &f.wanted, f.client.len(), s)?;
    if !s.has_time {
        return Err(format!("no time field '{}'", f.time.join(".")));
    }
    let t_us = json_time(&s.time, s.time_is_string)
        .ok_or_else(|| format!("time '{}' is neither epoch seconds nor RFC 3339", s.time))?;
    let mut r = Record::new(t_us);
    r.ip = s
        .clients
        .iter()
        .find(|c| !c.is_empty())
        .map_or("", String::as_str);
    r.method = &s.method;
    r.path = &s.path;
    r.host = &s.host;
    for (n, v) in &s.headers[..s.headers_len] {
        r.push_header(n, v);
    }
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caddy_fields() -> JsonFields {
        JsonFields::new(
            "ts",
            "request.client_ip,request.remote_ip",
            "request.uri",
            "request.method",
            "request.host",
            "request.headers",
        )
    }

    #[test]
    fn reads_combined() {
        let mut p = Parser::new(Format::Combined, caddy_fields());
        let line = r#"203.0.113.9 - frank [10/Oct/2000:13:55:36 -0700] "GET /a?b=1 HTTP/1.1" 200 2326 "http://x/\"q" "curl/8.0""#;
        let r = p.parse(line).unwrap().unwrap();
        assert_eq!(r.ip, "203.0.113.9");
        assert_eq!((r.method, r.path), ("GET", "/a?b=1"));
        assert_eq!(r.t_us, 971_211_336_000_000);
        assert_eq!(r.header("User-Agent"), Some("curl/8.0"));
        assert_eq!(r.header("referer"), Some(r#"http://x/\"q"#));
        assert!(p.parse("garbage").is_err());
        assert!(p
            .parse(r#"1.2.3.4 - - [10/Oct/2000:13:55:36] "GET / HTTP/1.1" 200 1"#)
            .is_err());
    }

    #[test]
    fn reads_envoy() {
        let mut p = Parser::new(Format::Envoy, caddy_fields());
        let line = r#"[2016-04-15T20:17:00.310Z] "POST /api/v1/locations HTTP/2" 204 - 154 0 226 100 "10.0.35.28, 10.0.0.1" "nsq2http" "cc21d9b0" "locations" "tcp://10.0.2.1:80""#;
        let r = p.parse(line).unwrap().unwrap();
        assert_eq!(r.ip, "10.0.35.28");
        assert_eq!(r.host, "locations");
        assert_eq!(r.t_us, 1_460_751_420_310_000);
        assert_eq!(r.header("user-agent"), Some("nsq2http"));
    }

    #[test]
    fn reads_caddy_json() {
        let mut p = Parser::new(Format::Json, caddy_fields());
        let line = r#"{"level":"info","ts":1646861401.5,"logger":"http.log.access","msg":"handled request","request":{"remote_ip":"127.0.0.1","client_ip":"","proto":"HTTP/2.0","method":"GET","host":"localhost","uri":"/x","headers":{"X-Api-Key":["k1"]}},"status":200}"#;
        let r = p.parse(line).unwrap().unwrap();
        assert_eq!(r.ip, "127.0.0.1");
        assert_eq!(r.t_us, 1_646_861_401_500_000);
        assert_eq!(r.header("x-api-key"), Some("k1"));
        assert!(p.parse(r#"{"request":{}}"#).unwrap_err().contains("ts"));
        // Escapes, values of every kind skipped, client_ip present wins, a header as a string.
        let line = r#"{"skip":[1,{"a":"}"},null,true],"ts":"2026-01-01T00:00:01.5Z","request":{"client_ip":"10.0.0.\u0031","remote_ip":"x","uri":"/a\"b","headers":{"K":"v","L":[]}},"n":-1.5e3}"#;
        let r = p.parse(line).unwrap().unwrap();
        assert_eq!(r.ip, "10.0.0.1");
        assert_eq!(r.path, "/a\"b");
        assert_eq!(r.t_us, 1_767_225_601_500_000);
        assert_eq!(r.header("k"), Some("v"));
        for bad in [
            r#"{"ts":1"#,
            r#"{"ts":1}x"#,
            r#"{"ts" 1}"#,
            r#"["ts"]"#,
            r#"{"ts":"\q"}"#,
        ] {
            assert!(p.parse(bad).unwrap_err().starts_with("not JSON"), "{bad}");
        }
        assert!(p
            .parse(r#"{"ts":"yesterday"}"#)
            .unwrap_err()
            .contains("time"));
    }

    #[test]
    fn detects_formats() {
        assert_eq!(Format::detect("{\"ts\":1}"), Format::Json);
        assert_eq!(
            Format::detect("[2016-04-15T20:17:00.310Z] \"GET"),
            Format::Envoy
        );
        assert_eq!(Format::detect("1500,api,user=a,1"), Format::Csv);
        assert_eq!(
            Format::detect("1.2.3.4 - - [10/Oct/2000:13:55:36 -0700] \"GET"),
            Format::Combined
        );
        assert_eq!(
            rfc3339("2016-04-15T22:17:00+02:00"),
            rfc3339("2016-04-15T20:17:00Z")
        );
    }
}
