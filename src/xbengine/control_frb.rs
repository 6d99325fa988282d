//! The katcp side of the XB-engine's `--frb-beam` outputs: their sensors, cbf's `?frb-weights`
//! ([`super::frb_weights`]) and `?frb-beams` ([`super::frb_pointing`]) requests, and the
//! versioned state the processing thread picks up at its next chunk ([`super::frb`]). A set
//! moves `steady-state-timestamp` as every other change does ([`super::control`]); the
//! `{name}.beams` sensor is set by the processing thread when a re-point takes effect, with
//! the timestamp of the chunk it is in force from. A re-point's costly parts (the CPU
//! backend's table, ~0.5 s for thousands of beams, and the sensor's text) are made here,
//! on the katcp thread, before the reply.

use std::sync::{Arc, Mutex};

use super::control::{lock, FrbSetup};
use super::frb_pointing::{self, format_position, listing, FrbBeamsRequest, FrbPointing};
use super::frb_weights::{self, format_weight, Channels, FrbWeights, FrbWeightsRequest};
use crate::control::katcp::{Sensors, Status};
use crate::dsp::frb_resample::{FrbBeams, Resample};

/// The FRB outputs' shared state.
pub(super) struct FrbControl {
    names: Vec<String>,
    /// Per output, the dish grid (rows, cols) whose table a re-point builds (`None`: the
    /// backend builds its own from the positions).
    host_grids: Vec<Option<(usize, usize)>>,
    n_ants: usize,
    /// This engine's channels (`chan-range`).
    channels: Channels,
    weights: Mutex<Vec<FrbWeights>>,
    pointing: Mutex<Vec<FrbPointing>>,
}

impl FrbControl {
    /// The outputs `setups`, and their sensors; `range` is the `chan-range` sensor's text.
    pub(super) fn new(
        sensors: &Sensors,
        setups: &[FrbSetup],
        n_ants: usize,
        channels: Channels,
        range: &str,
    ) -> FrbControl {
        let names: Vec<String> = setups.iter().map(|s| s.name.clone()).collect();
        let weights = FrbWeights::ones(channels.count, n_ants);
        let pointing: Vec<FrbPointing> = setups
            .iter()
            .map(|s| FrbPointing::new(&s.beams, &s.name))
            .collect();
        for (name, p) in names.iter().zip(&pointing) {
            sensors.add(
                &format!("{name}.chan-range"),
                "Channels of this output (first, last)",
                "",
                "string",
                range,
            );
            sensors.add(
                &format!("{name}.weight"),
                "The complex weights applied to the dishes of this FRB beamformer",
                "",
                "string",
                weights.describe(channels, name),
            );
            sensors.add(
                &format!("{name}.beams"),
                "The beam centres and the timestamp they are in force from: \
                 (timestamp, theta0, theta'0, theta1, theta'1, ...)",
                "",
                "string",
                frb_pointing::sensor_value(0, &p.listing),
            );
            sensors.add(
                &format!("{name}.frb-clip-cnt"),
                "Number of intensities that saturated float16",
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
        FrbControl {
            weights: Mutex::new(vec![weights; names.len()]),
            pointing: Mutex::new(pointing),
            host_grids: setups.iter().map(|s| s.host_grid).collect(),
            names,
            n_ants,
            channels,
        }
    }

    /// Output `name`'s index.
    fn output(&self, name: &str) -> Result<usize, String> {
        self.names
            .iter()
            .position(|n| n == name)
            .ok_or_else(|| format!("no FRB beam output named {name:?}"))
    }

    /// Output `i`'s weights, if their version differs from `version`.
    pub(super) fn weights_if_changed(&self, i: usize, version: u64) -> Option<FrbWeights> {
        let w = lock(&self.weights);
        w.get(i).filter(|w| w.version != version).cloned()
    }

    /// Output `i`'s beam centres, if their version differs from `version`.
    pub(super) fn beams_if_changed(&self, i: usize, version: u64) -> Option<FrbPointing> {
        let p = lock(&self.pointing);
        p.get(i).filter(|p| p.version != version).cloned()
    }

    /// Output `i`'s beams as `listing` ([`FrbPointing::listing`]) are in force from the chunk
    /// at `timestamp` on: its `{name}.beams`.
    pub(super) fn beams_applied(&self, sensors: &Sensors, i: usize, timestamp: u64, listing: &str) {
        if let Some(name) = self.names.get(i) {
            sensors.set(
                &format!("{name}.beams"),
                frb_pointing::sensor_value(timestamp, listing),
                Status::Nominal,
            );
        }
    }

    /// `?frb-weights stream …` (`args` from the stream name on); `note_change` moves
    /// `steady-state-timestamp` after a set.
    pub(super) fn weights_request(
        &self,
        sensors: &Sensors,
        args: &[String],
        note_change: impl FnOnce() -> u64,
    ) -> Result<Vec<String>, String> {
        let name = args.first().ok_or("missing stream name")?;
        let i = self.output(name)?;
        match frb_weights::parse_request(&args[1..], self.n_ants, self.channels)? {
            FrbWeightsRequest::Get { channels } => {
                let all = lock(&self.weights);
                let w = all[i].get(channels.clone()).map_err(|c| {
                    format!(
                        "the weights of channels {} and {} differ: name a run of equal \
                         weights with channel=a:b ({name}.weight lists them)",
                        self.channels.band(channels.start),
                        self.channels.band(c)
                    )
                })?;
                Ok(w.iter().map(format_weight).collect())
            }
            FrbWeightsRequest::Set { channels, weights } => {
                let text = {
                    let mut all = lock(&self.weights);
                    all[i].set(channels, &weights);
                    all[i].describe(self.channels, name)
                };
                note_change();
                sensors.set(&format!("{name}.weight"), text, Status::Nominal);
                Ok(vec![])
            }
        }
    }

    /// `?frb-beams stream …` (`args` from the stream name on); `note_change` moves
    /// `steady-state-timestamp` after a re-point.
    pub(super) fn beams_request(
        &self,
        args: &[String],
        note_change: impl FnOnce() -> u64,
    ) -> Result<Vec<String>, String> {
        let name = args.first().ok_or("missing stream name")?;
        let i = self.output(name)?;
        let now = lock(&self.pointing)[i].clone();
        match frb_pointing::parse_request(&args[1..], &now, name)? {
            FrbBeamsRequest::Get => Ok(now.positions.iter().map(format_position).collect()),
            FrbBeamsRequest::Set(positions) => {
                // Off the processing thread, which only swaps them in.
                let table = self.host_grids[i].map(|(m, n)| {
                    Arc::new(Resample::new(m, n, &FrbBeams::List(positions.clone())))
                });
                let listing = listing(&positions, name).into();
                {
                    let mut all = lock(&self.pointing);
                    let p = &mut all[i];
                    p.positions = positions;
                    p.listing = listing;
                    p.table = table;
                    p.version += 1;
                }
                note_change();
                Ok(vec![])
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn control(sensors: &Sensors) -> FrbControl {
        FrbControl::new(
            sensors,
            &[
                FrbSetup {
                    name: "grid".into(),
                    beams: FrbBeams::even(2, 3, 2, 1),
                    host_grid: Some((2, 3)),
                },
                FrbSetup {
                    name: "list".into(),
                    beams: FrbBeams::List(vec![(0.5, -1.0), (2.0, 0.25)]),
                    host_grid: Some((1, 2)),
                },
            ],
            4,
            Channels { first: 8, count: 2 },
            "(8, 9)",
        )
    }

    fn call(c: &FrbControl, args: &[&str], steady: &mut u64) -> Result<Vec<String>, String> {
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        c.beams_request(&args, || {
            *steady += 1;
            *steady
        })
    }

    #[test]
    fn a_list_is_repointed_and_versioned_and_reads_back() {
        let sensors = Sensors::default();
        let c = control(&sensors);
        let mut steady = 0;
        assert_eq!(
            sensors.get("list.beams").unwrap().value,
            "(0, 0.5, -1.0, 2.0, 0.25)"
        );
        assert_eq!(
            sensors.get("grid.beams").unwrap().value,
            "(0, -1.0, 0.0, 0.0, 0.0)"
        );
        assert!(c.beams_if_changed(1, frb_pointing::CONFIGURED).is_none());
        assert_eq!(
            call(&c, &["list"], &mut steady).unwrap(),
            ["0.5:-1.0", "2.0:0.25"]
        );
        assert_eq!(
            call(&c, &["list", "1.5:3", "-7:0.125"], &mut steady),
            Ok(vec![])
        );
        assert_eq!(steady, 1, "a re-point moves steady-state-timestamp");
        let p = c.beams_if_changed(1, frb_pointing::CONFIGURED).unwrap();
        assert_eq!(p.positions, [(1.5, 3.0), (-7.0, 0.125)]);
        assert!(c.beams_if_changed(1, p.version).is_none());
        assert!(c.beams_if_changed(0, frb_pointing::CONFIGURED).is_none());
        assert_eq!(
            call(&c, &["list"], &mut steady).unwrap(),
            ["1.5:3.0", "-7.0:0.125"]
        );
        // The sensor shows what is in force: unchanged until the engine applies it.
        assert_eq!(
            sensors.get("list.beams").unwrap().value,
            "(0, 0.5, -1.0, 2.0, 0.25)"
        );
        // The table of the new positions is built with them, before the reply.
        let Some(Resample::General { w, beams: 2 }) = p.table.as_deref() else {
            panic!("{:?}", p.table)
        };
        // (2M·2N) × B for M = 1, N = 2, B = 2.
        assert_eq!(w.len(), 16);
        c.beams_applied(&sensors, 1, 123_456, &p.listing);
        assert_eq!(
            sensors.get("list.beams").unwrap().value,
            "(123456, 1.5, 3.0, -7.0, 0.125)"
        );
    }

    #[test]
    fn refusals_leave_the_beams_as_they_were() {
        let sensors = Sensors::default();
        let c = control(&sensors);
        let mut steady = 0;
        for (args, says) in [
            (&["list", "1:1"][..], "expected 2, received 1"),
            (&["list", "1:1", "1:1", "1:1"], "expected 2, received 3"),
            (&["list", "1:1", "1;1"], "beam 1: \"1;1\" is not θ:θ′"),
            (&["list", "2e6:0", "0:0"], "beam 0: \"2e6:0\""),
            (&["list", "nan:0", "0:0"], "beam 0"),
            (&["grid", "0:0", "1:1"], "grid forms a grid of beams"),
            (&["nope", "0:0"], "no FRB beam output named \"nope\""),
            (&[], "missing stream name"),
        ] {
            let e = call(&c, args, &mut steady).unwrap_err();
            assert!(e.contains(says), "{args:?}: {e}");
        }
        assert_eq!(steady, 0);
        assert!(c.beams_if_changed(1, frb_pointing::CONFIGURED).is_none());
        assert!(c.beams_if_changed(0, frb_pointing::CONFIGURED).is_none());
    }
}
