//! Prometheus metrics over HTTP (`GET /metrics`), with katgpucbf's metric names (facts §1.8).
//!
//! The `prometheus` crate keeps the registry and writes the text format; the HTTP side is a
//! few lines over `std::net` because one fixed response is all it serves, and a web framework
//! would bring an async runtime into a process whose data path is threads.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::time::Duration;

use prometheus::{Encoder, Registry, TextEncoder};

/// Serve `registry` on `addr` from a background thread; returns the bound address.
pub fn serve(addr: SocketAddr, registry: Registry) -> io::Result<SocketAddr> {
    let listener = TcpListener::bind(addr)?;
    let local = listener.local_addr()?;
    std::thread::Builder::new().name("prometheus".into()).spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut stream) = conn else { continue };
            let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
            let mut request = [0u8; 1024];
            let n = stream.read(&mut request).unwrap_or(0);
            let path_ok = request[..n].starts_with(b"GET /metrics ") || request[..n].starts_with(b"GET / ");
            let (status, body) = if path_ok {
                let mut body = Vec::new();
                match TextEncoder::new().encode(&registry.gather(), &mut body) {
                    Ok(()) => ("200 OK", body),
                    Err(e) => ("500 Internal Server Error", e.to_string().into_bytes()),
                }
            } else {
                ("404 Not Found", b"try /metrics\n".to_vec())
            };
            let head = format!(
                "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            let _ = stream.write_all(head.as_bytes()).and_then(|()| stream.write_all(&body));
        }
    })?;
    Ok(local)
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus::IntCounter;

    #[test]
    fn serves_the_text_format() {
        let r = Registry::new_custom(Some("dsim".into()), None).unwrap();
        let c = IntCounter::new("output_heaps", "Heaps sent").unwrap();
        r.register(Box::new(c.clone())).unwrap();
        c.inc_by(42);
        let addr = serve("127.0.0.1:0".parse().unwrap(), r).unwrap();
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        assert!(out.starts_with("HTTP/1.1 200 OK"), "{out}");
        assert!(out.contains("dsim_output_heaps 42"), "{out}");
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        s.write_all(b"GET /other HTTP/1.1\r\n\r\n").unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        assert!(out.starts_with("HTTP/1.1 404"));
    }
}
