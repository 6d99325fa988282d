//! The dish weights of an `--frb-beam` output (seed 004 eq. 51's W_{fπmn}: one complex weight
//! per channel f, dish and polarisation π) and cbf's katcp request that sets them, modelled on
//! katgpucbf's `?beam-weights` (one value per input, a whole stream at a time) and fgpu's
//! `?gain` (all channels, or a channel's own; no values reads them back):
//!
//! ```text
//! ?frb-weights stream [channel=c] w_0 … w_{D−1}            one per dish, both polarisations
//! ?frb-weights stream [channel=c] w_0 w_1 … w_{2D−1}       one per input: dish d, pol π is 2d + π
//! ?frb-weights stream [channel=c]                          read: the 2D weights in force
//! ```
//!
//! Without `channel=` the values apply to every channel of this engine; with it, to channel c
//! only (a channel of the band, within this engine's `chan-range`). Weights are complex, as
//! Python and katcp write them (`1`, `0.5-0.25j`, `-2j`), and finite. A read without `channel=`
//! answers only while every channel has the same weights. The table is (channel, dish, pol),
//! the layout the backends take ([`super::backend::FrbChunk`]); its version is bumped by every
//! change, so a backend that keeps a copy (the GPU) uploads it only then. Pure.
#![deny(unsafe_code)]

use num_complex::Complex32;

use crate::fengine::control::parse_complex;

/// One output's weights and their version.
#[derive(Debug, Clone, PartialEq)]
pub struct FrbWeights {
    /// Bumped by every change.
    pub version: u64,
    /// (channel, dish, pol): `weights[(c·D + d)·2 + π]`.
    pub weights: Vec<Complex32>,
}

/// A parsed `?frb-weights` (after the stream name).
#[derive(Debug, Clone, PartialEq)]
pub enum FrbWeightsRequest {
    /// Set the weights of every channel (`None`) or of one (a local channel index), per
    /// (dish, pol).
    Set {
        channel: Option<usize>,
        weights: Vec<Complex32>,
    },
    /// Read them back.
    Get { channel: Option<usize> },
}

/// The engine's channels, as `chan-range` states them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Channels {
    pub first: u64,
    pub count: usize,
}

/// Parse `?frb-weights` arguments after the stream name for an engine with `dishes` dishes.
pub fn parse_request(
    args: &[String],
    dishes: usize,
    channels: Channels,
) -> Result<FrbWeightsRequest, String> {
    let (channel, values) = match args.first().and_then(|a| a.strip_prefix("channel=")) {
        Some(c) => (Some(parse_channel(c, channels)?), &args[1..]),
        None => (None, args),
    };
    if values.is_empty() {
        return Ok(FrbWeightsRequest::Get { channel });
    }
    if values.len() != dishes && values.len() != 2 * dishes {
        return Err(format!(
            "Incorrect number of weights (expected {dishes} or {}, received {})",
            2 * dishes,
            values.len()
        ));
    }
    let parsed: Vec<Complex32> = values
        .iter()
        .map(|a| match parse_complex(a) {
            Some(v) if v.re.is_finite() && v.im.is_finite() => Ok(v),
            _ => Err(format!("weight {a:?} is not a finite complex number")),
        })
        .collect::<Result<_, _>>()?;
    let weights = if parsed.len() == dishes {
        parsed.iter().flat_map(|&w| [w, w]).collect()
    } else {
        parsed
    };
    Ok(FrbWeightsRequest::Set { channel, weights })
}

/// A band channel within this engine's range, as a local index.
fn parse_channel(text: &str, channels: Channels) -> Result<usize, String> {
    let last = channels.first + channels.count as u64 - 1;
    match text.parse::<u64>() {
        Ok(c) if (channels.first..=last).contains(&c) => Ok((c - channels.first) as usize),
        _ => Err(format!(
            "channel {text:?} is not a channel of this engine ({}, {last})",
            channels.first
        )),
    }
}

impl FrbWeights {
    /// Weight 1 everywhere (version 1), for `channels` channels of `dishes` dishes.
    pub fn ones(channels: usize, dishes: usize) -> FrbWeights {
        FrbWeights {
            version: 1,
            weights: vec![Complex32::new(1.0, 0.0); channels * dishes * 2],
        }
    }

    fn per_channel(&self, channels: usize) -> usize {
        self.weights.len() / channels.max(1)
    }

    /// Apply a [`FrbWeightsRequest::Set`]'s values (per (dish, pol)) and bump the version.
    pub fn set(&mut self, channels: usize, channel: Option<usize>, per_dish_pol: &[Complex32]) {
        let n = self.per_channel(channels);
        assert_eq!(per_dish_pol.len(), n);
        for (c, row) in self.weights.chunks_exact_mut(n).enumerate() {
            if channel.is_none_or(|k| k == c) {
                row.copy_from_slice(per_dish_pol);
            }
        }
        self.version += 1;
    }

    /// The (dish, pol) weights of local channel `channel`, or of every channel when they are
    /// all the same (`None` otherwise).
    pub fn get(&self, channels: usize, channel: Option<usize>) -> Option<&[Complex32]> {
        let n = self.per_channel(channels);
        let mut rows = self.weights.chunks_exact(n);
        match channel {
            Some(c) => rows.nth(c),
            None => {
                let first = rows.next()?;
                rows.all(|r| r == first).then_some(first)
            }
        }
    }

    /// The `{name}.weight` sensor: one weight per dish while both polarisations and every
    /// channel agree (the old one-per-dish form), else one per input while the channels agree,
    /// else a pointer to the per-channel read (the whole table can be megabytes).
    pub fn describe(&self, channels: usize, stream: &str) -> String {
        match self.get(channels, None) {
            Some(w) if w.chunks_exact(2).all(|p| p[0] == p[1]) => {
                format_weights(w.iter().step_by(2))
            }
            Some(w) => format_weights(w.iter()),
            None => format!("per channel: ?frb-weights {stream} channel=c reads channel c's"),
        }
    }
}

/// `[re+imj, …]`, as the weights were understood.
pub fn format_weights<'a>(w: impl Iterator<Item = &'a Complex32>) -> String {
    let all: Vec<String> = w.map(format_weight).collect();
    format!("[{}]", all.join(", "))
}

/// `re+imj`, Python's complex syntax (a katcp reply argument).
pub fn format_weight(c: &Complex32) -> String {
    let sign = if c.im.is_sign_negative() { "" } else { "+" };
    format!("{:?}{sign}{:?}j", c.re, c.im)
}

#[cfg(test)]
mod tests {
    use super::*;

    const CH: Channels = Channels { first: 8, count: 4 };

    fn args(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    fn c(re: f32, im: f32) -> Complex32 {
        Complex32::new(re, im)
    }

    #[test]
    fn one_weight_per_dish_covers_both_polarisations() {
        let r = parse_request(&args(&["1", "0.5-2j"]), 2, CH).unwrap();
        assert_eq!(
            r,
            FrbWeightsRequest::Set {
                channel: None,
                weights: vec![c(1.0, 0.0), c(1.0, 0.0), c(0.5, -2.0), c(0.5, -2.0)]
            }
        );
    }

    #[test]
    fn one_weight_per_input_and_a_channel_of_the_band() {
        let r = parse_request(&args(&["channel=10", "1", "2", "3j", "-4"]), 2, CH).unwrap();
        assert_eq!(
            r,
            FrbWeightsRequest::Set {
                channel: Some(2),
                weights: vec![c(1.0, 0.0), c(2.0, 0.0), c(0.0, 3.0), c(-4.0, 0.0)]
            }
        );
        assert_eq!(
            parse_request(&args(&["channel=11"]), 2, CH).unwrap(),
            FrbWeightsRequest::Get { channel: Some(3) }
        );
        assert_eq!(
            parse_request(&[], 2, CH).unwrap(),
            FrbWeightsRequest::Get { channel: None }
        );
    }

    #[test]
    fn malformed_requests_are_refused_naming_the_fault() {
        let err = |v: &[&str]| parse_request(&args(v), 2, CH).unwrap_err();
        assert!(err(&["1", "2", "3"]).contains("expected 2 or 4, received 3"));
        assert!(err(&["1", "x"]).contains("\"x\""));
        assert!(err(&["1", "inf"]).contains("finite"));
        assert!(err(&["channel=12", "1", "1"]).contains("(8, 11)"));
        assert!(err(&["channel=7", "1", "1"]).contains("not a channel"));
        assert!(err(&["channel=-1"]).contains("not a channel"));
        assert!(err(&["channel=", "1", "1"]).contains("not a channel"));
        assert!(err(&["channel=8", "channel=9", "1"]).contains("\"channel=9\""));
    }

    #[test]
    fn setting_one_channel_leaves_the_others_and_bumps_the_version() {
        let mut w = FrbWeights::ones(3, 2);
        assert_eq!(w.describe(3, "f"), "[1.0+0.0j, 1.0+0.0j]");
        let v0 = w.version;
        let per_input = [c(1.0, 0.0), c(2.0, 0.0), c(3.0, 0.0), c(4.0, 0.0)];
        w.set(3, None, &per_input);
        assert_eq!(
            w.describe(3, "f"),
            "[1.0+0.0j, 2.0+0.0j, 3.0+0.0j, 4.0+0.0j]"
        );
        let other = [c(0.0, -1.0); 4];
        w.set(3, Some(1), &other);
        assert_eq!(w.version, v0 + 2);
        assert_eq!(w.get(3, Some(0)), Some(&per_input[..]));
        assert_eq!(w.get(3, Some(1)), Some(&other[..]));
        assert_eq!(w.get(3, Some(2)), Some(&per_input[..]));
        assert_eq!(w.get(3, None), None);
        assert!(w.describe(3, "f").contains("channel=c"));
        // Layout (channel, dish, pol).
        assert_eq!(w.weights[(2 + 1) * 2 + 1], c(0.0, -1.0));
        assert_eq!(w.weights[(2 * 2 + 1) * 2], c(3.0, 0.0));
    }
}
