//! The katcp server's bounds over real TCP (issue 11): over-long lines refused whole, too many
//! arguments refused, a connection cap, and idle and write timeouts that free a client's place.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use cbf::control::katcp::{self, Handler, Limits, Sensors, MAX_ARGS, MAX_LINE};

/// `?echo` echoes its arguments' count; `?count` counts how often it ran.
#[derive(Default)]
struct Probe {
    counted: AtomicUsize,
}

impl Handler for Probe {
    fn requests(&self) -> Vec<(&'static str, &'static str)> {
        vec![("echo", "Echo"), ("count", "Count")]
    }
    fn handle(&self, name: &str, args: &[String]) -> Option<Result<Vec<String>, String>> {
        match name {
            "echo" => Some(Ok(args.to_vec())),
            "count" => {
                self.counted.fetch_add(1, Ordering::SeqCst);
                Some(Ok(vec![]))
            }
            _ => None,
        }
    }
}

fn start(limits: Limits) -> (SocketAddr, Arc<Probe>) {
    let probe = Arc::new(Probe::default());
    let addr = katcp::Server::new(
        Arc::new(Sensors::default()),
        Arc::clone(&probe) as Arc<dyn Handler>,
        "test",
    )
    .with_limits(limits)
    .serve("127.0.0.1:0".parse().unwrap())
    .unwrap();
    (addr, probe)
}

/// Connect and read the greeting: three `#version-connect` lines and `#build-state`.
fn client(addr: SocketAddr) -> (TcpStream, BufReader<TcpStream>) {
    let s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut r = BufReader::new(s.try_clone().unwrap());
    for what in ["katcp-protocol", "katcp-library", "katcp-device"] {
        let mut l = String::new();
        r.read_line(&mut l).unwrap();
        assert!(l.starts_with(&format!("#version-connect {what} ")), "{l}");
    }
    let mut l = String::new();
    r.read_line(&mut l).unwrap();
    assert!(l.starts_with("#build-state test-"), "{l}");
    (s, r)
}

fn line(r: &mut BufReader<TcpStream>) -> String {
    let mut l = String::new();
    r.read_line(&mut l).unwrap();
    l
}

#[test]
fn an_over_long_line_is_refused_whole() {
    let (addr, probe) = start(Limits::default());
    let (mut s, mut r) = client(addr);
    // Exactly MAX_LINE bytes of `?echo aaa…`, then `?count` on the same line: a server that
    // cut the line at the limit ran `?echo` and then `?count` from the tail.
    let mut long = b"?echo[7] ".to_vec();
    long.resize(MAX_LINE, b'a');
    long.extend_from_slice(b"?count\n?watchdog\n");
    s.write_all(&long).unwrap();
    let reply = line(&mut r);
    assert!(
        reply.starts_with("!echo[7] fail request\\_longer"),
        "{reply}"
    );
    assert_eq!(line(&mut r), "!watchdog ok\n");
    assert_eq!(probe.counted.load(Ordering::SeqCst), 0);
    // A line of exactly the limit is served.
    let mut fits = b"?echo ".to_vec();
    fits.resize(MAX_LINE, b'b');
    fits.push(b'\n');
    s.write_all(&fits).unwrap();
    let reply = line(&mut r);
    assert!(reply.starts_with("!echo ok bbbb"), "{}", &reply[..40]);
    assert_eq!(
        reply.len(),
        "!echo ok ".len() + MAX_LINE - "?echo ".len() + 1
    );
}

#[test]
fn too_many_arguments_are_refused() {
    let (addr, _) = start(Limits::default());
    let (mut s, mut r) = client(addr);
    let many = format!("?echo{}\n", " 1".repeat(MAX_ARGS + 1));
    s.write_all(many.as_bytes()).unwrap();
    let reply = line(&mut r);
    assert!(reply.starts_with("!echo fail more\\_than"), "{reply}");
    // The largest legitimate request, one gain per channel of 65536, is served.
    let gains = format!("?echo s 0{}\n", " 0.5+0.25j".repeat(65536));
    s.write_all(gains.as_bytes()).unwrap();
    assert!(line(&mut r).starts_with("!echo ok s 0 0.5+0.25j"));
}

/// Retry connecting until the server takes the client (reads its greeting) or `limit` passes.
fn connects_within(addr: SocketAddr, limit: Duration) -> bool {
    let t = Instant::now();
    while t.elapsed() < limit {
        let s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let mut l = String::new();
        if BufReader::new(s).read_line(&mut l).is_ok() && l.starts_with("#version-connect") {
            return true;
        }
        thread::sleep(Duration::from_millis(50));
    }
    false
}

#[test]
fn connections_are_capped_and_places_come_back() {
    let (addr, _) = start(Limits {
        max_connections: 2,
        ..Limits::default()
    });
    let a = client(addr);
    let _b = client(addr);
    let s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut all = String::new();
    BufReader::new(s).read_to_string(&mut all).unwrap();
    assert!(all.starts_with("#log error"), "{all}");
    assert!(all.contains("too\\_many\\_clients"), "{all}");
    drop(a);
    assert!(connects_within(addr, Duration::from_secs(5)));
}

#[test]
fn an_idle_client_is_dropped() {
    let (addr, _) = start(Limits {
        max_connections: 1,
        idle_timeout: Duration::from_millis(200),
        ..Limits::default()
    });
    let (_s, mut r) = client(addr);
    let mut rest = Vec::new();
    // The server closes the connection after the idle time: EOF, well before our 20 s.
    r.read_to_end(&mut rest).unwrap();
    assert!(rest.is_empty());
    assert!(connects_within(addr, Duration::from_secs(5)));
}

#[test]
fn a_client_that_does_not_read_is_dropped() {
    let (addr, _) = start(Limits {
        max_connections: 1,
        write_timeout: Duration::from_millis(200),
        ..Limits::default()
    });
    let (s, _r) = client(addr);
    // Ask for 64 MB of replies and never read them.
    let mut w = s.try_clone().unwrap();
    w.set_write_timeout(Some(Duration::from_secs(5))).unwrap();
    let flood = thread::spawn(move || {
        let big = format!("?echo {}\n", "x".repeat(1 << 20));
        for _ in 0..64 {
            if w.write_all(big.as_bytes()).is_err() {
                break;
            }
        }
    });
    assert!(connects_within(addr, Duration::from_secs(20)));
    flood.join().unwrap();
}
