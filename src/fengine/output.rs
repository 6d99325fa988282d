//! `--wideband name=…,channels=…,dst=…[,taps=16][,w_cutoff=1.0][,window_function=hann]
//! [,dither=uniform][,jones_per_batch=…]` (katgpucbf fgpu, facts §1.3), parsed and validated
//! with errors that name the flag and the key; the keys every output shares (narrowband ones
//! too, `narrowband_output`); and [`OutputSpec`], an output of either kind with the
//! [`OutputShape`] a pipeline runs on.
#![deny(unsafe_code)]

use std::net::SocketAddrV4;

use super::narrowband_output::NarrowbandOutput;
use crate::dsp::pfb::Window;
use crate::net::parse_endpoints;

/// Most channels of one output (katgpucbf's largest wideband mode is 32768; narrowband and
/// `?gain` are sized for 65536).
pub const MAX_CHANNELS: usize = 1 << 16;
/// Largest `jones_per_batch` (katgpucbf's default is 2^20; output heaps are sized by it).
pub const MAX_JONES_PER_BATCH: usize = 1 << 24;
/// Most PFB taps (katgpucbf uses 16; the filter state is taps × channels × 2 per input).
pub const MAX_TAPS: usize = 256;

#[derive(Debug, Clone, PartialEq)]
pub struct WidebandOutput {
    pub name: String,
    pub channels: usize,
    pub dst: Vec<SocketAddrV4>,
    pub taps: usize,
    pub w_cutoff: f64,
    pub window: Window,
    pub dither: bool,
    pub jones_per_batch: Option<usize>,
}

impl WidebandOutput {
    /// Parse the sub-option string; `Err` is a message for the `--wideband` flag.
    pub fn parse(text: &str) -> Result<WidebandOutput, String> {
        Self::parse_with(text, |_, _| Ok(false))
    }

    /// Parse the keys every output takes (katgpucbf's `_add_stream_args`), handing any other
    /// key to `extra`, which says whether it took it; then check them.
    pub(super) fn parse_with(
        text: &str,
        mut extra: impl FnMut(&str, &str) -> Result<bool, String>,
    ) -> Result<WidebandOutput, String> {
        let mut name = None;
        let mut channels = None;
        let mut dst = None;
        let mut out = WidebandOutput {
            name: String::new(),
            channels: 0,
            dst: vec![],
            taps: 16,
            w_cutoff: 1.0,
            window: Window::Hann,
            dither: true,
            jones_per_batch: None,
        };
        for part in text.split(',').filter(|p| !p.is_empty()) {
            let (k, v) = part
                .split_once('=')
                .ok_or_else(|| format!("{part:?} is not key=value"))?;
            let num = |what: &str| format!("{k}={v:?}: {what}");
            match k {
                "name" => name = Some(v.to_string()),
                "channels" => {
                    channels = Some(v.parse::<usize>().map_err(|_| num("not an integer"))?)
                }
                "dst" => dst = Some(parse_endpoints(v).map_err(|e| format!("dst: {e}"))?),
                "taps" => out.taps = v.parse().map_err(|_| num("not an integer"))?,
                "w_cutoff" => out.w_cutoff = v.parse().map_err(|_| num("not a number"))?,
                "window_function" => {
                    out.window = match v {
                        "hann" => Window::Hann,
                        "rect" => Window::Rect,
                        _ => return Err(num("must be hann or rect")),
                    }
                }
                "dither" => {
                    out.dither = match v {
                        "uniform" => true,
                        "none" => false,
                        _ => return Err(num("must be uniform or none")),
                    }
                }
                "jones_per_batch" => {
                    out.jones_per_batch = Some(v.parse().map_err(|_| num("not an integer"))?)
                }
                _ => {
                    if !extra(k, v)? {
                        return Err(format!("unknown key {k:?}"));
                    }
                }
            }
        }
        out.name = name.ok_or("missing name=")?;
        out.channels = channels.ok_or("missing channels=")?;
        out.dst = dst.ok_or("missing dst=")?;
        if out.channels < 2 || !out.channels.is_power_of_two() || out.channels > MAX_CHANNELS {
            return Err(format!(
                "channels={} must be a power of two from 2 to {MAX_CHANNELS}",
                out.channels
            ));
        }
        if out.channels % out.dst.len() != 0 {
            return Err(format!(
                "channels={} is not divisible by the {} destinations",
                out.channels,
                out.dst.len()
            ));
        }
        if out.taps == 0 || out.taps > MAX_TAPS {
            return Err(format!("taps={} must be from 1 to {MAX_TAPS}", out.taps));
        }
        if let Some(j) = out.jones_per_batch.filter(|&j| j > MAX_JONES_PER_BATCH) {
            return Err(format!(
                "jones_per_batch={j} must be at most {MAX_JONES_PER_BATCH}"
            ));
        }
        if !out.w_cutoff.is_finite() || out.w_cutoff < 0.0 {
            return Err(format!("w_cutoff={} must be ≥ 0", out.w_cutoff));
        }
        Ok(out)
    }

    /// Spectra per output heap for `jones_per_batch` (this output's own, or the engine's).
    pub fn spectra_per_heap(&self, default_jones: usize) -> Result<usize, String> {
        heap_spectra(self.jones_per_batch, default_jones, self.channels)
    }

    /// The shape its pipeline runs on: spectra every 2N samples, each reading taps·2N.
    pub fn shape(&self) -> OutputShape {
        OutputShape {
            channels: self.channels,
            spectra_samples: 2 * self.channels,
            window: self.taps * 2 * self.channels,
            subsampling: 1,
        }
    }
}

/// Spectra per heap: `jones_per_batch` (the output's own, else the engine's) over `channels`.
fn heap_spectra(
    own: Option<usize>,
    default_jones: usize,
    channels: usize,
) -> Result<usize, String> {
    let j = own.unwrap_or(default_jones);
    if j % channels != 0 || j < channels {
        return Err(format!(
            "jones_per_batch={j} must be a positive multiple of channels={channels}"
        ));
    }
    Ok(j / channels)
}

/// What the pipeline's scheduling needs of an output, whichever its kind (seed 000
/// §Narrowband: the same front end and back end, on samples a DDC has subsampled).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutputShape {
    /// Output channels.
    pub channels: usize,
    /// Digitiser samples between consecutive spectra.
    pub spectra_samples: usize,
    /// Digitiser samples that contribute to one spectrum.
    pub window: usize,
    /// Digitiser samples per PFB input sample: coarse delays are multiples of it.
    pub subsampling: usize,
}

/// An output of either kind, as the engine runs it.
#[derive(Debug, Clone, PartialEq)]
pub enum OutputSpec {
    Wideband(WidebandOutput),
    Narrowband(NarrowbandOutput),
}

impl From<WidebandOutput> for OutputSpec {
    fn from(o: WidebandOutput) -> OutputSpec {
        OutputSpec::Wideband(o)
    }
}

impl OutputSpec {
    pub fn name(&self) -> &str {
        match self {
            OutputSpec::Wideband(o) => &o.name,
            OutputSpec::Narrowband(o) => &o.name,
        }
    }

    pub fn channels(&self) -> usize {
        self.shape().channels
    }

    pub fn dst(&self) -> &[SocketAddrV4] {
        match self {
            OutputSpec::Wideband(o) => &o.dst,
            OutputSpec::Narrowband(o) => &o.dst,
        }
    }

    pub fn dither(&self) -> bool {
        match self {
            OutputSpec::Wideband(o) => o.dither,
            OutputSpec::Narrowband(o) => o.dither,
        }
    }

    pub fn shape(&self) -> OutputShape {
        match self {
            OutputSpec::Wideband(o) => o.shape(),
            OutputSpec::Narrowband(o) => o.shape(),
        }
    }

    /// Spectra per output heap for `jones_per_batch` (this output's own, or the engine's).
    pub fn spectra_per_heap(&self, default_jones: usize) -> Result<usize, String> {
        match self {
            OutputSpec::Wideband(o) => o.spectra_per_heap(default_jones),
            OutputSpec::Narrowband(o) => heap_spectra(o.jones_per_batch, default_jones, o.channels),
        }
    }

    pub fn kind(&self) -> &'static str {
        match self {
            OutputSpec::Wideband(_) => "wideband",
            OutputSpec::Narrowband(_) => "narrowband",
        }
    }

    /// The flag that makes an output of this kind.
    pub fn flag(&self) -> &'static str {
        match self {
            OutputSpec::Wideband(_) => "--wideband",
            OutputSpec::Narrowband(_) => "--narrowband",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_refuses() {
        let o = WidebandOutput::parse("name=wide1,channels=4096,dst=239.10.11.0+3:7148,taps=4,window_function=rect,dither=none").unwrap();
        assert_eq!(
            (
                o.name.as_str(),
                o.channels,
                o.dst.len(),
                o.taps,
                o.window,
                o.dither
            ),
            ("wide1", 4096, 4, 4, Window::Rect, false)
        );
        assert_eq!(o.spectra_per_heap(1 << 20), Ok(256));
        for (text, needle) in [
            ("channels=8,dst=1.2.3.4:5", "name"),
            ("name=a,channels=12,dst=1.2.3.4:5", "power of two"),
            ("name=a,channels=8,dst=1.2.3.4+2:5", "divisible"),
            ("name=a,channels=8,dst=1.2.3.4:5,bogus=1", "unknown key"),
            (
                "name=a,channels=8,dst=1.2.3.4:5,window_function=kaiser",
                "hann or rect",
            ),
            ("name=a,channels=x,dst=1.2.3.4:5", "not an integer"),
            (
                "name=a,channels=131072,dst=1.2.3.4:5",
                "power of two from 2 to 65536",
            ),
            (
                "name=a,channels=8,dst=1.2.3.4:5,taps=100000000",
                "from 1 to 256",
            ),
            (
                "name=a,channels=8,dst=1.2.3.4:5,jones_per_batch=1099511627776",
                "at most",
            ),
            ("name=a,channels=8,dst=0.0.0.0+4294967294:5", "more than"),
        ] {
            let e = WidebandOutput::parse(text).unwrap_err();
            assert!(e.contains(needle), "{text}: {e}");
        }
    }
}
