//! The XB-engine's katcp requests and sensors (katgpucbf xbgpu, facts §1.6, §1.7):
//! `?capture-start stream [timestamp]`, `?capture-stop stream`, `?beam-weights`,
//! `?beam-delays`, `?beam-quant-gains`, and cbf's `?frb-weights` and `?frb-beams` for
//! `--frb-beam` outputs ([`super::control_frb`]).
//! Requests change shared state that the processing
//! thread picks up at its next chunk; every malformed or impossible request gets a `fail`
//! naming what was wrong. Beam changes bump the steering version and move
//! `steady-state-timestamp` to the end of the chunk after the one being processed, the first
//! data guaranteed to reflect them.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use super::beams::{parse_delays, parse_gain, parse_weights, Steering};
use super::control_frb::FrbControl;
use super::frb_pointing::FrbPointing;
use super::frb_weights::{Channels, FrbWeights};
use crate::control::katcp::{Handler, Sensors, Status};
use crate::dsp::frb_resample::FrbBeams;

/// The correlation product and beam outputs' names.
#[derive(Debug, Clone, Default)]
pub struct OutputNames {
    pub corrprods: Vec<String>,
    pub beams: Vec<String>,
}

/// An `--frb-beam` output as the control side needs it.
#[derive(Debug, Clone)]
pub struct FrbSetup {
    pub name: String,
    /// The beams it starts with.
    pub beams: FrbBeams,
    /// Its dish grid (rows, cols) where `?frb-beams` must build the stage-2 table for the
    /// backend (the CPU's); `None` where the backend builds its own (CUDA).
    pub host_grid: Option<(usize, usize)>,
}

/// Whether an output sends, and from which timestamp.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capture {
    pub enabled: bool,
    pub from: u64,
}

impl Capture {
    /// Whether data with timestamp `ts` is sent.
    pub fn sends(&self, ts: u64) -> bool {
        self.enabled && ts >= self.from
    }
}

/// Shared between the katcp threads and the processing thread.
pub struct XbControl {
    pub sensors: Arc<Sensors>,
    n_ants: usize,
    /// Output names: correlation products first, then beams, then FRB beams.
    corrprods: Vec<String>,
    beams: Vec<String>,
    frb: Vec<String>,
    capture: Mutex<Vec<Capture>>,
    steering: Mutex<Steering>,
    frb_control: FrbControl,
    /// First timestamp a request made now is sure to affect (set by the processing thread).
    pub steady: AtomicU64,
}

pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Requests only replace whole values, so a poisoned lock still holds a consistent one.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl XbControl {
    /// The control state and its sensors. `chan_range` is this engine's (first, last) channel;
    /// `frb` the FRB outputs.
    pub fn new(
        sensors: Arc<Sensors>,
        n_ants: usize,
        names: OutputNames,
        frb: Vec<FrbSetup>,
        send_enabled: bool,
        chan_range: (u64, u64),
        dither_seed: u64,
    ) -> XbControl {
        let OutputNames { corrprods, beams } = names;
        let range = format!("({}, {})", chan_range.0, chan_range.1);
        sensors.add(
            "steady-state-timestamp",
            "Heaps with this timestamp or later reflect all earlier requests",
            "",
            "integer",
            0,
        );
        for name in &corrprods {
            sensors.add(
                &format!("{name}.chan-range"),
                "Channels of this output (first, last)",
                "",
                "string",
                &range,
            );
            sensors.add(
                &format!("{name}.rx.synchronised"),
                "For the latest accumulation, was data present from all F-engines",
                "",
                "boolean",
                0,
            );
            sensors.add(
                &format!("{name}.xeng-clip-cnt"),
                "Visibilities saturated on reduction to 32 bits",
                "",
                "integer",
                0,
            );
            sensors.add(
                &format!("{name}.tx.next-timestamp"),
                "Timestamp just after the last dump sent",
                "",
                "integer",
                0,
            );
        }
        let steering = Steering::new(beams.len(), n_ants);
        for (b, name) in beams.iter().enumerate() {
            sensors.add(
                &format!("{name}.chan-range"),
                "Channels of this output (first, last)",
                "",
                "string",
                &range,
            );
            sensors.add(
                &format!("{name}.dither-seed"),
                "Random seed used in dithering for quantisation",
                "",
                "integer",
                dither_seed,
            );
            sensors.add(
                &format!("{name}.delay"),
                "The delay settings of the inputs for this beam: (loadmcnt, delay0, phase0, delay1, phase1, ...)",
                "",
                "string",
                format_delays(0, &steering.delays[b]),
            );
            sensors.add(
                &format!("{name}.quantiser-gain"),
                "Non-complex post-summation quantiser gain applied to this beam",
                "",
                "float",
                steering.quant_gains[b],
            );
            sensors.add(
                &format!("{name}.weight"),
                "The summing weights applied to all the inputs of this beam",
                "",
                "string",
                format!("{:?}", steering.weights[b]),
            );
            sensors.add(
                &format!("{name}.beng-clip-cnt"),
                "Number of complex samples that saturated",
                "",
                "integer",
                0,
            );
            sensors.add(
                &format!("{name}.tx.next-timestamp"),
                "Timestamp just after the last heap sent",
                "",
                "integer",
                0,
            );
        }
        let channels = Channels {
            first: chan_range.0,
            count: (chan_range.1 - chan_range.0 + 1) as usize,
        };
        let frb_control = FrbControl::new(&sensors, &frb, n_ants, channels, &range);
        let frb: Vec<String> = frb.into_iter().map(|f| f.name).collect();
        let n = corrprods.len() + beams.len() + frb.len();
        XbControl {
            sensors,
            n_ants,
            frb_control,
            corrprods,
            beams,
            frb,
            capture: Mutex::new(vec![
                Capture {
                    enabled: send_enabled,
                    from: 0
                };
                n
            ]),
            steering: Mutex::new(steering),
            steady: AtomicU64::new(0),
        }
    }

    /// FRB output `i`'s weights, if their version differs from `version`.
    pub fn frb_weights_if_changed(&self, i: usize, version: u64) -> Option<FrbWeights> {
        self.frb_control.weights_if_changed(i, version)
    }

    /// FRB output `i`'s beam centres, if their version differs from `version`.
    pub fn frb_beams_if_changed(&self, i: usize, version: u64) -> Option<FrbPointing> {
        self.frb_control.beams_if_changed(i, version)
    }

    /// FRB output `i`'s beams as `listing` ([`FrbPointing::listing`]) are in force from the
    /// chunk at `timestamp` on (its `.beams` sensor).
    pub fn frb_beams_applied(&self, i: usize, timestamp: u64, listing: &str) {
        self.frb_control
            .beams_applied(&self.sensors, i, timestamp, listing);
    }

    /// Capture state of output `i` (correlation products first, then beams, then FRB beams).
    pub fn capture(&self) -> Vec<Capture> {
        lock(&self.capture).clone()
    }

    /// The steering, if its version differs from `version`.
    pub fn steering_if_changed(&self, version: u64) -> Option<Steering> {
        let s = lock(&self.steering);
        (s.version != version).then(|| s.clone())
    }

    fn stream(&self, name: &str) -> Result<usize, String> {
        self.corrprods
            .iter()
            .chain(&self.beams)
            .chain(&self.frb)
            .position(|n| n == name)
            .ok_or_else(|| format!("no output stream named {name:?}"))
    }

    fn beam(&self, name: &str) -> Result<usize, String> {
        self.beams
            .iter()
            .position(|n| n == name)
            .ok_or_else(|| format!("no beam named {name:?}"))
    }

    /// Apply a steering change and report the timestamp from which it holds.
    fn steer(&self, change: impl FnOnce(&mut Steering)) -> u64 {
        let mut s = lock(&self.steering);
        change(&mut s);
        s.version += 1;
        self.note_change()
    }

    /// Move `steady-state-timestamp` to where a change made now is in force; returns it.
    fn note_change(&self) -> u64 {
        let steady = self.steady.load(Ordering::Relaxed);
        let cur: u64 = self
            .sensors
            .get("steady-state-timestamp")
            .and_then(|s| s.value.parse().ok())
            .unwrap_or(0);
        self.sensors
            .set("steady-state-timestamp", cur.max(steady), Status::Nominal);
        steady
    }
}

fn format_delays(loadmcnt: u64, d: &[(f64, f64)]) -> String {
    let mut s = format!("({loadmcnt}");
    for (delay, phase) in d {
        s += &format!(", {delay:?}, {phase:?}");
    }
    s + ")"
}

impl Handler for XbControl {
    fn requests(&self) -> Vec<(&'static str, &'static str)> {
        vec![
            (
                "capture-start",
                "Start sending a stream: ?capture-start stream [timestamp]",
            ),
            (
                "capture-stop",
                "Stop sending a stream: ?capture-stop stream",
            ),
            (
                "beam-weights",
                "Set a beam's weights: ?beam-weights beam w0 w1 ...",
            ),
            (
                "beam-delays",
                "Set a beam's delays: ?beam-delays beam delay:phase ...",
            ),
            (
                "beam-quant-gains",
                "Set a beam's quantiser gain: ?beam-quant-gains beam gain",
            ),
            (
                "frb-weights",
                "Set or read an FRB beamformer's complex dish weights: ?frb-weights stream \
                 [channel=c|a:b] [w0 w1 ... (one per dish, or one per dish and pol)]",
            ),
            (
                "frb-beams",
                "Re-point or read an FRB beamformer's listed beams: ?frb-beams stream \
                 [theta0:theta'0 theta1:theta'1 ... (one per beam, as many as it has)]",
            ),
        ]
    }

    fn handle(&self, name: &str, args: &[String]) -> Option<Result<Vec<String>, String>> {
        let stream_arg = || {
            args.first()
                .ok_or_else(|| "missing stream name".to_string())
        };
        Some(match name {
            "capture-start" | "capture-stop" => (|| {
                let i = self.stream(stream_arg()?)?;
                let from = match (name, args.get(1)) {
                    ("capture-start", Some(t)) => t
                        .parse::<u64>()
                        .map_err(|_| format!("timestamp {t:?} is not a non-negative integer"))?,
                    ("capture-start", None) => 0,
                    (_, Some(_)) => return Err("capture-stop takes only the stream".into()),
                    (_, None) => 0,
                };
                if args.len() > 2 {
                    return Err("too many arguments".into());
                }
                lock(&self.capture)[i] = Capture {
                    enabled: name == "capture-start",
                    from,
                };
                Ok(vec![])
            })(),
            "beam-weights" => (|| {
                let b = self.beam(stream_arg()?)?;
                let w = parse_weights(&args[1..], self.n_ants)?;
                let text = format!("{w:?}");
                self.steer(|s| s.weights[b] = w);
                self.sensors
                    .set(&format!("{}.weight", self.beams[b]), text, Status::Nominal);
                Ok(vec![])
            })(),
            "beam-delays" => (|| {
                let b = self.beam(stream_arg()?)?;
                let d = parse_delays(&args[1..], self.n_ants)?;
                let text = |steady| format_delays(steady, &d);
                let steady = self.steer(|s| s.delays[b] = d.clone());
                self.sensors.set(
                    &format!("{}.delay", self.beams[b]),
                    text(steady),
                    Status::Nominal,
                );
                Ok(vec![])
            })(),
            "beam-quant-gains" => (|| {
                let b = self.beam(stream_arg()?)?;
                let [_, g] = args else {
                    return Err("expected: beam gain".into());
                };
                let g = parse_gain(g)?;
                self.steer(|s| s.quant_gains[b] = g);
                self.sensors.set(
                    &format!("{}.quantiser-gain", self.beams[b]),
                    g,
                    Status::Nominal,
                );
                Ok(vec![])
            })(),
            "frb-weights" => self
                .frb_control
                .weights_request(&self.sensors, args, || self.note_change()),
            "frb-beams" => self.frb_control.beams_request(args, || self.note_change()),
            _ => return None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use num_complex::Complex32;

    fn control() -> XbControl {
        XbControl::new(
            Arc::new(Sensors::default()),
            3,
            OutputNames {
                corrprods: vec!["bl".into()],
                beams: vec!["b0".into(), "b1".into()],
            },
            vec![FrbSetup {
                name: "f0".into(),
                beams: FrbBeams::even(1, 1, 1, 1),
                host_grid: None,
            }],
            false,
            (16, 19),
            42,
        )
    }

    fn call(c: &XbControl, name: &str, args: &[&str]) -> Result<Vec<String>, String> {
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        c.handle(name, &args).unwrap()
    }

    #[test]
    fn capture_is_per_stream_and_takes_a_start_timestamp() {
        let c = control();
        assert!(!c.capture()[0].sends(5));
        call(&c, "capture-start", &["bl", "1000"]).unwrap();
        assert!(!c.capture()[0].sends(999) && c.capture()[0].sends(1000));
        assert!(!c.capture()[2].sends(2000), "b1 untouched");
        call(&c, "capture-start", &["b1"]).unwrap();
        assert!(c.capture()[2].sends(0));
        call(&c, "capture-stop", &["bl"]).unwrap();
        assert!(!c.capture()[0].sends(5000));
        assert!(call(&c, "capture-start", &["nope"]).is_err());
        assert!(call(&c, "capture-start", &["bl", "-4"]).is_err());
        assert!(call(&c, "capture-stop", &[]).is_err());
    }

    #[test]
    fn beam_requests_bump_the_version_and_set_sensors() {
        let c = control();
        let v0 = c.steering_if_changed(0).unwrap().version;
        assert!(c.steering_if_changed(v0).is_none());
        c.steady.store(4096, Ordering::Relaxed);
        call(&c, "beam-weights", &["b1", "1", "0", "2"]).unwrap();
        let s = c.steering_if_changed(v0).unwrap();
        assert_eq!(s.weights[1], [1.0, 0.0, 2.0]);
        assert_eq!(c.sensors.get("b1.weight").unwrap().value, "[1.0, 0.0, 2.0]");
        assert_eq!(
            c.sensors.get("steady-state-timestamp").unwrap().value,
            "4096"
        );
        call(&c, "beam-delays", &["b0", "1e-9:0.5", "0:0", "0:0"]).unwrap();
        assert_eq!(
            c.sensors.get("b0.delay").unwrap().value,
            "(4096, 1e-9, 0.5, 0.0, 0.0, 0.0, 0.0)"
        );
        call(&c, "beam-quant-gains", &["b0", "0.5"]).unwrap();
        assert_eq!(c.steering_if_changed(0).unwrap().quant_gains, [0.5, 1.0]);
        assert!(call(&c, "beam-weights", &["b1", "1"])
            .unwrap_err()
            .contains("expected 3"));
        assert!(
            call(&c, "beam-weights", &["bl", "1", "1", "1"]).is_err(),
            "not a beam"
        );
        assert!(call(&c, "beam-quant-gains", &["b0"]).is_err());
        assert!(call(&c, "beam-delays", &["b0", "x", "0:0", "0:0"]).is_err());
        assert!(c.handle("gain", &[]).is_none());
    }

    #[test]
    fn frb_weights_are_checked_and_versioned() {
        let c = control();
        let one = Complex32::new(1.0, 0.0);
        let v0 = c.frb_weights_if_changed(0, 0).unwrap();
        // (channel, dish, pol): 4 channels (16 … 19) of 3 dishes.
        assert_eq!(v0.weights, [one; 4 * 3 * 2]);
        assert!(c.frb_weights_if_changed(0, v0.version).is_none());
        c.steady.store(8192, Ordering::Relaxed);
        // The old form: one per dish, both pols, every channel.
        call(&c, "frb-weights", &["f0", "1", "0.5-2j", "-1j"]).unwrap();
        let w = c.frb_weights_if_changed(0, v0.version).unwrap();
        let per_dish = [one, Complex32::new(0.5, -2.0), Complex32::new(0.0, -1.0)];
        for (k, v) in w.weights.iter().enumerate() {
            assert_eq!(*v, per_dish[k / 2 % 3], "value {k}");
        }
        assert_eq!(
            c.sensors.get("f0.weight").unwrap().value,
            "[1.0+0.0j, 0.5-2.0j, 0.0-1.0j]"
        );
        assert_eq!(
            c.sensors.get("steady-state-timestamp").unwrap().value,
            "8192"
        );
        // Per (dish, pol) in every channel, then channel 18's own.
        call(&c, "frb-weights", &["f0", "1", "2", "3", "4", "5", "6"]).unwrap();
        assert_eq!(
            c.sensors.get("f0.weight").unwrap().value,
            "[1.0+0.0j, 2.0+0.0j, 3.0+0.0j, 4.0+0.0j, 5.0+0.0j, 6.0+0.0j]"
        );
        call(
            &c,
            "frb-weights",
            &["f0", "channel=18", "1j", "2j", "3j", "4j", "5j", "6j"],
        )
        .unwrap();
        let w2 = c.frb_weights_if_changed(0, w.version).unwrap();
        assert_eq!(w2.version, w.version + 2);
        assert_eq!(w2.weights[(2 * 3 + 1) * 2 + 1], Complex32::new(0.0, 4.0));
        assert_eq!(w2.weights[(3 * 3 + 1) * 2 + 1], Complex32::new(4.0, 0.0));
        let six = "[1.0+0.0j, 2.0+0.0j, 3.0+0.0j, 4.0+0.0j, 5.0+0.0j, 6.0+0.0j]";
        let sixj = "[0.0+1.0j, 0.0+2.0j, 0.0+3.0j, 0.0+4.0j, 0.0+5.0j, 0.0+6.0j]";
        assert_eq!(
            c.sensors.get("f0.weight").unwrap().value,
            format!("channels 16:18 {six}; channels 18:19 {sixj}; channels 19:20 {six}")
        );
        // Reads: a channel's, and a range's or every channel's only while they agree.
        assert_eq!(
            call(&c, "frb-weights", &["f0", "channel=19"]).unwrap(),
            ["1.0+0.0j", "2.0+0.0j", "3.0+0.0j", "4.0+0.0j", "5.0+0.0j", "6.0+0.0j"]
        );
        assert_eq!(
            call(&c, "frb-weights", &["f0", "channel=16:18"]).unwrap(),
            call(&c, "frb-weights", &["f0", "channel=19:"]).unwrap()
        );
        assert_eq!(
            call(&c, "frb-weights", &["f0"]).unwrap_err(),
            "the weights of channels 16 and 18 differ: name a run of equal weights with \
             channel=a:b (f0.weight lists them)"
        );
        assert!(call(&c, "frb-weights", &["f0", "channel=17:20"])
            .unwrap_err()
            .contains("channels 17 and 18 differ"));
        // A range set: one version, the channels outside it untouched.
        call(
            &c,
            "frb-weights",
            &["f0", "channel=17:19", "2", "-1", "0.5j"],
        )
        .unwrap();
        let w3 = c.frb_weights_if_changed(0, w2.version).unwrap();
        assert_eq!(w3.version, w2.version + 1);
        // (channel, dish, pol): dish 2, pol 1 of local channels 0 … 3.
        let at = |ch: usize| w3.weights[(ch * 3 + 2) * 2 + 1];
        assert_eq!(at(0), Complex32::new(6.0, 0.0));
        assert_eq!(at(1), Complex32::new(0.0, 0.5));
        assert_eq!(at(2), Complex32::new(0.0, 0.5));
        assert_eq!(at(3), Complex32::new(6.0, 0.0));
        assert_eq!(
            c.sensors.get("f0.weight").unwrap().value,
            format!(
                "channels 16:17 {six}; channels 17:19 [2.0+0.0j, -1.0+0.0j, 0.0+0.5j]; \
                 channels 19:20 {six}"
            )
        );
        assert_eq!(
            call(&c, "frb-weights", &["f0", "channel=17:19"]).unwrap(),
            [
                "2.0+0.0j",
                "2.0+0.0j",
                "-1.0+0.0j",
                "-1.0+0.0j",
                "0.0+0.5j",
                "0.0+0.5j"
            ]
        );
        for bad in [
            &["f0", "1", "1"][..],
            &["f0", "1", "1", "1", "1"],
            &["f0", "1", "x", "1"],
            &["f0", "1", "nan", "1"],
            &["f0", "channel=20", "1", "1", "1"],
            &["f0", "channel=15"],
            &["f0", "channel=18:21"],
            &["f0", "channel=18:18", "1", "1", "1"],
            &["f0", "channel=18-19", "1", "1", "1"],
            &["b0", "1", "1", "1"],
            &[],
        ] {
            assert!(call(&c, "frb-weights", bad).is_err(), "{bad:?}");
        }
        assert!(call(&c, "frb-weights", &["f0", "1"])
            .unwrap_err()
            .contains("expected 3 or 6"));
        assert_eq!(c.frb_weights_if_changed(0, 0).unwrap().version, w3.version);
        call(&c, "capture-stop", &["f0"]).unwrap();
        assert!(!c.capture()[3].sends(0));
    }
}
