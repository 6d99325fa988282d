//! The katcp server: the standard requests, the program's [`Handler`], and the bounded
//! client loop ([`Limits`]).

use std::io::{self, BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::sensors::now;
use super::{Kind, Limits, Message, ParseError, Sensors};

/// A program's own requests.
pub trait Handler: Send + Sync {
    /// (name, one-line description) of each request the handler serves.
    fn requests(&self) -> Vec<(&'static str, &'static str)>;
    /// Serve `name`; `None` if it is not one of ours. `Err` becomes a `fail` reply.
    fn handle(&self, name: &str, args: &[String]) -> Option<Result<Vec<String>, String>>;
}

const STANDARD: [(&str, &str); 5] = [
    ("help", "List requests, or describe one: ?help [name]"),
    ("watchdog", "Check that the server is alive"),
    ("version-list", "List software versions"),
    ("sensor-list", "List sensors: ?sensor-list [name]"),
    ("sensor-value", "Read sensors: ?sensor-value [name]"),
];

/// Answer one message; returns the lines to send.
pub fn respond(
    msg: &Message,
    sensors: &Sensors,
    handler: &dyn Handler,
    program: &str,
) -> Vec<Message> {
    let reply = |args: Vec<String>| Message::new(Kind::Reply, &msg.name, msg.mid, args);
    let inform = |args: Vec<String>| Message::new(Kind::Inform, &msg.name, msg.mid, args);
    let ok = |mut rest: Vec<String>| {
        rest.insert(0, "ok".into());
        reply(rest)
    };
    let fail = |why: String| reply(vec!["fail".into(), why]);
    if msg.kind != Kind::Request {
        return vec![];
    }
    let arg0 = msg.args.first().map(String::as_str);
    match msg.name.as_str() {
        "help" => {
            let mut all: Vec<(&str, &str)> = STANDARD.to_vec();
            all.extend(handler.requests());
            let chosen: Vec<_> = all
                .into_iter()
                .filter(|(n, _)| arg0.is_none_or(|a| a == *n))
                .collect();
            if chosen.is_empty() {
                return vec![fail(format!(
                    "unknown request {:?}",
                    arg0.unwrap_or_default()
                ))];
            }
            let mut out: Vec<Message> = chosen
                .iter()
                .map(|(n, d)| inform(vec![n.to_string(), d.to_string()]))
                .collect();
            out.push(ok(vec![chosen.len().to_string()]));
            out
        }
        "watchdog" => vec![ok(vec![])],
        "version-list" => vec![
            inform(vec!["katcp-protocol".into(), "5.1-MIB".into()]),
            inform(vec![program.into(), env!("CARGO_PKG_VERSION").into()]),
            ok(vec!["2".into()]),
        ],
        "sensor-list" | "sensor-value" => {
            let found = sensors.matching(arg0);
            if found.is_empty() && arg0.is_some() {
                return vec![fail(format!(
                    "unknown sensor {:?}",
                    arg0.unwrap_or_default()
                ))];
            }
            let mut out: Vec<Message> = found
                .iter()
                .map(|(n, s)| {
                    if msg.name == "sensor-list" {
                        inform(vec![
                            n.clone(),
                            s.description.clone(),
                            s.units.clone(),
                            s.kind.into(),
                        ])
                    } else {
                        inform(vec![
                            format!("{:.6}", s.timestamp),
                            "1".into(),
                            n.clone(),
                            s.status.as_str().into(),
                            s.value.clone(),
                        ])
                    }
                })
                .collect();
            out.push(ok(vec![found.len().to_string()]));
            out
        }
        name => match handler.handle(name, &msg.args) {
            Some(Ok(args)) => vec![ok(args)],
            Some(Err(why)) => vec![fail(why)],
            None => vec![reply(vec![
                "invalid".into(),
                format!("Unknown request {name}."),
            ])],
        },
    }
}

/// One line as read from a client.
#[derive(Debug, PartialEq, Eq)]
enum LineRead {
    /// A complete line (terminator removed) is in the buffer.
    Line,
    /// The line was longer than the limit; the buffer holds its first bytes, the rest was
    /// discarded up to and including its newline.
    TooLong,
    /// The client closed the connection (a partial last line is dropped).
    Eof,
}

/// Bytes of an over-long line kept to name the request in the `fail` reply.
const HEAD_KEPT: usize = 128;

/// Read one `\n`-terminated line of at most `max` bytes into `line`. Never holds more than
/// `max` bytes, and never returns the tail of a long line as a line of its own.
fn read_line(r: &mut impl BufRead, line: &mut Vec<u8>, max: usize) -> io::Result<LineRead> {
    line.clear();
    let mut too_long = false;
    loop {
        let buf = r.fill_buf()?;
        if buf.is_empty() {
            return Ok(LineRead::Eof);
        }
        let (chunk, done) = match buf.iter().position(|&c| c == b'\n') {
            Some(i) => (&buf[..i], i + 1),
            None => (buf, buf.len()),
        };
        if !too_long && line.len() + chunk.len() > max {
            too_long = true;
            let keep = HEAD_KEPT.saturating_sub(line.len()).min(chunk.len());
            line.extend_from_slice(&chunk[..keep]);
            line.truncate(HEAD_KEPT);
        } else if !too_long {
            line.extend_from_slice(chunk);
        }
        let ended = done > chunk.len();
        r.consume(done);
        if ended {
            return Ok(if too_long {
                LineRead::TooLong
            } else {
                LineRead::Line
            });
        }
    }
}

fn log_inform(level: &str, text: String) -> Message {
    Message::new(
        Kind::Inform,
        "log",
        None,
        vec![level.into(), format!("{:.6}", now()), "katcp".into(), text],
    )
}

/// The reply to a request refused whole: a `fail` to the request its head names, so that the
/// client is not left waiting for a reply, or a `#log` if the head names none.
fn refuse(head: &[u8], why: String) -> Vec<Message> {
    let head = &head[..head.len().min(HEAD_KEPT)];
    let first = head
        .split(|&c| c == b' ' || c == b'\t')
        .next()
        .unwrap_or(&[]);
    match Message::parse_bounded(first, 0) {
        Ok(m) if m.kind == Kind::Request => vec![Message::new(
            Kind::Reply,
            &m.name,
            m.mid,
            vec!["fail".into(), why],
        )],
        _ => vec![log_inform("warn", why)],
    }
}

/// Answer one request line (terminator removed): parse it with `limits.max_args` and
/// dispatch it. What the server does with every complete line; public for the fuzz target.
pub fn answer_line(
    line: &[u8],
    sensors: &Sensors,
    handler: &dyn Handler,
    program: &str,
    limits: &Limits,
) -> Vec<Message> {
    let mut line = line;
    while let [rest @ .., b'\r'] = line {
        line = rest;
    }
    if line.iter().all(u8::is_ascii_whitespace) {
        return vec![];
    }
    match Message::parse_bounded(line, limits.max_args) {
        Ok(m) => respond(&m, sensors, handler, program),
        Err(ParseError::TooManyArgs(n)) => refuse(line, format!("more than {n} arguments refused")),
        Err(e) => {
            tracing::warn!(error = %e, "malformed katcp message");
            vec![log_inform("warn", format!("malformed message: {e}"))]
        }
    }
}

fn serve_client(
    stream: TcpStream,
    sensors: Arc<Sensors>,
    handler: Arc<dyn Handler>,
    program: String,
    limits: Limits,
) -> io::Result<()> {
    stream.set_read_timeout(Some(limits.idle_timeout))?;
    stream.set_write_timeout(Some(limits.write_timeout))?;
    let mut w = stream.try_clone()?;
    for args in [
        vec!["katcp-protocol".into(), "5.1-MIB".into()],
        vec![program.clone(), env!("CARGO_PKG_VERSION").into()],
    ] {
        w.write_all(
            Message::new(Kind::Inform, "version-connect", None, args)
                .to_line()
                .as_bytes(),
        )?;
    }
    let mut r = BufReader::new(stream);
    let mut line = Vec::new();
    loop {
        let out = match read_line(&mut r, &mut line, limits.max_line)? {
            LineRead::Eof => return Ok(()),
            LineRead::TooLong => {
                tracing::warn!(limit = limits.max_line, "over-long katcp line refused");
                refuse(
                    &line,
                    format!("request longer than {} bytes refused", limits.max_line),
                )
            }
            LineRead::Line => answer_line(&line, &sensors, handler.as_ref(), &program, &limits),
        };
        for m in out {
            w.write_all(m.to_line().as_bytes())?;
        }
    }
}

/// A place among the `max_connections` clients; given back when the client's thread ends.
struct Place(Arc<AtomicUsize>);

impl Drop for Place {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Start the server on `addr` (port 0 picks one) with the default [`Limits`]; returns the
/// bound address.
pub fn serve(
    addr: SocketAddr,
    sensors: Arc<Sensors>,
    handler: Arc<dyn Handler>,
    program: &str,
) -> io::Result<SocketAddr> {
    serve_with(addr, sensors, handler, program, Limits::default())
}

/// Start the server on `addr` with explicit `limits`; returns the bound address.
pub fn serve_with(
    addr: SocketAddr,
    sensors: Arc<Sensors>,
    handler: Arc<dyn Handler>,
    program: &str,
    limits: Limits,
) -> io::Result<SocketAddr> {
    let listener = TcpListener::bind(addr)?;
    let local = listener.local_addr()?;
    let program = program.to_string();
    let active = Arc::new(AtomicUsize::new(0));
    std::thread::Builder::new()
        .name("katcp".into())
        .spawn(move || {
            for conn in listener.incoming() {
                let Ok(mut stream) = conn else { continue };
                if active.fetch_add(1, Ordering::AcqRel) >= limits.max_connections {
                    active.fetch_sub(1, Ordering::AcqRel);
                    tracing::warn!(limit = limits.max_connections, "katcp client refused");
                    let why = format!("too many clients (limit {})", limits.max_connections);
                    // A fresh socket's send buffer takes one short line without blocking; the
                    // timeout covers the impossible case anyway.
                    let _ = stream.set_write_timeout(Some(Duration::from_secs(1)));
                    let _ = stream.write_all(log_inform("error", why).to_line().as_bytes());
                    continue;
                }
                let place = Place(Arc::clone(&active));
                let (s, h, p) = (Arc::clone(&sensors), Arc::clone(&handler), program.clone());
                let spawned = std::thread::Builder::new()
                    .name("katcp-client".into())
                    .spawn(move || {
                        let _place = place;
                        if let Err(e) = serve_client(stream, s, h, p, limits) {
                            tracing::debug!(error = %e, "katcp client gone");
                        }
                    });
                if let Err(e) = spawned {
                    tracing::warn!(error = %e, "no thread for a katcp client");
                }
            }
        })?;
    Ok(local)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::katcp::{Message, Sensors};

    struct Echo;
    impl Handler for Echo {
        fn requests(&self) -> Vec<(&'static str, &'static str)> {
            vec![("echo", "Echo arguments")]
        }
        fn handle(&self, name: &str, args: &[String]) -> Option<Result<Vec<String>, String>> {
            (name == "echo").then(|| {
                if args.is_empty() {
                    Err("nothing to echo".into())
                } else {
                    Ok(args.to_vec())
                }
            })
        }
    }

    #[test]
    fn standard_and_program_requests() {
        let s = Sensors::default();
        s.add("period", "Pattern length", "samples", "integer", 8192);
        let r = |line: &str| {
            respond(&Message::parse(line.as_bytes()).unwrap(), &s, &Echo, "test")
                .iter()
                .map(Message::to_line)
                .collect::<String>()
        };
        assert_eq!(r("?echo[3] a b"), "!echo[3] ok a b\n");
        assert_eq!(r("?echo"), "!echo fail nothing\\_to\\_echo\n");
        assert_eq!(r("?nope"), "!nope invalid Unknown\\_request\\_nope.\n");
        assert!(r("?sensor-list").ends_with("!sensor-list ok 1\n"));
        assert!(r("?sensor-value period").contains("period nominal 8192\n"));
        assert!(r("?sensor-value bogus").starts_with("!sensor-value fail"));
        assert!(r("?help").ends_with("!help ok 6\n"));
        assert_eq!(r("!echo ok"), "");
    }
}
