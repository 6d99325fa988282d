//! The dish weights of an `--frb-beam` output (seed 004 eq. 51's W_{fπmn}: one complex weight
//! per channel f, dish and polarisation π) and cbf's katcp request that sets them, modelled on
//! katgpucbf's `?beam-weights` (one value per input, a whole stream at a time) and fgpu's
//! `?gain` (all channels, or a channel's own; no values reads them back):
//!
//! ```text
//! ?frb-weights stream [channel=C] w_0 … w_{D−1}            one per dish, both polarisations
//! ?frb-weights stream [channel=C] w_0 w_1 … w_{2D−1}       one per input: dish d, pol π is 2d + π
//! ?frb-weights stream [channel=C]                          read: the 2D weights in force
//! ```
//!
//! Without `channel=` the values apply to every channel of this engine; with it, to the
//! channels C names: one band channel `c`, or a **half-open range `a:b`** (channels a … b − 1)
//! with either end left out for this engine's first or one-past-last channel, as Python's
//! slices write it. Half-open because katcp clients are Python scripts (aiokatcp,
//! katportalclient) whose users slice arrays that way, because ranges then tile without
//! overlap (`0:64`, `64:128`) and because `a-b` would read like a negative number. Unlike a
//! Python slice, a range reaching outside this engine's `chan-range` is refused, not clipped:
//! a weight meant for another engine's channel is a mistake to report. Weights are complex, as
//! Python and katcp write them (`1`, `0.5-0.25j`, `-2j`), and finite.
//!
//! A read answers only while every channel it names has the same weights (so a reply is one
//! row of 2D values, whatever the range); where they differ it fails naming the first two
//! channels that do, and the `{name}.weight` sensor ([`FrbWeights::describe`]) lists the runs
//! of channels with equal weights. The table is (channel, dish, pol), the layout the backends
//! take ([`super::backend::FrbChunk`]); its version is bumped by every change, so a backend
//! that keeps a copy (the GPU) uploads it only then. Pure.
#![deny(unsafe_code)]

use std::ops::Range;

use num_complex::Complex32;

use crate::fengine::control::parse_complex;

/// Longest `{name}.weight` sensor value listing several runs of channels with their weights
/// (one run is shown whole, as before: at most 2 × antennas values). Past it the sensor lists
/// the runs' channel ranges only, and past it again just their count.
pub const MAX_WEIGHT_SENSOR_BYTES: usize = 64 << 10;

/// One output's weights and their version.
#[derive(Debug, Clone, PartialEq)]
pub struct FrbWeights {
    /// Bumped by every change.
    pub version: u64,
    /// (channel, dish, pol): `weights[(c·D + d)·2 + π]`.
    pub weights: Vec<Complex32>,
    /// 2D: the values of one channel.
    inputs: usize,
}

/// A parsed `?frb-weights` (after the stream name).
#[derive(Debug, Clone, PartialEq)]
pub enum FrbWeightsRequest {
    /// Set the weights of local channels `channels` (every channel without `channel=`), per
    /// (dish, pol).
    Set {
        channels: Range<usize>,
        weights: Vec<Complex32>,
    },
    /// Read the weights in force over local channels `channels`.
    Get { channels: Range<usize> },
}

/// The engine's channels, as `chan-range` states them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Channels {
    pub first: u64,
    pub count: usize,
}

impl Channels {
    /// The band channel of local channel `local`.
    pub fn band(&self, local: usize) -> u64 {
        self.first + local as u64
    }

    /// `a:b` (half-open, band channels) for local channels `r`.
    pub fn range_text(&self, r: &Range<usize>) -> String {
        format!("{}:{}", self.band(r.start), self.band(r.end))
    }

    /// (first, last), as the `chan-range` sensor writes it.
    fn sensor_text(&self) -> String {
        format!("({}, {})", self.first, self.band(self.count.max(1) - 1))
    }
}

/// Parse `?frb-weights` arguments after the stream name for an engine with `dishes` dishes.
pub fn parse_request(
    args: &[String],
    dishes: usize,
    channels: Channels,
) -> Result<FrbWeightsRequest, String> {
    let (range, values) = match args.first().and_then(|a| a.strip_prefix("channel=")) {
        Some(c) => (parse_channels(c, channels)?, &args[1..]),
        None => (0..channels.count, args),
    };
    if values.is_empty() {
        return Ok(FrbWeightsRequest::Get { channels: range });
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
    Ok(FrbWeightsRequest::Set {
        channels: range,
        weights,
    })
}

/// `c` or `a:b` (either end optional) of band channels within this engine's range, as local
/// indices.
fn parse_channels(text: &str, channels: Channels) -> Result<Range<usize>, String> {
    let end = channels.band(channels.count);
    let malformed = || {
        format!(
            "channel={text:?} is not a channel c or a half-open range a:b of this engine's \
             channels {}",
            channels.sensor_text()
        )
    };
    let outside = || {
        format!(
            "channel={text:?} is not within this engine's channels {}",
            channels.sensor_text()
        )
    };
    // Digits only: no sign, space or exponent.
    let number = |s: &str, default: u64| -> Result<u64, String> {
        match s {
            "" => Ok(default),
            _ if s.bytes().all(|b| b.is_ascii_digit()) => s.parse().map_err(|_| malformed()),
            _ => Err(malformed()),
        }
    };
    let (a, b) = match text.split_once(':') {
        Some((a, b)) => (number(a, channels.first)?, number(b, end)?),
        None if text.is_empty() => return Err(malformed()),
        None => {
            let c = number(text, 0)?;
            (c, c.saturating_add(1))
        }
    };
    if a < channels.first || a >= end || b > end {
        return Err(outside());
    }
    if a >= b {
        return Err(format!(
            "channel={text:?} names no channel (a:b is half-open: a up to b − 1)"
        ));
    }
    Ok((a - channels.first) as usize..(b - channels.first) as usize)
}

impl FrbWeights {
    /// Weight 1 everywhere (version 1), for `channels` channels of `dishes` dishes.
    pub fn ones(channels: usize, dishes: usize) -> FrbWeights {
        FrbWeights {
            version: 1,
            weights: vec![Complex32::new(1.0, 0.0); channels * dishes * 2],
            inputs: dishes * 2,
        }
    }

    fn rows(&self) -> std::slice::ChunksExact<'_, Complex32> {
        self.weights.chunks_exact(self.inputs.max(1))
    }

    /// Local channel `c`'s (dish, pol) weights.
    fn row(&self, c: usize) -> &[Complex32] {
        &self.weights[c * self.inputs..(c + 1) * self.inputs]
    }

    /// Apply a [`FrbWeightsRequest::Set`]'s values (per (dish, pol)) to local channels
    /// `channels` and bump the version.
    pub fn set(&mut self, channels: Range<usize>, per_dish_pol: &[Complex32]) {
        assert_eq!(per_dish_pol.len(), self.inputs);
        let n = self.inputs.max(1);
        for row in self
            .weights
            .chunks_exact_mut(n)
            .take(channels.end)
            .skip(channels.start)
        {
            row.copy_from_slice(per_dish_pol);
        }
        self.version += 1;
    }

    /// The (dish, pol) weights in force over local channels `channels` when they all have the
    /// same; else the first local channel whose weights differ from the range's first.
    pub fn get(&self, channels: Range<usize>) -> Result<&[Complex32], usize> {
        let first = self.row(channels.start);
        match channels.clone().skip(1).find(|&c| self.row(c) != first) {
            Some(c) => Err(c),
            None => Ok(first),
        }
    }

    /// The runs of consecutive local channels with equal weights, in order.
    pub fn runs(&self) -> Vec<Range<usize>> {
        let mut runs: Vec<Range<usize>> = Vec::new();
        let mut prev: Option<&[Complex32]> = None;
        for (c, row) in self.rows().enumerate() {
            match runs.last_mut() {
                Some(run) if prev == Some(row) => run.end = c + 1,
                _ => runs.push(c..c + 1),
            }
            prev = Some(row);
        }
        runs
    }

    /// The `{name}.weight` sensor. While every channel has the same weights: their list, one
    /// per dish where both polarisations agree, else one per input (the single-row form, as
    /// before ranges). Otherwise each run of channels with equal weights as
    /// `channels a:b [w…]` (half-open band channels, as `channel=a:b` takes them), joined by
    /// `; `, while that stays within [`MAX_WEIGHT_SENSOR_BYTES`]; past it only the runs'
    /// ranges with a pointer to the read, and past that only their count.
    pub fn describe(&self, band: Channels, stream: &str) -> String {
        let runs = self.runs();
        if let [_] = runs[..] {
            return format_row(self.row(0));
        }
        let read = format!("?frb-weights {stream} channel=a:b reads a run's weights");
        let listed = |part: &dyn Fn(&Range<usize>) -> String| -> Option<String> {
            let mut text = String::new();
            for r in &runs {
                if !text.is_empty() {
                    text.push_str("; ");
                }
                text.push_str(&part(r));
                if text.len() > MAX_WEIGHT_SENSOR_BYTES {
                    return None;
                }
            }
            Some(text)
        };
        listed(&|r| format!("channels {} {}", band.range_text(r), format_row(self.row(r.start))))
            .or_else(|| {
                listed(&|r| band.range_text(r))
                    .map(|t| format!("{} runs of channels with equal weights: {t} ({read})", runs.len()))
                    .filter(|t| t.len() <= MAX_WEIGHT_SENSOR_BYTES)
            })
            .unwrap_or_else(|| {
                format!(
                    "{} runs of channels with equal weights over {} channels, too many to list ({read})",
                    runs.len(),
                    band.count
                )
            })
    }
}

/// One channel's weights: one per dish while both polarisations agree, else one per input.
fn format_row(w: &[Complex32]) -> String {
    if w.chunks_exact(2).all(|p| p[0] == p[1]) {
        format_weights(w.iter().step_by(2))
    } else {
        format_weights(w.iter())
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

    fn channels_of(v: &[&str]) -> Range<usize> {
        match parse_request(&args(v), 2, CH).unwrap() {
            FrbWeightsRequest::Get { channels } | FrbWeightsRequest::Set { channels, .. } => {
                channels
            }
        }
    }

    #[test]
    fn one_weight_per_dish_covers_both_polarisations() {
        let r = parse_request(&args(&["1", "0.5-2j"]), 2, CH).unwrap();
        assert_eq!(
            r,
            FrbWeightsRequest::Set {
                channels: 0..4,
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
                channels: 2..3,
                weights: vec![c(1.0, 0.0), c(2.0, 0.0), c(0.0, 3.0), c(-4.0, 0.0)]
            }
        );
        assert_eq!(
            parse_request(&args(&["channel=11"]), 2, CH).unwrap(),
            FrbWeightsRequest::Get { channels: 3..4 }
        );
        assert_eq!(
            parse_request(&[], 2, CH).unwrap(),
            FrbWeightsRequest::Get { channels: 0..4 }
        );
    }

    /// Half-open band ranges, either end defaulting to the engine's, as Python's slices.
    #[test]
    fn channel_ranges_are_half_open_with_optional_ends() {
        assert_eq!(channels_of(&["channel=9:11", "1", "1"]), 1..3);
        assert_eq!(channels_of(&["channel=8:12"]), 0..4);
        assert_eq!(channels_of(&["channel=10:"]), 2..4);
        assert_eq!(channels_of(&["channel=:9", "1", "2", "3", "4"]), 0..1);
        assert_eq!(channels_of(&["channel=:"]), 0..4);
        assert_eq!(channels_of(&["channel=11:12"]), 3..4);
    }

    #[test]
    fn malformed_requests_are_refused_naming_the_fault() {
        let err = |v: &[&str]| parse_request(&args(v), 2, CH).unwrap_err();
        assert!(err(&["1", "2", "3"]).contains("expected 2 or 4, received 3"));
        assert!(err(&["1", "x"]).contains("\"x\""));
        assert!(err(&["1", "inf"]).contains("finite"));
        for outside in ["12", "7", "7:9", "11:13", "12:", ":13", "0:100"] {
            let e = err(&[&format!("channel={outside}"), "1", "1"]);
            assert!(
                e.contains(&format!("channel=\"{outside}\" is not within"))
                    && e.contains("(8, 11)"),
                "{outside}: {e}"
            );
        }
        for malformed in [
            "-1", "", "x", "9-11", "9:x", "9:10:11", "+9", " 9", "9.5", "1e1",
        ] {
            let e = err(&[&format!("channel={malformed}")]);
            assert!(
                e.contains(&format!(
                    "channel={malformed:?} is not a channel c or a half-open range"
                )),
                "{malformed}: {e}"
            );
        }
        for empty in ["10:10", "11:9"] {
            assert!(err(&[&format!("channel={empty}")]).contains("names no channel"));
        }
        // Far past u64: malformed, not wrapped; u64::MAX: outside, not overflowed.
        assert!(err(&["channel=99999999999999999999"]).contains("not a channel c"));
        assert!(err(&["channel=18446744073709551615"]).contains("not within"));
        assert!(err(&["channel=8", "channel=9", "1"]).contains("\"channel=9\""));
    }

    #[test]
    fn setting_channels_leaves_the_others_and_bumps_the_version() {
        let band = Channels { first: 0, count: 3 };
        let mut w = FrbWeights::ones(3, 2);
        assert_eq!(w.describe(band, "f"), "[1.0+0.0j, 1.0+0.0j]");
        let v0 = w.version;
        let per_input = [c(1.0, 0.0), c(2.0, 0.0), c(3.0, 0.0), c(4.0, 0.0)];
        w.set(0..3, &per_input);
        assert_eq!(
            w.describe(band, "f"),
            "[1.0+0.0j, 2.0+0.0j, 3.0+0.0j, 4.0+0.0j]"
        );
        let other = [c(0.0, -1.0); 4];
        w.set(1..2, &other);
        assert_eq!(w.version, v0 + 2);
        assert_eq!(w.get(0..1), Ok(&per_input[..]));
        assert_eq!(w.get(1..2), Ok(&other[..]));
        assert_eq!(w.get(2..3), Ok(&per_input[..]));
        assert_eq!(w.get(0..3), Err(1));
        assert_eq!(w.get(1..3), Err(2));
        // Layout (channel, dish, pol).
        assert_eq!(w.weights[(2 + 1) * 2 + 1], c(0.0, -1.0));
        assert_eq!(w.weights[(2 * 2 + 1) * 2], c(3.0, 0.0));
        w.set(1..3, &other);
        assert_eq!(w.get(1..3), Ok(&other[..]));
        assert_eq!(w.get(0..3), Err(1));
    }

    /// Runs of equal weights, as band ranges an operator can paste into `channel=`.
    #[test]
    fn the_sensor_lists_runs_of_channels_with_equal_weights() {
        let band = Channels {
            first: 100,
            count: 6,
        };
        let mut w = FrbWeights::ones(6, 2);
        w.set(2..4, &[c(0.0, 0.0); 4]);
        w.set(5..6, &[c(1.0, 0.0), c(0.5, 0.0), c(2.0, 0.0), c(2.0, 0.0)]);
        assert_eq!(w.runs(), [0..2, 2..4, 4..5, 5..6]);
        assert_eq!(
            w.describe(band, "f"),
            "channels 100:102 [1.0+0.0j, 1.0+0.0j]; channels 102:104 [0.0+0.0j, 0.0+0.0j]; \
             channels 104:105 [1.0+0.0j, 1.0+0.0j]; \
             channels 105:106 [1.0+0.0j, 0.5+0.0j, 2.0+0.0j, 2.0+0.0j]"
        );
        // Equal weights set apart still make one run.
        w.set(2..6, &[c(1.0, 0.0); 4]);
        assert_eq!(w.runs().len(), 1);
        assert_eq!(w.describe(band, "f"), "[1.0+0.0j, 1.0+0.0j]");
    }

    /// Past the cap the sensor falls back to the runs' ranges, then to their count; it never
    /// exceeds the cap (one run is the single-row form, bounded by the antennas).
    #[test]
    fn the_sensor_stays_within_its_cap() {
        let dishes = 64;
        let alternate = |channels: usize| {
            let mut w = FrbWeights::ones(channels, dishes);
            for k in (0..channels).step_by(2) {
                w.set(k..k + 1, &vec![c(0.25, -0.125); 2 * dishes]);
            }
            w
        };
        // 64 dishes of "1.0+0.0j, " (10 bytes): ~650 bytes a run; 200 runs pass 64 KiB.
        let band = Channels {
            first: 0,
            count: 200,
        };
        let text = alternate(200).describe(band, "f");
        assert!(text.len() <= MAX_WEIGHT_SENSOR_BYTES, "{}", text.len());
        assert!(
            text.starts_with("200 runs of channels with equal weights: 0:1; 1:2; 2:3"),
            "{text}"
        );
        assert!(text.ends_with("199:200 (?frb-weights f channel=a:b reads a run's weights)"));
        // 20,000 runs' ranges alone pass it too.
        let band = Channels {
            first: 0,
            count: 20_000,
        };
        let text = alternate(20_000).describe(band, "f");
        assert_eq!(
            text,
            "20000 runs of channels with equal weights over 20000 channels, too many to list \
             (?frb-weights f channel=a:b reads a run's weights)"
        );
        // Below the cap, every run with its weights.
        let band = Channels {
            first: 0,
            count: 50,
        };
        let text = alternate(50).describe(band, "f");
        assert!(text.len() <= MAX_WEIGHT_SENSOR_BYTES);
        assert_eq!(text.matches("channels ").count(), 50);
        assert!(text.contains("; channels 49:50 [1.0+0.0j, "));
    }
}
