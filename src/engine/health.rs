//! The health sensors every katgpucbf engine carries (facts §1.7; katgpucbf `utils.py`,
//! `recv.py`), kept by one thread per engine:
//! - `time.esterror`, `time.maxerror` (s), `time.state`, `time.synchronised`: the kernel
//!   clock's synchronisation as `adjtimex` reports it, every 10 s, with katgpucbf's thresholds;
//! - `{prefix}rx.timestamp`, `{prefix}rx.unixtime` (error until data arrives, and again when
//!   none has come for the sensor timeout) and `{prefix}rx.missing-unixtime` (error when
//!   missing data is seen, nominal again after the timeout): katgpucbf's
//!   `TimeoutSensorStatusObserver`;
//! - `rx.device-status` (over the `rx.` sensors) and `device-status` (over all): `ok` while
//!   every sensor is nominal or unknown, `degraded` otherwise (katgpucbf's
//!   `DeviceStatusSensor`).

use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use crate::control::katcp::{Sensors, Status};

/// How often timeouts and aggregates are brought up to date.
const TICK: Duration = Duration::from_millis(250);
/// How often the clock is read (katgpucbf's `TIME_SYNC_SENSOR_UPDATE_PERIOD`).
const CLOCK_PERIOD: Duration = Duration::from_secs(10);
/// katgpucbf's thresholds, in seconds: (warn, error).
const ESTERROR: (f64, f64) = (1e-3, 5e-3);
const MAXERROR: (f64, f64) = (10e-3, 0.1);

/// aiokatcp's `ClockState` values, by `adjtimex`'s return value.
const CLOCK_STATES: [&str; 6] = ["ok", "ins", "del", "oop", "wait", "error"];
const DEVICE_STATUS: [&str; 3] = ["ok", "degraded", "fail"];

/// A sensor whose status becomes `to` when it has not been set for `after`.
#[derive(Debug, Clone)]
pub struct Timeout {
    pub sensor: String,
    pub after: Duration,
    pub to: Status,
}

/// How long the receive sensors wait for data before going to error, for chunks of
/// `chunk_seconds`: ten chunks, and at least a second (katgpucbf's `recv_sensor_timeout`).
pub fn rx_timeout(chunk_seconds: f64) -> Duration {
    Duration::from_secs_f64((10.0 * chunk_seconds).clamp(1.0, crate::engine::MAX_SECONDS))
}

/// Add the receive sensors for each prefix (`input0.` and `input1.` in the F-engine, `` in
/// the XB-engine); the timeouts to keep.
pub fn add_rx_sensors(sensors: &Sensors, prefixes: &[&str], timeout: Duration) -> Vec<Timeout> {
    let mut timeouts = Vec::new();
    for p in prefixes {
        let stamped = [
            (
                format!("{p}rx.timestamp"),
                "The timestamp (in samples) of the last chunk of data received",
                "integer",
                "-1",
            ),
            (
                format!("{p}rx.unixtime"),
                "The timestamp (in UNIX time) of the last chunk of data received",
                "timestamp",
                "-1.0",
            ),
        ];
        for (name, description, kind, value) in stamped {
            sensors.add(&name, description, "", kind, value);
            sensors.set(&name, value, Status::Error);
            timeouts.push(Timeout {
                sensor: name,
                after: timeout,
                to: Status::Error,
            });
        }
        let missing = format!("{p}rx.missing-unixtime");
        sensors.add(
            &missing,
            "The timestamp (in UNIX time) when missing data was last detected",
            "",
            "timestamp",
            "-1.0",
        );
        timeouts.push(Timeout {
            sensor: missing,
            after: timeout,
            to: Status::Nominal,
        });
    }
    sensors.add_discrete(
        "rx.device-status",
        "Engine is receiving a good, clean data stream",
        &DEVICE_STATUS,
        "ok",
    );
    timeouts
}

/// Add the clock and `device-status` sensors and start the thread that keeps them and
/// `timeouts`; it ends when the sensor table is dropped.
pub fn start(sensors: &Arc<Sensors>, timeouts: Vec<Timeout>) -> std::io::Result<()> {
    sensors.add(
        "time.esterror",
        "Estimated time synchronisation error",
        "s",
        "float",
        0.0,
    );
    sensors.add(
        "time.maxerror",
        "Upper bound on time synchronisation error",
        "s",
        "float",
        0.0,
    );
    sensors.add_discrete("time.state", "Kernel clock state", &CLOCK_STATES, "ok");
    sensors.add(
        "time.synchronised",
        "Whether the host clock is synchronised within tolerances",
        "",
        "boolean",
        1,
    );
    sensors.add_discrete(
        "device-status",
        "Overall engine health",
        &DEVICE_STATUS,
        "ok",
    );
    let weak = Arc::downgrade(sensors);
    update_clock(sensors);
    update_aggregates(sensors);
    std::thread::Builder::new()
        .name("health".into())
        .spawn(move || run(weak, timeouts))?;
    Ok(())
}

fn run(weak: Weak<Sensors>, timeouts: Vec<Timeout>) {
    let mut clock_read = Instant::now();
    loop {
        std::thread::sleep(TICK);
        let Some(sensors) = weak.upgrade() else {
            return;
        };
        apply_timeouts(&sensors, &timeouts, crate::engine::unix_now());
        if clock_read.elapsed() >= CLOCK_PERIOD {
            clock_read = Instant::now();
            update_clock(&sensors);
        }
        update_aggregates(&sensors);
    }
}

/// Change the status of every timed-out sensor (at UNIX time `now`), keeping its value.
pub fn apply_timeouts(sensors: &Sensors, timeouts: &[Timeout], now: f64) {
    for t in timeouts {
        let due = sensors.with(&t.sensor, |s| {
            (s.status != t.to && now - s.timestamp >= t.after.as_secs_f64())
                .then(|| s.value.clone())
        });
        if let Some(Some(value)) = due {
            sensors.set(&t.sensor, value, t.to);
        }
    }
}

/// `ok` and nominal while every sensor `counted` is nominal or unknown, else `degraded`
/// and warn.
fn aggregate(sensors: &Sensors, name: &str, counted: impl Fn(&str) -> bool) {
    let bad = sensors.any(|n, s| {
        !n.ends_with("device-status")
            && counted(n)
            && matches!(s.status, Status::Warn | Status::Error)
    });
    let (value, status) = if bad {
        ("degraded", Status::Warn)
    } else {
        ("ok", Status::Nominal)
    };
    if sensors.with(name, |s| s.value != value) == Some(true) {
        sensors.set(name, value, status);
    }
}

/// The receive sensors `rx.device-status` sums up (katgpucbf's `make_sensors` set).
const RX_SENSORS: [&str; 3] = ["rx.timestamp", "rx.unixtime", "rx.missing-unixtime"];

/// Bring `device-status` and `rx.device-status` up to the other sensors.
pub fn update_aggregates(sensors: &Sensors) {
    aggregate(sensors, "device-status", |_| true);
    aggregate(sensors, "rx.device-status", |n| {
        RX_SENSORS.iter().any(|s| n.ends_with(s))
    });
}

/// The status of an error in seconds against (warn, error) thresholds.
fn graded(seconds: f64, (warn, error): (f64, f64)) -> Status {
    if (0.0..warn).contains(&seconds) {
        Status::Nominal
    } else if seconds < error {
        Status::Warn
    } else {
        Status::Error
    }
}

/// Read the kernel clock's state (`adjtimex` in read-only mode) into the `time.*` sensors.
fn update_clock(sensors: &Sensors) {
    // SAFETY: timex is plain old data; with modes = 0 the call only reads the clock state
    // into it.
    let (state, tx) = unsafe {
        let mut tx: libc::timex = std::mem::zeroed();
        (libc::adjtimex(&mut tx), tx)
    };
    if state < 0 {
        sensors.set("time.state", "error", Status::Error);
        sensors.set("time.synchronised", 0, Status::Error);
        return;
    }
    let esterror = tx.esterror as f64 * 1e-6;
    let maxerror = tx.maxerror as f64 * 1e-6;
    let state_name = CLOCK_STATES.get(state as usize).copied().unwrap_or("error");
    let statuses = [
        graded(esterror, ESTERROR),
        graded(maxerror, MAXERROR),
        match state_name {
            "ok" => Status::Nominal,
            "error" => Status::Error,
            _ => Status::Warn, // a leap second in progress
        },
    ];
    sensors.set("time.esterror", esterror, statuses[0]);
    sensors.set("time.maxerror", maxerror, statuses[1]);
    sensors.set("time.state", state_name, statuses[2]);
    let good = !statuses.contains(&Status::Error);
    sensors.set(
        "time.synchronised",
        u8::from(good),
        if good { Status::Nominal } else { Status::Error },
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    /// katgpucbf's receive-sensor behaviour with a simulated clock: error until data, error
    /// again after the timeout without data; missing-unixtime back to nominal after it;
    /// the aggregates follow.
    #[test]
    fn timeouts_and_aggregates_follow_katgpucbf() {
        let s = Sensors::default();
        let timeouts = add_rx_sensors(&s, &["input0."], Duration::from_secs(2));
        s.add_discrete("device-status", "", &DEVICE_STATUS, "ok");
        update_aggregates(&s);
        assert_eq!(s.get("input0.rx.timestamp").unwrap().status, Status::Error);
        assert_eq!(s.get("rx.device-status").unwrap().value, "degraded");
        assert_eq!(s.get("device-status").unwrap().value, "degraded");
        let t0 = s.get("input0.rx.timestamp").unwrap().timestamp;
        s.set("input0.rx.timestamp", 4096, Status::Nominal);
        s.set("input0.rx.unixtime", 1.5, Status::Nominal);
        s.set("input0.rx.missing-unixtime", 1.5, Status::Error);
        update_aggregates(&s);
        assert_eq!(s.get("rx.device-status").unwrap().value, "degraded");
        // 1 s on: nothing times out.
        apply_timeouts(&s, &timeouts, t0 + 1.0);
        assert_eq!(
            s.get("input0.rx.missing-unixtime").unwrap().status,
            Status::Error
        );
        // 3 s on: the data sensors go to error, the missing one back to nominal.
        apply_timeouts(&s, &timeouts, t0 + 3.0);
        let got = |n: &str| s.get(n).unwrap();
        assert_eq!(got("input0.rx.timestamp").status, Status::Error);
        assert_eq!(got("input0.rx.timestamp").value, "4096");
        assert_eq!(got("input0.rx.missing-unixtime").status, Status::Nominal);
        // Fresh data and no missing: all good.
        s.set("input0.rx.timestamp", 8192, Status::Nominal);
        s.set("input0.rx.unixtime", 2.5, Status::Nominal);
        update_aggregates(&s);
        assert_eq!(got("rx.device-status").value, "ok");
        assert_eq!(got("device-status").value, "ok");
        assert_eq!(got("device-status").status, Status::Nominal);
        // Another sensor in error degrades the device, not the receiver (an XB-engine's
        // `{output}.rx.synchronised` is not one of the receive sensors).
        s.add("bl.rx.synchronised", "", "", "boolean", 0);
        s.set("bl.rx.synchronised", 0, Status::Error);
        update_aggregates(&s);
        assert_eq!(got("rx.device-status").value, "ok");
        assert_eq!(got("device-status").value, "degraded");
    }

    #[test]
    fn clock_errors_are_graded_with_katgpucbf_thresholds() {
        assert_eq!(graded(0.5e-3, ESTERROR), Status::Nominal);
        assert_eq!(graded(2e-3, ESTERROR), Status::Warn);
        assert_eq!(graded(5e-3, ESTERROR), Status::Error);
        assert_eq!(graded(-1.0, MAXERROR), Status::Warn);
        assert_eq!(graded(0.2, MAXERROR), Status::Error);
    }
}
