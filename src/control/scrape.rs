//! Reading another engine's Prometheus metrics (`cbf array status`): one `GET /metrics` over
//! HTTP/1.0 and the text exposition format (version 0.0.4) parsed into samples. Only what the
//! engines' own servers ([`super::metrics`]) write needs to be understood: `name{labels} value`
//! lines, `#` comments; a line that does not parse is skipped.
//!
//! Bounded: connect, send and the whole reply within one timeout, at most [`MAX_BODY`] bytes.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

/// Largest reply read (an engine's metrics are a few KiB).
pub const MAX_BODY: u64 = 4 << 20;

/// One sample: `name{labels} value`.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: Vec<(String, String)>,
    pub value: f64,
}

/// Parse the text format; lines that do not parse are skipped.
pub fn parse(text: &str) -> Vec<Sample> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .filter_map(parse_line)
        .collect()
}

fn parse_line(line: &str) -> Option<Sample> {
    let (head, rest) = match line.find('{') {
        Some(i) => {
            let close = line[i..].find('}')? + i;
            (&line[..close + 1], &line[close + 1..])
        }
        None => line.split_at(line.find(char::is_whitespace)?),
    };
    // A timestamp may follow the value.
    let value: f64 = rest.split_whitespace().next()?.parse().ok()?;
    let (name, labels) = match head.split_once('{') {
        Some((n, l)) => (n, parse_labels(l.strip_suffix('}')?)?),
        None => (head, vec![]),
    };
    let valid = !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':');
    valid.then(|| Sample {
        name: name.to_string(),
        labels,
        value,
    })
}

/// `a="x",b="y"` (values with `\"`, `\\` and `\n` escapes).
fn parse_labels(text: &str) -> Option<Vec<(String, String)>> {
    let mut out = Vec::new();
    let mut rest = text.trim();
    while !rest.is_empty() {
        let (key, after) = rest.split_once('=')?;
        let mut chars = after.strip_prefix('"')?.char_indices();
        let mut value = String::new();
        let end = loop {
            match chars.next()? {
                (i, '"') => break i,
                (_, '\\') => value.push(match chars.next()?.1 {
                    'n' => '\n',
                    c => c,
                }),
                (_, c) => value.push(c),
            }
        };
        out.push((key.trim().to_string(), value));
        rest = after[1 + end + 1..].trim_start();
        rest = rest.strip_prefix(',').unwrap_or(rest).trim_start();
    }
    Some(out)
}

/// `GET /metrics` from `addr` within `timeout`; the samples.
pub fn scrape(addr: SocketAddr, timeout: Duration) -> std::io::Result<Vec<Sample>> {
    let deadline = Instant::now() + timeout;
    let mut s = TcpStream::connect_timeout(&addr, timeout)?;
    s.set_write_timeout(Some(timeout))?;
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: cbf\r\nConnection: close\r\n\r\n")?;
    let mut body = Vec::new();
    let mut buf = [0u8; 16384];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("no whole reply within {timeout:?}"),
            ));
        }
        s.set_read_timeout(Some(left))?;
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) if body.len() as u64 + n as u64 > MAX_BODY => {
                return Err(std::io::Error::other(format!(
                    "a reply over {MAX_BODY} bytes"
                )))
            }
            Ok(n) => body.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    let text = String::from_utf8_lossy(&body);
    let (head, payload) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| std::io::Error::other("not an HTTP reply"))?;
    if head.split_whitespace().nth(1) != Some("200") {
        let status = head.lines().next().unwrap_or_default().to_string();
        return Err(std::io::Error::other(status));
    }
    Ok(parse(payload))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_text_format() {
        let s = parse(
            "# HELP fgpu_output_heaps_total Heaps sent\n\
             # TYPE fgpu_output_heaps_total counter\n\
             fgpu_output_heaps_total{stream=\"wide\"} 12\n\
             fgpu_input_heaps_total{pol=\"0\",x=\"a \\\"b\\\", c\"} 3 1700000000\n\
             dsim_output_heaps_total 5e3\n\
             broken{ 1\n\
             nonumber{a=\"b\"} x\n",
        );
        assert_eq!(s.len(), 3, "{s:?}");
        assert_eq!(s[0].name, "fgpu_output_heaps_total");
        assert_eq!(s[0].labels, [("stream".to_string(), "wide".to_string())]);
        assert_eq!(s[0].value, 12.0);
        assert_eq!(
            s[1].labels,
            [
                ("pol".to_string(), "0".to_string()),
                ("x".to_string(), "a \"b\", c".to_string())
            ]
        );
        assert_eq!(s[2].value, 5000.0);
    }

    #[test]
    fn reads_an_engine_server() {
        let m = crate::engine::metrics::Metrics::new(
            "xbgpu",
            &[("output_x_heaps", "X heaps sent", &["stream"])],
        )
        .unwrap();
        m.set("output_x_heaps", &["bl"], 7);
        let addr =
            crate::control::metrics::serve("127.0.0.1:0".parse().unwrap(), m.registry.clone())
                .unwrap();
        let s = scrape(addr, Duration::from_secs(5)).unwrap();
        let x = s
            .iter()
            .find(|s| s.name == "xbgpu_output_x_heaps_total")
            .unwrap();
        assert_eq!(x.value, 7.0);
        assert_eq!(x.labels, [("stream".to_string(), "bl".to_string())]);
    }
}
