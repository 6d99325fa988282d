//! `?sensor-sampling` strategies (katcp v5 §Sensor sampling, as aiokatcp implements them): when
//! a client that subscribed to a sensor is sent a `#sensor-status`. Pure: a [`Sampler`] is
//! polled with the time and the sensor's reading and says whether to send it now, so the
//! rules are tested with a simulated clock and the server only polls.
//!
//! Every strategy sends the current reading when it is set. Then, as aiokatcp's
//! `SensorSampler`: a change (value or status; any new assignment for `auto`; a change of more
//! than the difference for the differential strategies) is sent once `shortest` seconds have
//! passed since the last update, and an update is sent after `longest` seconds in any case.
//! `period P` is shortest = longest = P; `event-rate s l` and `differential-rate d s l` give
//! both; `event`, `differential d` and `auto` have neither.

use super::{Sensor, Status};

/// A strategy and its parameters, as requested.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Strategy {
    None,
    Auto,
    Period(f64),
    Event,
    Differential(f64),
    EventRate(f64, f64),
    DifferentialRate(f64, f64, f64),
}

impl Strategy {
    /// From the request's strategy name and parameters; `numeric` says whether the sensor
    /// is an integer or float one (the only kinds a differential strategy applies to).
    pub fn parse(name: &str, params: &[String], numeric: bool) -> Result<Strategy, String> {
        let want = |n: usize| {
            if params.len() == n {
                Ok(())
            } else {
                Err(format!(
                    "{name}: expected {n} strategy arguments, found {}",
                    params.len()
                ))
            }
        };
        let num = |i: usize, what: &str, positive: bool| -> Result<f64, String> {
            let v: f64 = params[i]
                .parse()
                .map_err(|_| format!("{name}: {what} {:?} is not a number", params[i]))?;
            let ok = v.is_finite() && if positive { v > 0.0 } else { v >= 0.0 };
            if ok {
                Ok(v)
            } else {
                Err(format!(
                    "{name}: {what} must be {}",
                    if positive { "positive" } else { "non-negative" }
                ))
            }
        };
        if name.starts_with("differential") && !numeric {
            return Err("differential strategies only valid for integer and float sensors".into());
        }
        Ok(match name {
            "none" => want(0).map(|_| Strategy::None)?,
            "auto" => want(0).map(|_| Strategy::Auto)?,
            "event" => want(0).map(|_| Strategy::Event)?,
            "period" => {
                want(1)?;
                Strategy::Period(num(0, "period", true)?)
            }
            "differential" => {
                want(1)?;
                Strategy::Differential(num(0, "difference", false)?)
            }
            "event-rate" => {
                want(2)?;
                Strategy::EventRate(num(0, "shortest", false)?, num(1, "longest", true)?)
            }
            "differential-rate" => {
                want(3)?;
                Strategy::DifferentialRate(
                    num(0, "difference", false)?,
                    num(1, "shortest", false)?,
                    num(2, "longest", true)?,
                )
            }
            _ => return Err(format!("unknown strategy {name:?}")),
        })
    }

    /// The strategy's name and parameters, for the reply.
    pub fn words(&self) -> Vec<String> {
        let s = |v: &f64| v.to_string();
        match self {
            Strategy::None => vec!["none".into()],
            Strategy::Auto => vec!["auto".into()],
            Strategy::Event => vec!["event".into()],
            Strategy::Period(p) => vec!["period".into(), s(p)],
            Strategy::Differential(d) => vec!["differential".into(), s(d)],
            Strategy::EventRate(a, b) => vec!["event-rate".into(), s(a), s(b)],
            Strategy::DifferentialRate(d, a, b) => {
                vec!["differential-rate".into(), s(d), s(a), s(b)]
            }
        }
    }
}

/// One client's subscription to one sensor.
#[derive(Debug, Clone)]
pub struct Sampler {
    pub strategy: Strategy,
    difference: Option<f64>,
    shortest: f64,
    longest: Option<f64>,
    /// Every assignment counts as a change (`auto`).
    always: bool,
    /// When the last update was sent, and what it said.
    last_time: f64,
    last_value: String,
    last_status: Status,
    /// The sensor's assignment number when last polled.
    last_seen: u64,
    /// A change is waiting for `shortest` to pass.
    pending: bool,
}

impl Sampler {
    /// A sampler for `strategy` (not `None`); the caller sends `reading` now.
    pub fn new(strategy: Strategy, now: f64, reading: &Sensor) -> Sampler {
        let (difference, shortest, longest, always) = match strategy {
            Strategy::Auto => (None, 0.0, None, true),
            Strategy::Period(p) => (None, p, Some(p), false),
            Strategy::Differential(d) => (Some(d), 0.0, None, false),
            Strategy::EventRate(s, l) => (None, s, Some(l), false),
            Strategy::DifferentialRate(d, s, l) => (Some(d), s, Some(l), false),
            Strategy::Event | Strategy::None => (None, 0.0, None, false),
        };
        Sampler {
            strategy,
            difference,
            shortest,
            longest,
            always,
            last_time: now,
            last_value: reading.value.clone(),
            last_status: reading.status,
            last_seen: reading.seq,
            pending: false,
        }
    }

    fn changed(&self, r: &Sensor) -> bool {
        if r.seq == self.last_seen {
            return false; // not assigned since the last poll
        }
        if self.always || r.status != self.last_status {
            return true;
        }
        match self.difference {
            None => r.value != self.last_value,
            Some(d) => match (r.value.parse::<f64>(), self.last_value.parse::<f64>()) {
                (Ok(now), Ok(then)) => (now - then).abs() > d,
                _ => r.value != self.last_value,
            },
        }
    }

    /// Whether `reading` is to be sent at `now`; if so it counts as sent.
    pub fn poll(&mut self, now: f64, reading: &Sensor) -> bool {
        self.pending |= self.changed(reading);
        self.last_seen = reading.seq;
        let due_change = self.pending && now >= self.last_time + self.shortest;
        let due_anyway = self.longest.is_some_and(|l| now >= self.last_time + l);
        if !(due_change || due_anyway) {
            return false;
        }
        self.last_time = now;
        self.last_value.clone_from(&reading.value);
        self.last_status = reading.status;
        self.pending = false;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reading(value: &str, status: Status, timestamp: f64) -> Sensor {
        Sensor {
            description: String::new(),
            units: String::new(),
            kind: "float",
            params: &[],
            value: value.into(),
            status,
            timestamp,
            // Each reading of these tests is a new assignment at its own time.
            seq: (timestamp * 1000.0) as u64,
        }
    }

    /// Times at which a sampler sends, polling every 0.1 s over `updates` (time, value).
    fn sends(strategy: Strategy, updates: &[(f64, &str)], until: f64) -> Vec<f64> {
        let mut r = reading("0", Status::Nominal, 0.0);
        let mut s = Sampler::new(strategy, 0.0, &r);
        let mut out = vec![0.0];
        for k in 1..=(until * 10.0).round() as usize {
            let t = k as f64 / 10.0;
            for &(at, v) in updates {
                if (at - t).abs() < 1e-9 {
                    r = reading(v, Status::Nominal, t);
                }
            }
            if s.poll(t, &r) {
                out.push((t * 10.0).round() / 10.0);
            }
        }
        out
    }

    #[test]
    fn strategies_send_as_aiokatcp_does() {
        let ups = [(0.5, "1"), (0.6, "1"), (0.7, "1.05"), (2.0, "3")];
        assert_eq!(sends(Strategy::Event, &ups, 3.0), [0.0, 0.5, 0.7, 2.0]);
        // auto: every assignment, even of the same value.
        assert_eq!(sends(Strategy::Auto, &ups, 3.0), [0.0, 0.5, 0.6, 0.7, 2.0]);
        assert_eq!(
            sends(Strategy::Period(1.0), &ups, 3.0),
            [0.0, 1.0, 2.0, 3.0]
        );
        // More than 0.5 from the value last sent: 0→1 and 1→3, not 1→1.05.
        assert_eq!(
            sends(Strategy::Differential(0.5), &ups, 3.0),
            [0.0, 0.5, 2.0]
        );
        // Changes at most every 1 s, an update at least every 1.5 s.
        assert_eq!(
            sends(Strategy::EventRate(1.0, 1.5), &ups, 4.0),
            [0.0, 1.0, 2.0, 3.5]
        );
        assert_eq!(
            sends(Strategy::DifferentialRate(0.5, 0.0, 2.5), &ups, 6.0),
            [0.0, 0.5, 2.0, 4.5]
        );
    }

    #[test]
    fn a_status_change_is_a_change() {
        let mut s = Sampler::new(Strategy::Event, 0.0, &reading("1", Status::Nominal, 0.0));
        assert!(!s.poll(1.0, &reading("1", Status::Nominal, 1.0)));
        assert!(s.poll(2.0, &reading("1", Status::Error, 2.0)));
    }

    #[test]
    fn parameters_are_checked() {
        let p = |n: &str, a: &[&str], numeric| {
            Strategy::parse(
                n,
                &a.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
                numeric,
            )
        };
        assert_eq!(p("period", &["0.5"], false), Ok(Strategy::Period(0.5)));
        assert_eq!(
            p("event-rate", &["0.1", "10"], false),
            Ok(Strategy::EventRate(0.1, 10.0))
        );
        assert!(p("period", &["0"], false).is_err());
        assert!(p("period", &["nan"], false).is_err());
        assert!(p("period", &[], false).is_err());
        assert!(p("differential", &["1"], false).is_err(), "string sensor");
        assert!(p("differential", &["1"], true).is_ok());
        assert!(p("sometimes", &[], true).is_err());
        assert_eq!(
            Strategy::DifferentialRate(1.0, 0.5, 2.0).words(),
            ["differential-rate", "1", "0.5", "2"]
        );
    }
}
