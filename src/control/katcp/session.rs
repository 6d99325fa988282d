//! One client's connection state: its sensor samplers (`?sensor-sampling`) and the thread
//! that sends their `#sensor-status` informs while the client is connected.

use std::collections::BTreeMap;
use std::io::Write;
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::sampling::{Sampler, Strategy};
use super::sensors::now;
use super::standard::sensor_status;
use super::Sensors;

/// How often samplers are polled: the finest period a strategy is honoured to.
pub const SAMPLING_INTERVAL: Duration = Duration::from_millis(20);

/// What the server keeps for one client between its requests.
#[derive(Debug)]
pub struct Session {
    /// The client's address, for `?client-list` and logs.
    pub peer: String,
    samplers: Mutex<BTreeMap<String, Sampler>>,
    closed: AtomicBool,
}

impl Session {
    pub fn new(peer: String) -> Session {
        Session {
            peer,
            samplers: Mutex::new(BTreeMap::new()),
            closed: AtomicBool::new(false),
        }
    }

    fn samplers(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Sampler>> {
        self.samplers.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The strategy sensor `name` is sampled with for this client.
    pub fn strategy(&self, name: &str) -> Strategy {
        self.samplers()
            .get(name)
            .map_or(Strategy::None, |s| s.strategy)
    }

    /// Sample `name` with `sampler`, or stop sampling it.
    pub fn set_sampler(&self, name: &str, sampler: Option<Sampler>) {
        let mut samplers = self.samplers();
        match sampler {
            Some(s) => {
                samplers.insert(name.to_string(), s);
            }
            None => {
                samplers.remove(name);
            }
        }
    }

    /// The `#sensor-status` lines due at `now` (a sensor that has gone is dropped).
    fn due(&self, sensors: &Sensors, now: f64) -> String {
        let mut out = String::new();
        // Read in place: a subscribed sensor may hold every channel's gain.
        self.samplers().retain(|name, sampler| {
            sensors
                .with(name, |reading| {
                    if sampler.poll(now, reading) {
                        out.push_str(&sensor_status(name, reading).to_line());
                    }
                })
                .is_some()
        });
        out
    }

    /// The client has gone: the sampling thread ends.
    pub fn close(&self) {
        self.closed.store(true, Ordering::Relaxed);
    }

    /// Send what the samplers say is due until the client goes (or a write fails, which
    /// ends the connection as a failed reply would).
    pub fn sample(self: Arc<Self>, sensors: Arc<Sensors>, writer: Arc<Mutex<TcpStream>>) {
        while !self.closed.load(Ordering::Relaxed) {
            std::thread::sleep(SAMPLING_INTERVAL);
            let lines = self.due(&sensors, now());
            if lines.is_empty() {
                continue;
            }
            let mut w = writer.lock().unwrap_or_else(|e| e.into_inner());
            if w.write_all(lines.as_bytes()).is_err() {
                let _ = w.shutdown(std::net::Shutdown::Both);
                return;
            }
        }
    }
}
