//! The `simulate` trace format (a contract: scripts and tests rely on it): parsing input lines and
//! formatting output rows.

use tollgate_core::limiter::Descriptor;

/// One input line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub t_ms: u64,
    pub domain: String,
    /// The descriptor as written, echoed in the output.
    pub raw_descriptor: String,
    pub descriptor: Descriptor,
    pub hits: u64,
}

/// Parse one line; `Ok(None)` for blank and comment lines. Errors say what is wrong.
pub fn parse_line(line: &str) -> Result<Option<Event>, String> {
    let line = match line.find('#') {
        Some(i) => &line[..i],
        None => line,
    }
    .trim();
    if line.is_empty() {
        return Ok(None);
    }
    let fields: Vec<&str> = line.split(',').map(str::trim).collect();
    let [t, domain, descriptor, hits] = fields[..] else {
        return Err(format!(
            "expected 4 fields t_ms,domain,descriptor,hits, found {}",
            fields.len()
        ));
    };
    let t_ms = t
        .parse()
        .map_err(|_| format!("t_ms '{t}' is not a whole number of milliseconds"))?;
    if domain.is_empty() {
        return Err("domain is empty".into());
    }
    let hits = hits
        .parse()
        .map_err(|_| format!("hits '{hits}' is not a whole number"))?;
    let mut entries = Vec::new();
    for pair in descriptor.split(';') {
        let Some((k, v)) = pair.split_once('=') else {
            return Err(format!("descriptor entry '{pair}' is not key=value"));
        };
        if k.is_empty() {
            return Err(format!("descriptor entry '{pair}' has an empty key"));
        }
        entries.push((k.to_string(), v.to_string()));
    }
    Ok(Some(Event {
        t_ms,
        domain: domain.to_string(),
        raw_descriptor: descriptor.to_string(),
        descriptor: Descriptor {
            entries,
            hits: None,
            limit: None,
        },
        hits,
    }))
}

/// The output header.
pub const HEADER: &str =
    "t_ms,domain,descriptor,hits,allowed,remaining,retry_after_ms,reset_after_ms,delay_ms";

/// Microseconds to whole milliseconds, rounded up (waiting that long is always enough).
pub fn ms(us: u64) -> u64 {
    us.div_ceil(1000)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_lines() {
        assert_eq!(parse_line("  # note").unwrap(), None);
        assert_eq!(parse_line("").unwrap(), None);
        let e = parse_line("1500,api,user=alice;path=/x,2 # trailing")
            .unwrap()
            .unwrap();
        assert_eq!(e.t_ms, 1500);
        assert_eq!(e.hits, 2);
        assert_eq!(e.descriptor.entries.len(), 2);
        assert_eq!(e.raw_descriptor, "user=alice;path=/x");
    }

    #[test]
    fn rejects_bad_lines() {
        assert!(parse_line("1,api,user=a").unwrap_err().contains("4 fields"));
        assert!(parse_line("x,api,user=a,1").unwrap_err().contains("t_ms"));
        assert!(parse_line("1,api,user,1")
            .unwrap_err()
            .contains("key=value"));
        assert!(parse_line("1,api,user=a,-1").unwrap_err().contains("hits"));
        assert!(parse_line("1,,user=a,1").unwrap_err().contains("domain"));
    }

    #[test]
    fn ms_rounds_up() {
        assert_eq!(ms(0), 0);
        assert_eq!(ms(1), 1);
        assert_eq!(ms(1000), 1);
        assert_eq!(ms(1001), 2);
    }
}
