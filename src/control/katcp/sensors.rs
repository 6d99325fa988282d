//! The sensor table a katcp server reads `?sensor-list` and `?sensor-value` from.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

/// katcp sensor status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Unknown,
    Nominal,
    Warn,
    Error,
}

impl Status {
    pub(super) fn as_str(self) -> &'static str {
        match self {
            Status::Unknown => "unknown",
            Status::Nominal => "nominal",
            Status::Warn => "warn",
            Status::Error => "error",
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Sensor {
    pub description: String,
    pub units: String,
    /// katcp type: integer, float, boolean, string, timestamp, discrete.
    pub kind: &'static str,
    /// A discrete sensor's values (listed by `?sensor-list` after the type).
    pub params: &'static [&'static str],
    pub value: String,
    pub status: Status,
    pub timestamp: f64,
    /// Bumped by every assignment (process-wide, so a re-added sensor never repeats a
    /// number): how a sampler tells a new assignment from none without comparing values,
    /// which may be a whole band of gains.
    pub(super) seq: u64,
}

/// The next assignment number.
fn next_seq() -> u64 {
    static SEQ: AtomicU64 = AtomicU64::new(1);
    SEQ.fetch_add(1, Ordering::Relaxed)
}

impl Sensor {
    /// `timestamp 1 name status value`: the arguments of a `#sensor-value` or
    /// `#sensor-status` inform.
    pub fn status_args(&self, name: &str) -> Vec<String> {
        vec![
            format!("{:.6}", self.timestamp),
            "1".into(),
            name.into(),
            self.status.as_str().into(),
            self.value.clone(),
        ]
    }
}

/// The sensor table a program updates and the server reads.
#[derive(Debug, Default)]
pub struct Sensors(Mutex<BTreeMap<String, Sensor>>);

pub(super) fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64()
}

impl Sensors {
    pub fn add(
        &self,
        name: &str,
        description: &str,
        units: &str,
        kind: &'static str,
        value: impl ToString,
    ) {
        self.insert(name, description, units, kind, &[], value.to_string());
    }

    /// A discrete sensor taking one of `values`.
    pub fn add_discrete(
        &self,
        name: &str,
        description: &str,
        values: &'static [&'static str],
        value: &str,
    ) {
        self.insert(name, description, "", "discrete", values, value.into());
    }

    fn insert(
        &self,
        name: &str,
        description: &str,
        units: &str,
        kind: &'static str,
        params: &'static [&'static str],
        value: String,
    ) {
        let s = Sensor {
            description: description.into(),
            units: units.into(),
            kind,
            params,
            value,
            status: Status::Nominal,
            timestamp: now(),
            seq: next_seq(),
        };
        self.lock().insert(name.into(), s);
    }

    pub fn set(&self, name: &str, value: impl ToString, status: Status) {
        if let Some(s) = self.lock().get_mut(name) {
            s.value = value.to_string();
            s.status = status;
            s.timestamp = now();
            s.seq = next_seq();
        }
    }

    /// Set several sensors under one lock, with one timestamp: a reader (a `?sensor-value`,
    /// a sampler) sees all of them changed or none.
    pub fn set_many(&self, values: &[(&str, String)], status: Status) {
        let mut all = self.lock();
        let t = now();
        for (name, value) in values {
            if let Some(s) = all.get_mut(*name) {
                s.value.clone_from(value);
                s.status = status;
                s.timestamp = t;
                s.seq = next_seq();
            }
        }
    }

    pub fn get(&self, name: &str) -> Option<Sensor> {
        self.lock().get(name).cloned()
    }

    /// `f` of sensor `name` read in place (no copy of its value); `None` if there is none.
    pub fn with<R>(&self, name: &str, f: impl FnOnce(&Sensor) -> R) -> Option<R> {
        self.lock().get(name).map(f)
    }

    /// Whether any sensor satisfies `pred`, read in place.
    pub fn any(&self, pred: impl Fn(&str, &Sensor) -> bool) -> bool {
        self.lock().iter().any(|(n, s)| pred(n, s))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Sensor>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sensors matching `filter`: all, one by name, or a `/regex/`-free substring match.
    pub(super) fn matching(&self, filter: Option<&str>) -> Vec<(String, Sensor)> {
        self.lock()
            .iter()
            .filter(|(n, _)| filter.is_none_or(|f| *n == f))
            .map(|(n, s)| (n.clone(), s.clone()))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_many_changes_all_named_sensors_at_one_time() {
        let s = Sensors::default();
        s.add("a", "", "", "string", "old");
        s.add("b", "", "", "integer", 1);
        s.add("c", "", "", "string", "untouched");
        std::thread::sleep(std::time::Duration::from_millis(2));
        s.set_many(
            &[("a", "new".into()), ("b", "2".into()), ("nope", "x".into())],
            Status::Warn,
        );
        let (a, b, c) = (
            s.get("a").unwrap(),
            s.get("b").unwrap(),
            s.get("c").unwrap(),
        );
        assert_eq!((a.value.as_str(), b.value.as_str()), ("new", "2"));
        assert_eq!((a.status, b.status), (Status::Warn, Status::Warn));
        assert_eq!(a.timestamp, b.timestamp);
        assert!(a.timestamp > c.timestamp);
        assert_eq!(c.value, "untouched");
        assert!(s.get("nope").is_none());
    }
}
