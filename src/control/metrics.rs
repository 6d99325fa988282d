//! Prometheus metrics over HTTP (`GET /metrics`), with katgpucbf's metric names (facts §1.8).
//!
//! The `prometheus` crate keeps the registry and writes the text format; the HTTP side is a
//! few lines over `std::net` because one fixed response is all it serves, and a web framework
//! would bring an async runtime into a process whose data path is threads.
//!
//! Bounded (issue 11): at most [`MAX_SCRAPES`] requests are served at once, each on its own
//! thread (more get `503` at once); a request head over [`MAX_REQUEST`] bytes gets `431`; the
//! whole head must arrive within [`REQUEST_TIMEOUT`] and a reply be taken within
//! [`WRITE_TIMEOUT`]. A silent or slow client therefore cannot hold up other scrapes, and
//! cannot hold a place for long.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use prometheus::{Encoder, Registry, TextEncoder};

/// Most requests served at once (Prometheus scrapes one target at a time; a few humans).
pub const MAX_SCRAPES: usize = 4;
/// Largest request head (request line and headers) read.
pub const MAX_REQUEST: usize = 8192;
/// Time for the whole request head to arrive.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// Time for the client to take the reply.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// The bounds of one endpoint; [`Limits::default`] holds the constants above.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub max_scrapes: usize,
    pub max_request: usize,
    pub request_timeout: Duration,
    pub write_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_scrapes: MAX_SCRAPES,
            max_request: MAX_REQUEST,
            request_timeout: REQUEST_TIMEOUT,
            write_timeout: WRITE_TIMEOUT,
        }
    }
}

/// How reading a request head ended.
enum Head {
    Complete(Vec<u8>),
    TooLarge,
    /// Timed out or closed before the blank line.
    Incomplete,
}

/// Read up to the blank line that ends the head, within `limits`.
fn read_head(stream: &mut TcpStream, limits: &Limits) -> Head {
    let deadline = Instant::now() + limits.request_timeout;
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    loop {
        if let Some(end) = head.windows(4).position(|w| w == b"\r\n\r\n") {
            head.truncate(end);
            return Head::Complete(head);
        }
        if head.len() > limits.max_request {
            return Head::TooLarge;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || stream.set_read_timeout(Some(left)).is_err() {
            return Head::Incomplete;
        }
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => return Head::Incomplete,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    }
}

fn respond(stream: &mut TcpStream, status: &str, body: &[u8]) -> io::Result<()> {
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes())?;
    stream.write_all(body)
}

/// Close after a reply sent before the request was read whole: unread input at close makes
/// the kernel reset the connection, which can destroy the reply in the client's buffer, so
/// stop writing and discard what the client still sends for up to `wait` (and 64 KiB).
fn close_gently(stream: &mut TcpStream, wait: Duration) {
    let _ = stream.shutdown(std::net::Shutdown::Write);
    let deadline = Instant::now() + wait;
    let mut buf = [0u8; 4096];
    for _ in 0..16 {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || stream.set_read_timeout(Some(left)).is_err() {
            return;
        }
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
    }
}

fn serve_one(mut stream: TcpStream, registry: &Registry, limits: &Limits) {
    let _ = stream.set_write_timeout(Some(limits.write_timeout));
    let (status, body) = match read_head(&mut stream, limits) {
        Head::Incomplete => return,
        Head::TooLarge => (
            "431 Request Header Fields Too Large",
            format!("request head over {} bytes\n", limits.max_request).into_bytes(),
        ),
        Head::Complete(h) if h.starts_with(b"GET /metrics ") || h.starts_with(b"GET / ") => {
            let mut body = Vec::new();
            match TextEncoder::new().encode(&registry.gather(), &mut body) {
                Ok(()) => ("200 OK", body),
                Err(e) => ("500 Internal Server Error", e.to_string().into_bytes()),
            }
        }
        Head::Complete(_) => ("404 Not Found", b"try /metrics\n".to_vec()),
    };
    if respond(&mut stream, status, &body).is_ok() {
        close_gently(&mut stream, Duration::from_millis(200));
    }
}

/// A place among the `max_scrapes`; given back when the request's thread ends.
struct Place(Arc<AtomicUsize>);

impl Drop for Place {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Serve `registry` on `addr` from a background thread with the default [`Limits`]; returns
/// the bound address.
pub fn serve(addr: SocketAddr, registry: Registry) -> io::Result<SocketAddr> {
    serve_with(addr, registry, Limits::default())
}

/// Serve `registry` on `addr` with explicit `limits`; returns the bound address.
pub fn serve_with(addr: SocketAddr, registry: Registry, limits: Limits) -> io::Result<SocketAddr> {
    let listener = TcpListener::bind(addr)?;
    let local = listener.local_addr()?;
    let registry = Arc::new(registry);
    let active = Arc::new(AtomicUsize::new(0));
    std::thread::Builder::new()
        .name("prometheus".into())
        .spawn(move || {
            for conn in listener.incoming() {
                let Ok(mut stream) = conn else { continue };
                if active.fetch_add(1, Ordering::AcqRel) >= limits.max_scrapes {
                    active.fetch_sub(1, Ordering::AcqRel);
                    // A fresh socket's send buffer takes this short reply without blocking.
                    let _ = stream.set_write_timeout(Some(Duration::from_secs(1)));
                    if respond(&mut stream, "503 Service Unavailable", b"busy\n").is_ok() {
                        close_gently(&mut stream, Duration::from_millis(20));
                    }
                    continue;
                }
                let place = Place(Arc::clone(&active));
                let registry = Arc::clone(&registry);
                let spawned = std::thread::Builder::new()
                    .name("prometheus-scrape".into())
                    .spawn(move || {
                        let _place = place;
                        serve_one(stream, &registry, &limits);
                    });
                if let Err(e) = spawned {
                    tracing::warn!(error = %e, "no thread for a metrics request");
                }
            }
        })?;
    Ok(local)
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus::IntCounter;

    fn registry() -> Registry {
        let r = Registry::new_custom(Some("dsim".into()), None).unwrap();
        let c = IntCounter::new("output_heaps", "Heaps sent").unwrap();
        r.register(Box::new(c.clone())).unwrap();
        c.inc_by(42);
        r
    }

    /// One request; the reply, read with a client-side bound so a stuck server fails the test.
    fn get(addr: SocketAddr, request: &[u8]) -> String {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        s.write_all(request).unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    }

    #[test]
    fn serves_the_text_format() {
        let addr = serve("127.0.0.1:0".parse().unwrap(), registry()).unwrap();
        let out = get(addr, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
        assert!(out.starts_with("HTTP/1.1 200 OK"), "{out}");
        assert!(out.contains("dsim_output_heaps 42"), "{out}");
        let out = get(addr, b"GET /other HTTP/1.1\r\n\r\n");
        assert!(out.starts_with("HTTP/1.1 404"));
    }

    #[test]
    fn a_silent_client_does_not_hold_up_a_scrape() {
        // The old endpoint served one connection at a time and waited 5 s for a silent one.
        let addr = serve("127.0.0.1:0".parse().unwrap(), registry()).unwrap();
        let _silent = TcpStream::connect(addr).unwrap();
        std::thread::sleep(Duration::from_millis(50));
        let out = get(addr, b"GET /metrics HTTP/1.1\r\n\r\n");
        assert!(out.starts_with("HTTP/1.1 200 OK"), "{out}");
    }

    #[test]
    fn scrapes_are_capped_and_places_come_back() {
        let limits = Limits {
            max_scrapes: 2,
            request_timeout: Duration::from_millis(300),
            ..Limits::default()
        };
        let addr = serve_with("127.0.0.1:0".parse().unwrap(), registry(), limits).unwrap();
        let _a = TcpStream::connect(addr).unwrap();
        let _b = TcpStream::connect(addr).unwrap();
        std::thread::sleep(Duration::from_millis(50));
        let out = get(addr, b"GET /metrics HTTP/1.1\r\n\r\n");
        assert!(out.starts_with("HTTP/1.1 503"), "{out}");
        // The silent clients time out and give their places back.
        std::thread::sleep(Duration::from_millis(600));
        let out = get(addr, b"GET /metrics HTTP/1.1\r\n\r\n");
        assert!(out.starts_with("HTTP/1.1 200 OK"), "{out}");
    }

    #[test]
    fn request_size_and_time_are_bounded() {
        let limits = Limits {
            request_timeout: Duration::from_millis(300),
            ..Limits::default()
        };
        let addr = serve_with("127.0.0.1:0".parse().unwrap(), registry(), limits).unwrap();
        let mut big = b"GET /metrics HTTP/1.1\r\nX: ".to_vec();
        big.resize(MAX_REQUEST + 2048, b'a');
        let out = get(addr, &big);
        assert!(out.starts_with("HTTP/1.1 431"), "{out}");
        // A client trickling its head is cut off at the request timeout: the connection closes
        // with nothing written, well before the client's own 2 s bound.
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let t = Instant::now();
        for b in b"GET /metrics HTTP/1.1\r\n" {
            if s.write_all(&[*b]).is_err() || t.elapsed() > Duration::from_millis(900) {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out);
        assert!(out.is_empty());
        assert!(t.elapsed() < Duration::from_secs(2));
    }
}
