//! A small blocking katcp client, for reading engines' sensors (`cbf array status`): one
//! connection, one request at a time, each with a message id so that its reply and informs
//! are told apart from the server's asynchronous informs (`#version-connect`, `#build-state`,
//! `#sensor-status`), which are skipped.
//!
//! Whatever the server sends is bounded: a request ends after its deadline, a line longer than
//! [`MAX_REPLY_LINE`] or more than [`MAX_INFORMS`] informs end it with an error, so an engine
//! that misbehaves costs one row of a status table, never a hang.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use super::{Kind, Message};

/// Longest line accepted from a server (a per-channel gain sensor of 65536 channels is ~1.3 MB).
pub const MAX_REPLY_LINE: usize = 4 << 20;
/// Most informs accepted for one request.
pub const MAX_INFORMS: usize = 65536;

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("no reply within {0:?}")]
    Timeout(Duration),
    #[error("the server closed the connection")]
    Closed,
    #[error("a line over {MAX_REPLY_LINE} bytes")]
    LineTooLong,
    #[error("more than {MAX_INFORMS} informs")]
    TooManyInforms,
    #[error("malformed line from the server: {0}")]
    Malformed(String),
}

/// A reply: its status (`ok`, `fail`, `invalid`), its other arguments, and the informs that
/// came with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    pub status: String,
    pub args: Vec<String>,
    pub informs: Vec<Message>,
}

impl Reply {
    pub fn ok(&self) -> bool {
        self.status == "ok"
    }
}

pub struct Client {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
    timeout: Duration,
    next_mid: u32,
}

impl Client {
    /// Connect within `timeout`, which also bounds each request.
    pub fn connect(addr: SocketAddr, timeout: Duration) -> Result<Client, ClientError> {
        let stream = TcpStream::connect_timeout(&addr, timeout).map_err(|e| {
            if matches!(
                e.kind(),
                std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock
            ) {
                ClientError::Timeout(timeout)
            } else {
                e.into()
            }
        })?;
        stream.set_write_timeout(Some(timeout))?;
        Ok(Client {
            reader: BufReader::new(stream.try_clone()?),
            writer: stream,
            timeout,
            next_mid: 1,
        })
    }

    /// Send `?name args…` and wait for its reply.
    pub fn request(&mut self, name: &str, args: &[&str]) -> Result<Reply, ClientError> {
        let mid = self.next_mid;
        self.next_mid = self.next_mid.checked_add(1).unwrap_or(1);
        let msg = Message::new(
            Kind::Request,
            name,
            Some(mid),
            args.iter().map(|a| a.to_string()).collect(),
        );
        self.writer.write_all(msg.to_line().as_bytes())?;
        let deadline = Instant::now() + self.timeout;
        let mut informs = Vec::new();
        loop {
            let line = self.read_line(deadline)?;
            let text = line.strip_suffix(b"\n").unwrap_or(&line);
            let text = text.strip_suffix(b"\r").unwrap_or(text);
            if text.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            let m = Message::parse(text).map_err(|e| {
                ClientError::Malformed(format!("{e}: {}", String::from_utf8_lossy(text)))
            })?;
            if m.name != name || m.mid != Some(mid) {
                continue;
            }
            match m.kind {
                Kind::Inform if informs.len() == MAX_INFORMS => {
                    return Err(ClientError::TooManyInforms)
                }
                Kind::Inform => informs.push(m),
                Kind::Reply => {
                    let mut args = m.args.into_iter();
                    return Ok(Reply {
                        status: args.next().unwrap_or_default(),
                        args: args.collect(),
                        informs,
                    });
                }
                Kind::Request => {}
            }
        }
    }

    /// One line, newline included, read before `deadline`.
    fn read_line(&mut self, deadline: Instant) -> Result<Vec<u8>, ClientError> {
        let mut line = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(ClientError::Timeout(self.timeout));
            }
            self.reader.get_ref().set_read_timeout(Some(left))?;
            let room = (MAX_REPLY_LINE + 1).saturating_sub(line.len()) as u64;
            match (&mut self.reader).take(room).read_until(b'\n', &mut line) {
                Ok(0) if line.is_empty() => return Err(ClientError::Closed),
                Ok(_) if line.last() == Some(&b'\n') => return Ok(line),
                Ok(0) => return Err(ClientError::Closed),
                Ok(_) if line.len() > MAX_REPLY_LINE => return Err(ClientError::LineTooLong),
                Ok(_) => {}
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) => {}
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e.into()),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    /// A fake server that sends `script` after reading one line, then holds the connection.
    fn serve(script: &'static [u8]) -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        std::thread::spawn(move || {
            let (s, _) = l.accept().unwrap();
            let mut r = BufReader::new(s.try_clone().unwrap());
            let mut line = String::new();
            r.read_line(&mut line).unwrap();
            (&s).write_all(script).unwrap();
            std::thread::sleep(Duration::from_secs(2));
        });
        addr
    }

    #[test]
    fn reply_and_its_informs_are_picked_from_other_traffic() {
        let addr = serve(
            b"#version-connect katcp-protocol 5.1-MI\n\
              #sensor-value[1] 1.0 1 device-status nominal ok\n\
              #sensor-status 1.0 1 x nominal 3\n\
              #sensor-value[7] 0 1 other nominal 1\n\
              !sensor-value[1] ok 1\n",
        );
        let mut c = Client::connect(addr, Duration::from_secs(1)).unwrap();
        let r = c.request("sensor-value", &["device-status"]).unwrap();
        assert!(r.ok());
        assert_eq!(r.args, ["1"]);
        assert_eq!(r.informs.len(), 1);
        assert_eq!(r.informs[0].args[2..], ["device-status", "nominal", "ok"]);
    }

    #[test]
    fn silence_and_garbage_end_a_request_with_an_error() {
        let addr = serve(b"#version-connect x\n");
        // The server holds the connection for 2 s: only the deadline ends the request sooner.
        let mut c = Client::connect(addr, Duration::from_millis(300)).unwrap();
        assert!(matches!(
            c.request("sensor-value", &[]),
            Err(ClientError::Timeout(_))
        ));
        let addr = serve(b"hello\n");
        let mut c = Client::connect(addr, Duration::from_secs(1)).unwrap();
        assert!(matches!(
            c.request("sensor-value", &[]),
            Err(ClientError::Malformed(_))
        ));
    }
}
