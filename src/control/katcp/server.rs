//! The katcp server: one thread accepting connections and, per client, one thread reading
//! its requests and one sending its sampled sensors; every client bounded by [`Limits`].

use std::collections::BTreeMap;
use std::io::{self, BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::sensors::now;
use super::session::Session;
use super::standard::versions;
use super::{Handler, Kind, Limits, Message, ParseError, Sensors};

/// A katcp device: the sensors it reports, the program's own requests, and the standard ones.
pub struct Server {
    pub(super) sensors: Arc<Sensors>,
    pub(super) handler: Arc<dyn Handler>,
    pub(super) program: String,
    limits: Limits,
    /// Connected clients' addresses, by connection number.
    clients: Mutex<BTreeMap<u64, String>>,
    next_client: AtomicU64,
    /// What `?halt` does (nothing is offered without it).
    pub(super) halt: Option<Box<dyn Fn() + Send + Sync>>,
}

impl Server {
    /// A server for `program` with the default [`Limits`] and no `?halt`.
    pub fn new(sensors: Arc<Sensors>, handler: Arc<dyn Handler>, program: &str) -> Server {
        Server {
            sensors,
            handler,
            program: program.to_string(),
            limits: Limits::default(),
            clients: Mutex::new(BTreeMap::new()),
            next_client: AtomicU64::new(0),
            halt: None,
        }
    }

    pub fn with_limits(mut self, limits: Limits) -> Server {
        self.limits = limits;
        self
    }

    /// `?halt` calls `halt` (a clean stop of the program) and replies `ok`.
    pub fn with_halt(mut self, halt: impl Fn() + Send + Sync + 'static) -> Server {
        self.halt = Some(Box::new(halt));
        self
    }

    /// Addresses of the connected clients.
    pub(super) fn clients(&self) -> Vec<String> {
        self.lock_clients().values().cloned().collect()
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

impl Server {
    /// Answer one request line (terminator removed) from `session`'s client: parse it with
    /// the limit on arguments and dispatch it. What the server does with every complete
    /// line; public for the fuzz target.
    pub fn answer_line(&self, line: &[u8], session: &Session) -> Vec<Message> {
        let mut line = line;
        while let [rest @ .., b'\r'] = line {
            line = rest;
        }
        if line.iter().all(u8::is_ascii_whitespace) {
            return vec![];
        }
        match Message::parse_bounded(line, self.limits.max_args) {
            Ok(m) => self.respond(&m, session),
            Err(ParseError::TooManyArgs(n)) => {
                refuse(line, format!("more than {n} arguments refused"))
            }
            Err(e) => {
                tracing::warn!(error = %e, "malformed katcp message");
                vec![log_inform("warn", format!("malformed message: {e}"))]
            }
        }
    }

    /// Serve one client until it goes: the connect informs, then a reply to every line, with
    /// its sampled sensors sent by a second thread through the same (locked) writer.
    fn serve_client(self: &Arc<Self>, stream: TcpStream, session: &Arc<Session>) -> io::Result<()> {
        let limits = self.limits;
        stream.set_read_timeout(Some(limits.idle_timeout))?;
        stream.set_write_timeout(Some(limits.write_timeout))?;
        let writer = Arc::new(Mutex::new(stream.try_clone()?));
        let write = |messages: &[Message]| -> io::Result<()> {
            let text: String = messages.iter().map(Message::to_line).collect();
            writer
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .write_all(text.as_bytes())
        };
        let mut hello: Vec<Message> = versions(&self.program)
            .into_iter()
            .map(|args| Message::new(Kind::Inform, "version-connect", None, args))
            .collect();
        hello.push(Message::new(
            Kind::Inform,
            "build-state",
            None,
            vec![format!("{}-{}", self.program, env!("CARGO_PKG_VERSION"))],
        ));
        write(&hello)?;
        {
            let (session, sensors, writer) = (
                Arc::clone(session),
                Arc::clone(&self.sensors),
                Arc::clone(&writer),
            );
            std::thread::Builder::new()
                .name("katcp-sampling".into())
                .spawn(move || session.sample(sensors, writer))?;
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
                LineRead::Line => self.answer_line(&line, session),
            };
            write(&out)?;
        }
    }

    /// Start serving on `addr` (port 0 picks one); returns the bound address.
    pub fn serve(self, addr: SocketAddr) -> io::Result<SocketAddr> {
        let listener = TcpListener::bind(addr)?;
        let local = listener.local_addr()?;
        let server = Arc::new(self);
        let active = Arc::new(AtomicUsize::new(0));
        std::thread::Builder::new()
            .name("katcp".into())
            .spawn(move || {
                for conn in listener.incoming() {
                    let Ok(stream) = conn else { continue };
                    server.accept(stream, &active);
                }
            })?;
        Ok(local)
    }

    /// Take one new connection: refused past the connection cap, else served on its own
    /// thread, listed in `?client-list` while it lasts.
    fn accept(self: &Arc<Self>, mut stream: TcpStream, active: &Arc<AtomicUsize>) {
        let max = self.limits.max_connections;
        if active.fetch_add(1, Ordering::AcqRel) >= max {
            active.fetch_sub(1, Ordering::AcqRel);
            tracing::warn!(limit = max, "katcp client refused");
            let why = format!("too many clients (limit {max})");
            // A fresh socket's send buffer takes one short line without blocking; the
            // timeout covers the impossible case anyway.
            let _ = stream.set_write_timeout(Some(Duration::from_secs(1)));
            let _ = stream.write_all(log_inform("error", why).to_line().as_bytes());
            return;
        }
        let place = Place(Arc::clone(active));
        let peer = stream
            .peer_addr()
            .map_or_else(|_| "unknown".to_string(), |a| a.to_string());
        let id = self.next_client.fetch_add(1, Ordering::Relaxed);
        let server = Arc::clone(self);
        let spawned = std::thread::Builder::new()
            .name("katcp-client".into())
            .spawn(move || {
                let _place = place;
                let session = Arc::new(Session::new(peer.clone()));
                server.lock_clients().insert(id, peer);
                if let Err(e) = server.serve_client(stream, &session) {
                    tracing::debug!(error = %e, "katcp client gone");
                }
                session.close();
                server.lock_clients().remove(&id);
            });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "no thread for a katcp client");
        }
    }

    fn lock_clients(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, String>> {
        self.clients.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A place among the `max_connections` clients; given back when the client's thread ends.
struct Place(Arc<AtomicUsize>);

impl Drop for Place {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
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
        let s = Arc::new(Sensors::default());
        s.add("period", "Pattern length", "samples", "integer", 8192);
        s.add("name", "A string", "", "string", "x");
        let server = Server::new(s, Arc::new(Echo), "test");
        let session = Session::new("127.0.0.1:1".into());
        let r = |line: &str| {
            server
                .respond(&Message::parse(line.as_bytes()).unwrap(), &session)
                .iter()
                .map(Message::to_line)
                .collect::<String>()
        };
        assert_eq!(r("?echo[3] a b"), "!echo[3] ok a b\n");
        assert_eq!(r("?echo"), "!echo fail nothing\\_to\\_echo\n");
        assert_eq!(r("?nope"), "!nope invalid Unknown\\_request\\_nope.\n");
        assert!(r("?sensor-list").ends_with("!sensor-list ok 2\n"));
        assert!(r("?sensor-value period").contains("period nominal 8192\n"));
        assert!(r("?sensor-value bogus").starts_with("!sensor-value fail"));
        assert!(r("?help").ends_with("!help ok 10\n"));
        assert!(r("?version-list").contains("#version-list katcp-device test-"));
        assert_eq!(r("!echo ok"), "");
        // Sampling: the reading at once, then the strategy in force; refusals name why.
        let set = r("?sensor-sampling period,name event");
        assert!(set.starts_with("#sensor-status "), "{set}");
        assert!(set.contains(" 1 name nominal x\n"), "{set}");
        assert!(
            set.ends_with("!sensor-sampling ok period,name event\n"),
            "{set}"
        );
        assert_eq!(
            r("?sensor-sampling period"),
            "!sensor-sampling ok period event\n"
        );
        assert!(r("?sensor-sampling name differential 1").starts_with("!sensor-sampling fail"));
        assert!(r("?sensor-sampling period,period auto").contains("Duplicate"));
        assert!(r("?sensor-sampling nope auto").starts_with("!sensor-sampling fail"));
        assert_eq!(
            r("?sensor-sampling period none"),
            "!sensor-sampling ok period none\n"
        );
        assert_eq!(
            r("?sensor-sampling period"),
            "!sensor-sampling ok period none\n"
        );
        assert!(r("?halt").starts_with("!halt fail"));
        assert!(r("?log-level loud").starts_with("!log-level fail"));
    }
}
