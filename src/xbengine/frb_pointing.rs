//! The beam centres of an `--frb-beam` output at run time (issue 17, tracking beams) and cbf's
//! katcp request that re-points them. katgpucbf has no FRB beams; the request is modelled on
//! its `?beam-delays beam delay:phase …` (one argument per item, a pair joined by `:`, values
//! only — no file on the engine host, which a katcp client elsewhere could not write):
//!
//! ```text
//! ?frb-beams stream θ_0:θ′_0 θ_1:θ′_1 … θ_{B−1}:θ′_{B−1}    re-point: one pair per beam, in beam order
//! ?frb-beams stream                                          read: the pairs last set
//! ```
//!
//! Only an output whose beams are a list (`beams=FILE`, seed 004 §5.2) can be re-pointed, and
//! only with as many beams as it was started with: the heap's shape and the backends' tables
//! stay as they are. Positions are checked as the beams file's are at start-up (finite,
//! |θ|, |θ′| ≤ `frb_output::MAX_THETA`, seed 004 eq. 1's normalised coordinates). The size of
//! a request is bounded by the output's own: one argument per beam (at most
//! `frb_output::MAX_FRB_BEAMS`, within the katcp server's argument and line limits), the count
//! checked before any value is parsed. A re-point
//! is in force from the engine's next chunk; the `{name}.beams` sensor ([`sensor_value`])
//! shows the positions in force and the timestamp T they are in force from (every chunk from
//! T on that the output forms, whether or not it is capturing), as katgpucbf's `{beam}.delay`
//! sensor shows `(loadmcnt, delay0, phase0, …)`. Everything costly in B (the positions' text,
//! the CPU backend's table) is made by the request handler, so that the engine's processing
//! thread only swaps it in. Pure.
#![deny(unsafe_code)]

use std::sync::Arc;

use super::frb_output::parse_theta;
use crate::dsp::frb_resample::{FrbBeams, Resample};

/// The version of the beams an output was started with (the backends are built with them).
pub const CONFIGURED: u64 = 0;

/// Longest `{name}.beams` value listing the positions (about 23,000 beams at full precision);
/// past it the sensor gives the timestamp and the count, and `?frb-beams stream` reads them.
pub const MAX_BEAMS_SENSOR_BYTES: usize = 1 << 20;

/// One output's beam centres as last set, and their version.
#[derive(Debug, Clone)]
pub struct FrbPointing {
    /// [`CONFIGURED`], then bumped by every re-point.
    pub version: u64,
    /// (θ, θ′) per beam, in beam order.
    pub positions: Vec<(f64, f64)>,
    /// A list (re-pointable), not a grid.
    pub list: bool,
    /// `{name}.beams` after its timestamp ([`listing`]).
    pub listing: Arc<str>,
    /// The CPU backend's stage-2 table for `positions` (`None`: as started, or a backend that
    /// builds its own).
    pub table: Option<Arc<Resample>>,
}

impl FrbPointing {
    /// As started with `beams`, by output `stream`.
    pub fn new(beams: &FrbBeams, stream: &str) -> FrbPointing {
        let positions = beams.positions();
        FrbPointing {
            version: CONFIGURED,
            listing: listing(&positions, stream).into(),
            positions,
            list: matches!(beams, FrbBeams::List(_)),
            table: None,
        }
    }
}

/// A parsed `?frb-beams` (after the stream name).
#[derive(Debug, Clone, PartialEq)]
pub enum FrbBeamsRequest {
    /// Re-point every beam.
    Set(Vec<(f64, f64)>),
    /// Read the positions last set.
    Get,
}

/// Parse `?frb-beams` arguments after the stream name for output `stream`, now pointed as
/// `now`. `Err` is the fail reply: it names the argument or the reason.
pub fn parse_request(
    args: &[String],
    now: &FrbPointing,
    stream: &str,
) -> Result<FrbBeamsRequest, String> {
    if args.is_empty() {
        return Ok(FrbBeamsRequest::Get);
    }
    if !now.list {
        return Err(format!(
            "{stream} forms a grid of beams (beams=P×Q): only a list of beams (beams=FILE) can \
             be re-pointed"
        ));
    }
    let expected = now.positions.len();
    // Before parsing any value: the count alone bounds the work of a request.
    if args.len() != expected {
        return Err(format!(
            "Incorrect number of beams (expected {expected}, received {})",
            args.len()
        ));
    }
    let positions = args
        .iter()
        .enumerate()
        .map(|(b, a)| {
            parse_position(a).ok_or_else(|| {
                format!(
                    "beam {b}: {a:?} is not θ:θ′, two numbers within ±{}",
                    super::frb_output::MAX_THETA
                )
            })
        })
        .collect::<Result<_, _>>()?;
    Ok(FrbBeamsRequest::Set(positions))
}

/// `θ:θ′`, each as a beams file's line takes it.
fn parse_position(text: &str) -> Option<(f64, f64)> {
    let (a, b) = text.split_once(':')?;
    parse_theta(a).zip(parse_theta(b))
}

/// `θ:θ′` as the request takes it, exact (Rust's shortest round-trip decimal).
pub fn format_position(&(a, b): &(f64, f64)) -> String {
    format!("{a:?}:{b:?}")
}

/// The `{name}.beams` sensor after its timestamp: `, θ_0, θ′_0, θ_1, θ′_1, …)` up to
/// [`MAX_BEAMS_SENSOR_BYTES`]; past it `, "B beams: too many to list; ?frb-beams stream reads
/// them")`. Made once per re-point, by the request handler.
pub fn listing(positions: &[(f64, f64)], stream: &str) -> String {
    let mut text = String::new();
    for (a, b) in positions {
        text += &format!(", {a:?}, {b:?}");
        if text.len() > MAX_BEAMS_SENSOR_BYTES {
            return format!(
                ", \"{} beams: too many to list; ?frb-beams {stream} reads them\")",
                positions.len()
            );
        }
    }
    text + ")"
}

/// The `{name}.beams` sensor: `(timestamp, …)`, `listing` in force from `timestamp` (0: as
/// started).
pub fn sensor_value(timestamp: u64, listing: &str) -> String {
    format!("({timestamp}{listing}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    fn list(n: usize) -> FrbPointing {
        FrbPointing::new(&FrbBeams::List(vec![(0.0, 0.0); n]), "f")
    }

    #[test]
    fn one_pair_per_beam_in_order() {
        let r = parse_request(&args(&["0.5:-1.25", "-3e2:7", "1e-3:0"]), &list(3), "f");
        assert_eq!(
            r,
            Ok(FrbBeamsRequest::Set(vec![
                (0.5, -1.25),
                (-300.0, 7.0),
                (0.001, 0.0)
            ]))
        );
        assert_eq!(parse_request(&[], &list(3), "f"), Ok(FrbBeamsRequest::Get));
        // A grid reads back too.
        let grid = FrbPointing::new(&FrbBeams::even(2, 2, 2, 1), "g");
        assert_eq!(parse_request(&[], &grid, "g"), Ok(FrbBeamsRequest::Get));
        assert_eq!(grid.positions, [(-1.0, 0.0), (0.0, 0.0)]);
        assert!(!grid.list && list(1).list);
    }

    #[test]
    fn refusals_name_the_fault() {
        let err = |v: &[&str]| parse_request(&args(v), &list(2), "f").unwrap_err();
        assert_eq!(
            err(&["1:1"]),
            "Incorrect number of beams (expected 2, received 1)"
        );
        assert!(err(&["1:1", "1:1", "1:1"]).contains("expected 2, received 3"));
        for bad in [
            "1",
            "1,2",
            "x:1",
            "1:",
            ":1",
            "1:2:3",
            "nan:0",
            "0:inf",
            "1e7:0",
            "0:-1000001",
        ] {
            let e = err(&["0:0", bad]);
            assert!(
                e.starts_with(&format!("beam 1: {bad:?} is not θ:θ′")) && e.contains("1000000"),
                "{bad}: {e}"
            );
        }
        let grid = FrbPointing::new(&FrbBeams::even(2, 2, 1, 2), "g");
        let e = parse_request(&args(&["0:0", "1:1"]), &grid, "g").unwrap_err();
        assert!(e.starts_with("g forms a grid of beams"), "{e}");
    }

    /// The sensor and the request's syntax read back the very doubles set.
    #[test]
    fn positions_round_trip_through_text() {
        let p = [(0.1, -1.0 / 3.0), (123456.789, 1e-300), (-0.0, 2.5)];
        let text: Vec<String> = p.iter().map(format_position).collect();
        let back = parse_request(&text, &list(3), "f").unwrap();
        assert_eq!(back, FrbBeamsRequest::Set(p.to_vec()));
        assert_eq!(
            sensor_value(4096, &listing(&p[..2], "f")),
            "(4096, 0.1, -0.3333333333333333, 123456.789, 1e-300)"
        );
        assert_eq!(sensor_value(0, &listing(&[], "f")), "(0)");
    }

    #[test]
    fn the_sensor_stays_within_its_cap() {
        let many = vec![(-0.123456789012345, 0.987654321098765); 40_000];
        let text = sensor_value(77, &listing(&many, "f"));
        assert_eq!(
            text,
            "(77, \"40000 beams: too many to list; ?frb-beams f reads them\")"
        );
        let fewer = sensor_value(77, &listing(&many[..20_000], "f"));
        assert!(fewer.len() <= MAX_BEAMS_SENSOR_BYTES && fewer.ends_with("0.987654321098765)"));
    }
}
