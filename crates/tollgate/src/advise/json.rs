//! A JSON-lines reader that finds the configured fields without building a tree: one pass
//! over the line, descending only into the objects on a wanted path and skipping every other
//! value, writing what it finds into buffers reused from line to line (no allocation per line
//! once they have grown). Structural errors are reported; the content of skipped values is
//! only scanned, not validated.

/// Most headers one record carries (the rest are ignored).
pub(crate) const MAX_HEADERS: usize = 16;

/// What a wanted path fills.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Target {
    Time,
    /// The n-th `--client-field` alternative.
    Client(usize),
    Path,
    Method,
    Host,
    Headers,
}

/// The fields found in one line (buffers reused).
#[derive(Debug, Default)]
pub(crate) struct Found {
    pub time: String,
    pub time_is_string: bool,
    pub has_time: bool,
    pub clients: Vec<String>,
    pub path: String,
    pub method: String,
    pub host: String,
    /// `(name, value)` pairs, the first `headers_len` in use.
    pub headers: Vec<(String, String)>,
    pub headers_len: usize,
}

impl Found {
    fn clear(&mut self, clients: usize) {
        self.time.clear();
        self.has_time = false;
        self.time_is_string = false;
        self.clients.resize_with(clients, String::new);
        self.clients.iter_mut().for_each(String::clear);
        self.path.clear();
        self.method.clear();
        self.host.clear();
        self.headers_len = 0;
    }
}

/// Deepest object nesting read (deeper values are skipped as a whole).
const MAX_DEPTH: usize = 16;

/// Deepest nesting of arrays and objects a line may hold (as `serde_json`'s default): a
/// deeper line is malformed. The reader descends by recursion, so this bounds its stack
/// whatever the line.
pub(crate) const MAX_NESTING: usize = 128;

struct Scan<'a> {
    b: &'a [u8],
    i: usize,
    /// Arrays and objects open at `i`.
    depth: usize,
}

type R<T> = Result<T, String>;

impl Scan<'_> {
    fn ws(&mut self) {
        while self.i < self.b.len() && matches!(self.b[self.i], b' ' | b'\t' | b'\r' | b'\n') {
            self.i += 1;
        }
    }

    /// Into an array or object (at its opening bracket, which is consumed).
    fn open(&mut self) -> R<()> {
        if self.depth >= MAX_NESTING {
            return Err(format!(
                "not JSON: nested deeper than {MAX_NESTING} levels at byte {}",
                self.i + 1
            ));
        }
        self.depth += 1;
        self.i += 1;
        Ok(())
    }

    /// Out of an array or object (at its closing bracket, which is consumed).
    fn close(&mut self) {
        self.depth -= 1;
        self.i += 1;
    }

    fn peek(&mut self) -> Option<u8> {
        self.ws();
        self.b.get(self.i).copied()
    }

    /// After an object's member: `,` (more follow: false) or `}` (the object ends: true).
    fn object_ends(&mut self) -> R<bool> {
        match self.peek() {
            Some(b',') => {
                self.i += 1;
                Ok(false)
            }
            Some(b'}') => {
                self.i += 1;
                Ok(true)
            }
            _ => Err(format!(
                "not JSON: expected ',' or '}}' at byte {}",
                self.i + 1
            )),
        }
    }

    fn expect(&mut self, c: u8) -> R<()> {
        if self.peek() == Some(c) {
            self.i += 1;
            Ok(())
        } else {
            Err(format!(
                "not JSON: expected '{}' at byte {}",
                c as char,
                self.i + 1
            ))
        }
    }

    /// A string (at its opening quote), unescaped into `out` (cleared first) when given.
    fn string(&mut self, mut out: Option<&mut String>) -> R<()> {
        self.expect(b'"')?;
        if let Some(o) = out.as_deref_mut() {
            o.clear();
        }
        let start = self.i;
        let mut run = start;
        while self.i < self.b.len() {
            match self.b[self.i] {
                b'"' => {
                    if let Some(o) = out {
                        o.push_str(utf8(&self.b[run..self.i])?);
                    }
                    self.i += 1;
                    return Ok(());
                }
                b'\\' => {
                    if let Some(o) = out.as_deref_mut() {
                        o.push_str(utf8(&self.b[run..self.i])?);
                        let e = *self
                            .b
                            .get(self.i + 1)
                            .ok_or("not JSON: unterminated string")?;
                        let c = match e {
                            b'"' => '"',
                            b'\\' => '\\',
                            b'/' => '/',
                            b'b' => '\u{8}',
                            b'f' => '\u{c}',
                            b'n' => '\n',
                            b'r' => '\r',
                            b't' => '\t',
                            b'u' => {
                                let hex = self
                                    .b
                                    .get(self.i + 2..self.i + 6)
                                    .ok_or("not JSON: bad \\u escape")?;
                                let v = u32::from_str_radix(utf8(hex)?, 16)
                                    .map_err(|_| "not JSON: bad \\u escape")?;
                                self.i += 4;
                                // A surrogate half stands for itself as U+FFFD.
                                char::from_u32(v).unwrap_or('\u{fffd}')
                            }
                            _ => {
                                return Err(format!("not JSON: bad escape at byte {}", self.i + 1))
                            }
                        };
                        o.push(c);
                    }
                    self.i += 2;
                    run = self.i;
                }
                _ => self.i += 1,
            }
        }
        Err("not JSON: unterminated string".into())
    }

    /// A number, `true`, `false` or `null`: its text.
    fn scalar(&mut self) -> R<&str> {
        let start = self.i;
        while self.i < self.b.len()
            && !matches!(
                self.b[self.i],
                b',' | b'}' | b']' | b' ' | b'\t' | b'\r' | b'\n'
            )
        {
            self.i += 1;
        }
        if start == self.i {
            return Err(format!("not JSON: expected a value at byte {}", start + 1));
        }
        utf8(&self.b[start..self.i])
    }

    /// Skip one value of any kind.
    fn skip(&mut self) -> R<()> {
        match self.peek() {
            Some(b'"') => self.string(None),
            Some(open @ (b'{' | b'[')) => {
                let close = if open == b'{' { b'}' } else { b']' };
                self.open()?;
                if self.peek() == Some(close) {
                    self.close();
                    return Ok(());
                }
                loop {
                    if open == b'{' {
                        self.string(None)?;
                        self.expect(b':')?;
                    }
                    self.skip()?;
                    match self.peek() {
                        Some(b',') => self.i += 1,
                        Some(c) if c == close => {
                            self.close();
                            return Ok(());
                        }
                        _ => {
                            return Err(format!(
                                "not JSON: expected ',' or '{}' at byte {}",
                                close as char,
                                self.i + 1
                            ))
                        }
                    }
                }
            }
            Some(_) => self.scalar().map(|_| ()),
            None => Err("not JSON: unexpected end".into()),
        }
    }

    /// A value as text into `out`: a string unescaped, a scalar as written (null as nothing),
    /// an array's first element; an object is skipped.
    fn text(&mut self, out: &mut String) -> R<bool> {
        out.clear();
        match self.peek() {
            Some(b'"') => {
                self.string(Some(out))?;
                Ok(true)
            }
            Some(b'[') => {
                self.open()?;
                if self.peek() == Some(b']') {
                    self.close();
                    return Ok(false);
                }
                let is_string = self.text(out)?;
                while self.peek() == Some(b',') {
                    self.i += 1;
                    self.skip()?;
                }
                self.expect(b']')?;
                self.depth -= 1;
                Ok(is_string)
            }
            Some(b'{') => self.skip().map(|_| false),
            Some(_) => {
                let s = self.scalar()?;
                if s != "null" {
                    out.push_str(s);
                }
                Ok(false)
            }
            None => Err("not JSON: unexpected end".into()),
        }
    }

    /// The members of an object at `depth` whose key continues one of `wanted` (paths whose
    /// first `depth` segments led here).
    fn object(
        &mut self,
        depth: usize,
        wanted: &[(Vec<String>, Target)],
        live: u64,
        found: &mut Found,
    ) -> R<()> {
        self.expect(b'{')?;
        self.i -= 1;
        self.open()?;
        if self.peek() == Some(b'}') {
            self.close();
            return Ok(());
        }
        let mut key = String::new();
        loop {
            self.ws();
            let key_start = self.i;
            let b = self.b;
            self.string(None)?;
            let raw = &b[key_start + 1..self.i - 1];
            // Keys are compared as written, unescaped only when they hold an escape.
            let k: &str = if raw.contains(&b'\\') {
                self.i = key_start;
                self.string(Some(&mut key))?;
                &key
            } else {
                utf8(raw)?
            };
            let mut deeper = 0u64;
            let mut here = None;
            for (n, (path, target)) in wanted.iter().enumerate() {
                if live & (1 << n) != 0 && path.get(depth).is_some_and(|s| s == k) {
                    if path.len() == depth + 1 {
                        here = here.or(Some(*target));
                    } else {
                        deeper |= 1 << n;
                    }
                }
            }
            self.expect(b':')?;
            match here {
                Some(Target::Headers) if self.peek() == Some(b'{') => self.headers(found)?,
                Some(Target::Headers) => self.skip()?,
                Some(t) => {
                    let out = match t {
                        Target::Time => &mut found.time,
                        Target::Client(c) => &mut found.clients[c],
                        Target::Path => &mut found.path,
                        Target::Method => &mut found.method,
                        Target::Host | Target::Headers => &mut found.host,
                    };
                    let is_string = self.text(out)?;
                    if t == Target::Time {
                        found.has_time = !found.time.is_empty();
                        found.time_is_string = is_string;
                    }
                }
                None if deeper != 0 && depth + 1 < MAX_DEPTH && self.peek() == Some(b'{') => {
                    self.object(depth + 1, wanted, deeper, found)?
                }
                None => self.skip()?,
            }
            if self.object_ends()? {
                self.depth -= 1;
                return Ok(());
            }
        }
    }

    /// A headers object: each member's name and value (the first of a list).
    fn headers(&mut self, found: &mut Found) -> R<()> {
        self.expect(b'{')?;
        self.i -= 1;
        self.open()?;
        if self.peek() == Some(b'}') {
            self.close();
            return Ok(());
        }
        let mut name = String::new();
        let mut value = String::new();
        loop {
            self.string(Some(&mut name))?;
            self.expect(b':')?;
            self.text(&mut value)?;
            if found.headers_len < MAX_HEADERS {
                if found.headers.len() == found.headers_len {
                    found.headers.push(Default::default());
                }
                let slot = &mut found.headers[found.headers_len];
                slot.0.clear();
                slot.0.push_str(&name);
                slot.1.clear();
                slot.1.push_str(&value);
                found.headers_len += 1;
            }
            if self.object_ends()? {
                self.depth -= 1;
                return Ok(());
            }
        }
    }
}

fn utf8(b: &[u8]) -> R<&str> {
    std::str::from_utf8(b).map_err(|_| "not UTF-8".to_string())
}

/// Read `line` into `found`: the values at `wanted` (at most 64 paths).
pub(crate) fn scan(
    line: &str,
    wanted: &[(Vec<String>, Target)],
    clients: usize,
    found: &mut Found,
) -> R<()> {
    found.clear(clients);
    let mut s = Scan {
        b: line.as_bytes(),
        i: 0,
        depth: 0,
    };
    let live = if wanted.len() >= 64 {
        u64::MAX
    } else {
        (1u64 << wanted.len()) - 1
    };
    s.object(0, wanted, live, found)?;
    if s.peek().is_some() {
        return Err(format!("not JSON: trailing characters at byte {}", s.i + 1));
    }
    Ok(())
}
