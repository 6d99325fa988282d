//! The F-engine's katcp requests and sensors (katgpucbf fgpu, facts §1.6, §1.7;
//! fengine_delay_convention.md §1, §5, §6): `?gain`, `?gain-all`, `?delays`,
//! `?capture-start`, `?capture-stop`. Requests change shared state that the processing thread
//! picks up at its next chunk; every malformed or impossible request gets a `fail` naming what
//! was wrong, and the engine keeps running.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use num_complex::Complex32;

use crate::control::katcp::{Handler, Sensors, Status};
use crate::dsp::delay::{LinearDelayModel, MAX_QUEUED_MODELS};

/// What one output's requests have set, picked up by the processing thread.
#[derive(Debug, Clone)]
pub struct OutputState {
    pub name: String,
    pub channels: usize,
    pub gains: [Vec<Complex32>; 2],
    /// Bumped on every gain change, so the pipeline copies only when needed.
    pub gains_version: u64,
    /// Models loaded but not yet handed to the pipeline.
    pub new_delays: [Vec<LinearDelayModel>; 2],
    pub capture: bool,
    pub default_gain: Complex32,
}

/// Shared between the katcp threads and the processing thread.
pub struct EngineControl {
    pub outputs: Vec<Mutex<OutputState>>,
    pub sensors: Arc<Sensors>,
    pub adc_sample_rate: f64,
    pub sync_time: f64,
    /// Timestamp up to which output has been assembled (set by the processing thread).
    pub processed: AtomicU64,
    /// Span of one input chunk in samples (the latency of a change).
    pub chunk_samples: u64,
}

/// Parse a complex number as katcp/Python writes it: `1.5`, `0.5+0.25j`, `-2j`.
pub fn parse_complex(text: &str) -> Option<Complex32> {
    let t = text.trim().trim_start_matches('(').trim_end_matches(')');
    if let Some(body) = t.strip_suffix('j') {
        // Split at the last sign that is not an exponent sign or the leading sign.
        let bytes = body.as_bytes();
        let split = (1..bytes.len()).rev().find(|&i| {
            (bytes[i] == b'+' || bytes[i] == b'-') && !matches!(bytes[i - 1], b'e' | b'E')
        });
        return match split {
            Some(i) => Some(Complex32::new(
                body[..i].parse().ok()?,
                body[i..].parse().ok()?,
            )),
            None => Some(Complex32::new(
                0.0,
                if body.is_empty() || body == "+" {
                    1.0
                } else {
                    body.parse().ok()?
                },
            )),
        };
    }
    t.parse::<f32>().ok().map(|re| Complex32::new(re, 0.0))
}

/// Python's `format(x, ".17g")`: 17 significant digits, trailing zeros dropped, scientific
/// notation for exponents below −4 or from 17 (two-digit exponent with its sign).
fn format_g17(x: f64) -> String {
    if x == 0.0 || !x.is_finite() {
        return match x {
            v if v.is_nan() => "nan".into(),
            v if v.is_infinite() => if v > 0.0 { "inf" } else { "-inf" }.into(),
            v if v.is_sign_negative() => "-0".into(),
            _ => "0".into(),
        };
    }
    // Correctly rounded to 17 significant digits, as Python rounds them.
    let sci = format!("{:.16e}", x.abs());
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    let trim = |s: String| {
        if s.contains('.') {
            s.trim_end_matches('0').trim_end_matches('.').to_string()
        } else {
            s
        }
    };
    let body = if (-4..17).contains(&exp) {
        if exp >= 0 {
            let (int, frac) = digits.split_at(exp as usize + 1);
            trim(format!("{int}.{frac}"))
        } else {
            trim(format!("0.{}{digits}", "0".repeat((-exp - 1) as usize)))
        }
    } else {
        let (first, rest) = digits.split_at(1);
        let sign = if exp < 0 { '-' } else { '+' };
        format!("{}e{sign}{:02}", trim(format!("{first}.{rest}")), exp.abs())
    };
    if x < 0.0 {
        format!("-{body}")
    } else {
        body
    }
}

/// katgpucbf's `format_complex` (fgpu `engine.py`): Python's `format(z, ".17g")` of the
/// complex64 gain widened to double, so that a client reading both engines sees the same text.
fn format_complex(c: Complex32) -> String {
    let (re, im) = (f64::from(c.re), f64::from(c.im));
    let sign = if im.is_sign_negative() { "" } else { "+" };
    format!("{}{sign}{}j", format_g17(re), format_g17(im))
}

/// The `{stream}.input{p}.eq` sensor as katgpucbf sets it: every channel's gain, `[g0, g1, …]`.
fn eq_sensor(g: &[Complex32]) -> String {
    let all: Vec<String> = g.iter().map(|&c| format_complex(c)).collect();
    format!("[{}]", all.join(", "))
}

impl EngineControl {
    pub fn new(
        outputs: Vec<OutputState>,
        sensors: Arc<Sensors>,
        adc_sample_rate: f64,
        sync_time: f64,
        chunk_samples: u64,
    ) -> EngineControl {
        sensors.add(
            "steady-state-timestamp",
            "Heaps with this timestamp or later reflect all earlier requests",
            "",
            "integer",
            0,
        );
        for p in 0..2 {
            sensors.add(
                &format!("input{p}.dig-clip-cnt"),
                "Digitiser samples saturated (from digitiser_status)",
                "",
                "integer",
                0,
            );
            sensors.add(
                &format!("input{p}.dig-rms-dbfs"),
                "Digitiser RMS relative to full scale",
                "dBFS",
                "float",
                "nan",
            );
        }
        for o in &outputs {
            for p in 0..2 {
                sensors.add(
                    &format!("{}.input{p}.eq", o.name),
                    "Complex gain per channel (one value when all equal)",
                    "",
                    "string",
                    eq_sensor(&o.gains[p]),
                );
                sensors.add(
                    &format!("{}.input{p}.delay", o.name),
                    "(loadmcnt, delay s, delay rate, phase rad, phase rate rad/s)",
                    "",
                    "string",
                    "(0, 0.0, 0.0, 0.0, 0.0)",
                );
            }
        }
        EngineControl {
            outputs: outputs.into_iter().map(Mutex::new).collect(),
            sensors,
            adc_sample_rate,
            sync_time,
            processed: AtomicU64::new(0),
            chunk_samples,
        }
    }

    fn output(&self, name: &str) -> Result<&Mutex<OutputState>, String> {
        self.outputs
            .iter()
            .find(|o| o.lock().map(|o| o.name == name).unwrap_or(false))
            .ok_or_else(|| format!("no output stream named {name:?}"))
    }

    /// A change is in effect from the next chunk not yet processed.
    fn bump_steady_state(&self) {
        // Saturating: `processed` follows input timestamps, which come from outside.
        let at = self
            .processed
            .load(Ordering::Relaxed)
            .saturating_add(self.chunk_samples.saturating_mul(2));
        let old = self
            .sensors
            .get("steady-state-timestamp")
            .and_then(|s| s.value.parse::<u64>().ok())
            .unwrap_or(0);
        self.sensors
            .set("steady-state-timestamp", at.max(old), Status::Nominal);
    }

    fn parse_gains(
        values: &[String],
        channels: usize,
        default: Complex32,
    ) -> Result<Vec<Complex32>, String> {
        if values.len() == 1 && values[0] == "default" {
            return Ok(vec![default; channels]);
        }
        let g: Vec<Complex32> = values
            .iter()
            .map(|v| {
                parse_complex(v).ok_or_else(|| "invalid formatting of complex number".to_string())
            })
            .collect::<Result<_, _>>()?;
        if g.iter().any(|c| !c.re.is_finite() || !c.im.is_finite()) {
            return Err("non-finite gains are not permitted".into());
        }
        match g.len() {
            1 => Ok(vec![g[0]; channels]),
            n if n == channels => Ok(g),
            n => Err(format!("expected 1 or {channels} values, received {n}")),
        }
    }

    fn gain(&self, args: &[String]) -> Result<Vec<String>, String> {
        let [stream, input, values @ ..] = args else {
            return Err("usage: ?gain stream input [value...]".into());
        };
        let pol: usize = match input.as_str() {
            "0" => 0,
            "1" => 1,
            _ => return Err(format!("input {input:?} must be 0 or 1")),
        };
        let out = self.output(stream)?;
        let mut o = out.lock().map_err(|_| "state poisoned".to_string())?;
        if values.is_empty() {
            // One value per channel, as katgpucbf replies.
            return Ok(o.gains[pol].iter().map(|&g| format_complex(g)).collect());
        }
        let g = Self::parse_gains(values, o.channels, o.default_gain)?;
        o.gains[pol] = g;
        o.gains_version += 1;
        self.sensors.set(
            &format!("{}.input{pol}.eq", o.name),
            eq_sensor(&o.gains[pol]),
            Status::Nominal,
        );
        drop(o);
        self.bump_steady_state();
        Ok(vec![])
    }

    fn gain_all(&self, args: &[String]) -> Result<Vec<String>, String> {
        let [stream, values @ ..] = args else {
            return Err("usage: ?gain-all stream value...|default".into());
        };
        if values.is_empty() {
            return Err("no gains given".into());
        }
        let out = self.output(stream)?;
        let mut o = out.lock().map_err(|_| "state poisoned".to_string())?;
        let g = Self::parse_gains(values, o.channels, o.default_gain)?;
        for pol in 0..2 {
            o.gains[pol] = g.clone();
            self.sensors.set(
                &format!("{}.input{pol}.eq", o.name),
                eq_sensor(&g),
                Status::Nominal,
            );
        }
        o.gains_version += 1;
        drop(o);
        self.bump_steady_state();
        Ok(vec![])
    }

    fn delays(&self, args: &[String]) -> Result<Vec<String>, String> {
        let [stream, start, models @ ..] = args else {
            return Err("usage: ?delays stream start \"d,dr:p,pr\" \"d,dr:p,pr\"".into());
        };
        if models.len() != 2 {
            return Err(format!(
                "expected 2 delay models, received {}",
                models.len()
            ));
        }
        let start: f64 = start
            .parse()
            .map_err(|_| format!("start time {start:?} is not a number"))?;
        let mut parsed = Vec::new();
        for m in models {
            let bad = || format!("delay model {m:?} is not of the form d,dr:p,pr");
            let (delay, phase) = m.split_once(':').ok_or_else(bad)?;
            let (d, dr) = delay.split_once(',').ok_or_else(bad)?;
            let (p, pr) = phase.split_once(',').ok_or_else(bad)?;
            let v: Vec<f64> = [d, dr, p, pr]
                .iter()
                .map(|s| s.trim().parse::<f64>().map_err(|_| bad()))
                .collect::<Result<_, _>>()?;
            parsed.push(
                LinearDelayModel::from_request(
                    start,
                    self.sync_time,
                    self.adc_sample_rate,
                    v[0],
                    v[1],
                    v[2],
                    v[3],
                )
                .map_err(|e| e.to_string())?,
            );
        }
        let out = self.output(stream)?;
        let mut o = out.lock().map_err(|_| "state poisoned".to_string())?;
        // A new model replaces queued ones that start at or after it (as the pipeline's
        // queue does), and the queue is bounded: a client cannot grow it without end while
        // the processing thread is not picking models up.
        for (pol, m) in parsed.iter().enumerate() {
            if o.new_delays[pol].iter().filter(|q| q.t0 < m.t0).count() >= MAX_QUEUED_MODELS {
                return Err(format!(
                    "more than {MAX_QUEUED_MODELS} delay models are waiting to take effect"
                ));
            }
        }
        for (pol, m) in parsed.into_iter().enumerate() {
            o.new_delays[pol].retain(|q| q.t0 < m.t0);
            o.new_delays[pol].push(m);
        }
        drop(o);
        self.bump_steady_state();
        Ok(vec![])
    }

    fn capture(&self, args: &[String], on: bool) -> Result<Vec<String>, String> {
        let [stream] = args else {
            return Err(format!(
                "usage: ?capture-{} stream",
                if on { "start" } else { "stop" }
            ));
        };
        let out = self.output(stream)?;
        out.lock()
            .map_err(|_| "state poisoned".to_string())?
            .capture = on;
        self.bump_steady_state();
        Ok(vec![])
    }

    /// Update the input statistics after a chunk: saturated samples so far, and the RMS
    /// level (katgpucbf: nominal within −30…−10 dBFS, warn outside, error beyond −33/−7).
    pub fn input_stats(
        &self,
        timestamp: u64,
        clipped: [u64; 2],
        mean_power: [Option<f64>; 2],
        sample_bits: u32,
        missing: [bool; 2],
    ) {
        // katgpucbf's scale (fgpu `_update_dig_power_sensors`): 0 dBFS is a sine wave at full
        // scale, power (2^(b−1) − 1)² / 2.
        let full = f64::from((1u32 << (sample_bits - 1)) - 1);
        let full_scale_power = full * full / 2.0;
        let unix = format!(
            "{:.6}",
            self.sync_time + timestamp as f64 / self.adc_sample_rate
        );
        for p in 0..2 {
            // katgpucbf's per-input receive sensors (`recv.py`); `engine::health` times them out.
            self.sensors.set(
                &format!("input{p}.rx.timestamp"),
                timestamp,
                Status::Nominal,
            );
            self.sensors
                .set(&format!("input{p}.rx.unixtime"), &unix, Status::Nominal);
            if missing[p] {
                self.sensors.set(
                    &format!("input{p}.rx.missing-unixtime"),
                    &unix,
                    Status::Error,
                );
            }
            self.sensors.set(
                &format!("input{p}.dig-clip-cnt"),
                clipped[p],
                Status::Nominal,
            );
            if let Some(pw) = mean_power[p] {
                let dbfs = 10.0 * (pw.max(1e-30) / full_scale_power).log10();
                let status = if (-30.0..=-10.0).contains(&dbfs) {
                    Status::Nominal
                } else if (-33.0..=-7.0).contains(&dbfs) {
                    Status::Warn
                } else {
                    Status::Error
                };
                self.sensors.set(
                    &format!("input{p}.dig-rms-dbfs"),
                    format!("{dbfs:.3}"),
                    status,
                );
            }
        }
    }

    /// Update the delay sensor when a model becomes the current one (called by the processing thread).
    pub fn delay_in_effect(&self, output: &str, pol: usize, m: &LinearDelayModel) {
        let (d, dr, p, pr) = m.request;
        self.sensors.set(
            &format!("{output}.input{pol}.delay"),
            format!("({}, {d}, {dr}, {p}, {pr})", m.t0),
            Status::Nominal,
        );
    }
}

impl Handler for EngineControl {
    fn requests(&self) -> Vec<(&'static str, &'static str)> {
        vec![
            (
                "gain",
                "Read or set per-channel gains: ?gain stream input [value...]",
            ),
            (
                "gain-all",
                "Set the gains of both inputs: ?gain-all stream value...|default",
            ),
            (
                "delays",
                "Load delay models: ?delays stream start \"d,dr:p,pr\" \"d,dr:p,pr\"",
            ),
            (
                "capture-start",
                "Start sending an output: ?capture-start stream",
            ),
            (
                "capture-stop",
                "Stop sending an output: ?capture-stop stream",
            ),
        ]
    }

    fn handle(&self, name: &str, args: &[String]) -> Option<Result<Vec<String>, String>> {
        Some(match name {
            "gain" => self.gain(args),
            "gain-all" => self.gain_all(args),
            "delays" => self.delays(args),
            "capture-start" => self.capture(args, true),
            "capture-stop" => self.capture(args, false),
            _ => return None,
        })
    }
}

#[cfg(test)]
mod tests {
    /// Python's own output (`format(float(v), ".17g")`, numpy for the float32 values).
    #[test]
    fn complex_values_format_as_python_does() {
        let cases = [
            (0.02f32 as f64, "0.019999999552965164"),
            (1.0, "1"),
            (-2.25, "-2.25"),
            (1e-5, "1.0000000000000001e-05"),
            (1.2345678901234568e17, "1.2345678901234568e+17"),
            (1e16, "10000000000000000"),
            (1e17, "1e+17"),
            (-0.0, "-0"),
            (0.0, "0"),
            (0.1f32 as f64, "0.10000000149011612"),
            (3.0000000000000004, "3.0000000000000004"),
            (1e-4, "0.0001"),
            (0.00012345678901234567, "0.00012345678901234567"),
        ];
        for (v, want) in cases {
            assert_eq!(format_g17(v), want, "{v:e}");
        }
        assert_eq!(format_complex(Complex32::new(1.0, -0.0)), "1-0j");
        assert_eq!(format_complex(Complex32::new(0.0, 2.0)), "0+2j");
        assert_eq!(format_complex(Complex32::new(-0.5, -2.0)), "-0.5-2j");
        assert_eq!(
            format_complex(Complex32::new(0.02, 0.5)),
            "0.019999999552965164+0.5j"
        );
        assert_eq!(
            eq_sensor(&[Complex32::new(1.0, 0.0), Complex32::new(0.5, 0.0)]),
            "[1+0j, 0.5+0j]"
        );
    }

    use super::*;

    #[test]
    fn complex_numbers_as_katcp_writes_them() {
        assert_eq!(parse_complex("1.5"), Some(Complex32::new(1.5, 0.0)));
        assert_eq!(parse_complex("0.5+0.25j"), Some(Complex32::new(0.5, 0.25)));
        assert_eq!(parse_complex("(1-2j)"), Some(Complex32::new(1.0, -2.0)));
        assert_eq!(parse_complex("-2j"), Some(Complex32::new(0.0, -2.0)));
        assert_eq!(
            parse_complex("1e-3+1e+2j"),
            Some(Complex32::new(1e-3, 100.0))
        );
        assert_eq!(parse_complex("x"), None);
    }

    /// An engine control with one 8-channel output named "wide", sync time 1000 s, 1712 MHz.
    fn control() -> EngineControl {
        let out = OutputState {
            name: "wide".into(),
            channels: 8,
            gains: [
                vec![Complex32::new(1.0, 0.0); 8],
                vec![Complex32::new(1.0, 0.0); 8],
            ],
            gains_version: 0,
            new_delays: [vec![], vec![]],
            capture: false,
            default_gain: Complex32::new(1.0, 0.0),
        };
        EngineControl::new(
            vec![out],
            Arc::new(Sensors::default()),
            1712e6,
            1000.0,
            1 << 20,
        )
    }

    fn delays(c: &EngineControl, start: &str, m: &str) -> Result<Vec<String>, String> {
        let args: Vec<String> = vec!["wide".into(), start.into(), m.into(), m.into()];
        c.handle("delays", &args).unwrap()
    }

    #[test]
    fn delays_out_of_bounds_fail_naming_the_value() {
        let c = control();
        assert_eq!(delays(&c, "1001", "79.53e-6,2.56e-9:3.0,49.22"), Ok(vec![]));
        for (m, needle) in [
            ("1e30,0:0,0", "delay 1000000000000000000000000000000 s"),
            ("0,0.5:0,0", "delay rate 0.5"),
            ("0,0:1e300,0", "phase 1000000"),
            ("0,0:0,-1e12", "phase rate -1000000000000"),
            ("0,0:nan,0", "finite"),
        ] {
            let e = delays(&c, "1001", m).unwrap_err();
            assert!(e.contains(needle), "{m}: {e}");
        }
        let e = delays(&c, "1e300", "0,0:0,0").unwrap_err();
        assert!(e.contains("too far after"), "{e}");
    }

    #[test]
    fn queued_delay_models_are_bounded() {
        let c = control();
        for k in 0..MAX_QUEUED_MODELS {
            assert_eq!(delays(&c, &format!("{}", 1001 + k), "0,0:0,0"), Ok(vec![]));
        }
        let e = delays(&c, "5000", "0,0:0,0").unwrap_err();
        assert!(e.contains("waiting"), "{e}");
        // A model at or before the queued ones replaces them, so it is accepted.
        assert_eq!(delays(&c, "1001", "0,0:0,0"), Ok(vec![]));
        assert_eq!(c.outputs[0].lock().unwrap().new_delays[0].len(), 1);
    }
}
