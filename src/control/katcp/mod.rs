//! katcp (v5) — the Karoo Array Telescope control protocol, as aiokatcp and katgpucbf speak it.
//!
//! Pure part: [`Message`] parsing and formatting, with katcp's escapes (`\_` space, `\\`,
//! `\t`, `\n`, `\r`, `\0`, `\e`, `\@` for an empty argument) and message ids (`?name[7]`).
//! Server part ([`Server`]): one thread accepting connections and two per client (its
//! requests; its sampled sensors), answering the standard requests (`?help`, `?watchdog`,
//! `?version-list`, `?sensor-list`, `?sensor-value`, `?sensor-sampling` with every katcp v5
//! strategy, `?client-list`, `?log-level`, `?halt`) from a shared [`Sensors`] table and passing
//! everything else to the program's [`Handler`]. A client is greeted with the
//! `#version-connect` and `#build-state` informs aiokatcp clients expect. A malformed line gets
//! a `fail` reply naming the problem; an unknown request gets `invalid`, as aiokatcp servers
//! answer. Nothing a client sends can stop the server, except `?halt` where the program
//! offers it (a clean stop).
//!
//! Every client is bounded ([`Limits`], issue 11): a line longer than [`MAX_LINE`] is refused
//! whole (a `fail` reply if its head names a request) and the rest of it discarded up to its
//! newline, never split and run in pieces; a request has at most [`MAX_ARGS`] arguments; at
//! most [`MAX_CONNECTIONS`] clients are served at once (the next is told so and closed); a
//! client silent for [`IDLE_TIMEOUT`] or not reading its replies for [`WRITE_TIMEOUT`] is
//! dropped, freeing its place.

pub mod client;
mod message;
mod sampling;
mod sensors;
mod server;
mod session;
mod standard;

use std::time::Duration;

pub use message::{Kind, Message, ParseError};
pub use sampling::{Sampler, Strategy};
pub use sensors::{Sensor, Sensors, Status};
pub use server::Server;
pub use session::Session;
pub use standard::{set_log_level_hook, Handler};

/// Longest request line accepted, newline excluded (katcp has no limit; this bounds memory per
/// client). The largest legitimate request is `?gain` with one complex value per channel:
/// 65536 channels × up to ~60 bytes per value fits.
pub const MAX_LINE: usize = 4 << 20;
/// Most arguments in one message: `?gain stream input` and one value per channel, for up to
/// 65536 channels, with room to spare.
pub const MAX_ARGS: usize = 65536 + 64;
/// Most clients served at once.
pub const MAX_CONNECTIONS: usize = 32;
/// A client that sends nothing for this long is dropped. Long, because operators' clients
/// (product controllers) legitimately stay connected and quiet for hours between requests.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(3600);
/// A client that does not take a reply within this time is dropped.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// The bounds of one server; [`Limits::default`] holds the constants above.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub max_line: usize,
    pub max_args: usize,
    pub max_connections: usize,
    pub idle_timeout: Duration,
    pub write_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_line: MAX_LINE,
            max_args: MAX_ARGS,
            max_connections: MAX_CONNECTIONS,
            idle_timeout: IDLE_TIMEOUT,
            write_timeout: WRITE_TIMEOUT,
        }
    }
}
