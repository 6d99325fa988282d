//! The `--frb-beam` output (seed 004; cbf's own, katgpucbf has none):
//! `name=…,dst=A.B.C.D:port,grid=M×N,dish_map=FILE,t_ds=T,beams=P×Q|FILE[,scale=S][,stage2=f16|f32]`, parsed
//! with errors that name the key, its files read with a bound on their size.
//!
//! - `grid=M×N` (or `MxN`): the regular dish grid, 1 ≤ M, N ≤ [`MAX_GRID_SIDE`].
//! - `dish_map=FILE`: where each antenna sits, one line `m n` per antenna in feng_id order
//!   (0 ≤ m < M, 0 ≤ n < N, each cell at most once); blank lines and `#` comments are
//!   skipped. Every antenna of the array is on the grid; cells without one are zero.
//! - `t_ds=T`: fast spectra summed into one slow time (1 ≤ T ≤ [`MAX_T_DS`]; the engine also
//!   wants T to divide a chunk's spectra).
//! - `beams=P×Q`: the factorisable set of [`FrbBeams::even`] (P·Q beams, θ_i = M(i − ⌊P/2⌋)/P,
//!   θ′_j = N(j − ⌊Q/2⌋)/Q, beam i·Q + j); `beams=FILE`: arbitrary beams, one line `θ θ′` per
//!   beam (seed 004 eq. 1's normalised coordinates, |θ|, |θ′| ≤ [`MAX_THETA`]), same comments.
//!   At most [`MAX_FRB_BEAMS`] beams; arbitrary beams also at most [`MAX_RESAMPLE_WEIGHTS`]
//!   entries of the resampling matrix W (4MN × B). A list can be re-pointed at run time,
//!   keeping its count (`?frb-beams`, [`super::frb_pointing`]).
//! - `scale=S`: intensities are sent as S·J in float16; default 1 / (2 · T · dishes), the mean
//!   power per dish, polarisation and fast sample, so that noise of unit variance per
//!   component reads ≈ 2 in every beam.
//! - `stage2=f16|f32`: the arithmetic of the CUDA backend's second stage (`gpu::frb_resample`):
//!   fp16 operands with fp32 sums on the tensor cores (default; its derived error bound is
//!   acceptable for intensities, see there), or float32 throughout. The CPU backend computes
//!   in float32 either way.
#![deny(unsafe_code)]

use std::io::Read;
use std::net::SocketAddrV4;
use std::path::Path;

use super::output::{one_endpoint, pairs, valid_name};
use crate::dsp::frb::DishGrid;
use crate::dsp::frb_resample::FrbBeams;

/// Largest side of the dish grid (seed 004's largest case is 24 × 24).
pub const MAX_GRID_SIDE: usize = 64;
/// Largest T_ds: the GPU first stage's, so that one bound serves both backends.
pub const MAX_T_DS: usize = crate::gpu::frb::MAX_T_DS;
/// Most beams of one output (seed 004 Table 4's largest: 96 × 96 = 9216).
pub const MAX_FRB_BEAMS: usize = 1 << 16;
/// Most entries of the arbitrary beams' resampling matrix (f32: 256 MiB).
pub const MAX_RESAMPLE_WEIGHTS: usize = 1 << 26;
/// Largest |θ| of a beam (J is periodic in θ; beyond this f64 loses the phase).
pub const MAX_THETA: f64 = 1e6;
/// Largest FRB heap (one chunk of one output).
pub const MAX_HEAP_BYTES: usize = 256 << 20;
/// Largest dish-map or beams file.
pub const MAX_FILE_BYTES: u64 = 4 << 20;

/// An `--frb-beam` output.
#[derive(Debug, Clone, PartialEq)]
pub struct FrbBeamOutput {
    pub name: String,
    pub dst: SocketAddrV4,
    pub grid: DishGrid,
    pub t_ds: usize,
    pub beams: FrbBeams,
    /// `scale=`, or `None` for the default.
    pub scale: Option<f64>,
    /// `stage2=f32`: the CUDA second stage in float32 rather than fp16.
    pub stage2_f32: bool,
}

impl FrbBeamOutput {
    /// The float16 scale: `scale=`, or 1 / (2 · T_ds · dishes).
    pub fn scale(&self) -> f64 {
        self.scale
            .unwrap_or(1.0 / (2.0 * self.t_ds as f64 * self.grid.dishes().max(1) as f64))
    }

    /// How the output fits the engine: one dish per antenna of `--array-size`, T_ds dividing
    /// a chunk's `chunk_spectra`, heaps of `channels` channels within [`MAX_HEAP_BYTES`].
    /// `Err` names the key.
    pub fn check(
        &self,
        n_ants: usize,
        chunk_spectra: usize,
        channels: usize,
    ) -> Result<(), String> {
        let name = &self.name;
        if self.grid.dishes() != n_ants {
            return Err(format!(
                "dish_map of {name}: {} dishes for an --array-size of {n_ants} (one line per antenna)",
                self.grid.dishes()
            ));
        }
        if chunk_spectra % self.t_ds != 0 {
            return Err(format!(
                "t_ds={} of {name}: must divide a chunk's {chunk_spectra} spectra (spectra per heap × --heaps-per-fengine-per-chunk)",
                self.t_ds
            ));
        }
        let bytes = (chunk_spectra / self.t_ds)
            .checked_mul(self.beams.len())
            .and_then(|v| v.checked_mul(2 * channels))
            .filter(|&b| b <= MAX_HEAP_BYTES);
        if bytes.is_none() {
            return Err(format!(
                "beams of {name}: heaps over {} MiB (fewer beams, a larger t_ds or smaller chunks)",
                MAX_HEAP_BYTES >> 20
            ));
        }
        Ok(())
    }

    /// Parse the sub-option string, reading the files it names; `Err` is a message for the
    /// `--frb-beam` flag, starting with the key at fault.
    pub fn parse(text: &str) -> Result<FrbBeamOutput, String> {
        let (mut name, mut dst, mut grid, mut map, mut t_ds, mut beams, mut scale) =
            (None, None, None, None, None, None, None);
        let mut stage2_f32 = false;
        for (k, v) in pairs(text)? {
            match k {
                "name" => name = Some(valid_name(v)?),
                "dst" => dst = Some(one_endpoint(v)?),
                "grid" => grid = Some(parse_pair(v, 1, MAX_GRID_SIDE).map_err(|e| key(k, v, e))?),
                "dish_map" => map = Some(v),
                "t_ds" => t_ds = Some(parse_count(v, MAX_T_DS).map_err(|e| key(k, v, e))?),
                "beams" => beams = Some(v),
                "scale" => {
                    scale = Some(
                        v.parse::<f64>()
                            .ok()
                            .filter(|s| s.is_finite() && *s > 0.0)
                            .ok_or_else(|| key(k, v, "not a positive number"))?,
                    )
                }
                "stage2" => {
                    stage2_f32 = match v {
                        "f16" => false,
                        "f32" => true,
                        _ => return Err(key(k, v, "expected f16 or f32")),
                    }
                }
                _ => return Err(format!("unknown key {k:?}")),
            }
        }
        let (rows, cols) = grid.ok_or("missing grid=")?;
        let map = map.ok_or("missing dish_map=")?;
        let grid = read_bounded(map)
            .and_then(|t| parse_dish_map(&t, rows, cols))
            .map_err(|e| key("dish_map", map, e))?;
        let beams = beams.ok_or("missing beams=")?;
        let is_pair = beams
            .split_once(['x', '×'])
            .is_some_and(|(a, b)| [a, b].iter().all(|t| t.bytes().all(|c| c.is_ascii_digit())));
        let beams = match parse_pair(beams, 1, MAX_FRB_BEAMS) {
            Ok((p, q)) if p * q <= MAX_FRB_BEAMS => FrbBeams::even(rows, cols, p, q),
            Ok(_) => return Err(key("beams", beams, format!("over {MAX_FRB_BEAMS} beams"))),
            Err(e) if is_pair => return Err(key("beams", beams, e)),
            Err(_) => FrbBeams::List(
                read_bounded(beams)
                    .and_then(|t| parse_beam_list(&t, rows, cols))
                    .map_err(|e| key("beams", beams, e))?,
            ),
        };
        Ok(FrbBeamOutput {
            name: name.ok_or("missing name=")?,
            dst: dst.ok_or("missing dst=")?,
            grid,
            t_ds: t_ds.ok_or("missing t_ds=")?,
            beams,
            scale,
            stage2_f32,
        })
    }
}

fn key(k: &str, v: &str, e: impl std::fmt::Display) -> String {
    format!("{k}={v}: {e}")
}

fn parse_count(v: &str, max: usize) -> Result<usize, String> {
    match v.parse::<usize>() {
        Ok(n) if (1..=max).contains(&n) => Ok(n),
        _ => Err(format!("must be an integer 1–{max}")),
    }
}

/// `A×B` or `AxB`, each 1–`max`.
fn parse_pair(v: &str, min: usize, max: usize) -> Result<(usize, usize), String> {
    let (a, b) = v
        .split_once(['x', '×'])
        .ok_or_else(|| "expected A×B".to_string())?;
    let n = |t: &str| match t.parse::<usize>() {
        Ok(n) if (min..=max).contains(&n) => Ok(n),
        _ => Err(format!("sides must be integers {min}–{max}")),
    };
    Ok((n(a)?, n(b)?))
}

/// A file's text, refused beyond [`MAX_FILE_BYTES`].
fn read_bounded(path: &str) -> Result<String, String> {
    let file = std::fs::File::open(Path::new(path)).map_err(|e| e.to_string())?;
    let mut text = String::new();
    file.take(MAX_FILE_BYTES + 1)
        .read_to_string(&mut text)
        .map_err(|e| e.to_string())?;
    if text.len() as u64 > MAX_FILE_BYTES {
        return Err(format!("file over {MAX_FILE_BYTES} bytes"));
    }
    Ok(text)
}

/// Non-empty lines without comments, with their 1-based numbers.
fn lines(text: &str) -> impl Iterator<Item = (usize, Vec<&str>)> {
    text.lines().enumerate().filter_map(|(i, l)| {
        let l = l.split('#').next().unwrap_or("");
        let words: Vec<&str> = l.split_whitespace().collect();
        (!words.is_empty()).then_some((i + 1, words))
    })
}

/// The dish map: one `m n` line per antenna.
pub fn parse_dish_map(text: &str, rows: usize, cols: usize) -> Result<DishGrid, String> {
    let mut cells = Vec::new();
    for (line, words) in lines(text) {
        let pos = match words.as_slice() {
            [m, n] => m.parse::<usize>().ok().zip(n.parse::<usize>().ok()),
            _ => None,
        };
        let pos = pos.ok_or_else(|| format!("line {line}: expected two integers \"m n\""))?;
        if cells.len() >= rows * cols {
            return Err(format!(
                "line {line}: more dishes than the {rows}×{cols} grid holds"
            ));
        }
        cells.push(pos);
    }
    DishGrid::new(rows, cols, &cells).map_err(|e| format!("{e} (antennas count from 0)"))
}

/// One coordinate of a beam centre, as the beams file and `?frb-beams` take it: a number
/// within ±[`MAX_THETA`] (so finite).
pub fn parse_theta(t: &str) -> Option<f64> {
    t.parse::<f64>().ok().filter(|v| v.abs() <= MAX_THETA)
}

/// The arbitrary beams: one `θ θ′` line per beam.
pub fn parse_beam_list(text: &str, rows: usize, cols: usize) -> Result<Vec<(f64, f64)>, String> {
    let mut beams = Vec::new();
    let per_beam = 4 * rows * cols;
    for (line, words) in lines(text) {
        let beam = match words.as_slice() {
            [a, b] => parse_theta(a).zip(parse_theta(b)),
            _ => None,
        };
        let beam = beam.ok_or_else(|| {
            format!("line {line}: expected two numbers \"θ θ′\" within ±{MAX_THETA}")
        })?;
        if beams.len() >= MAX_FRB_BEAMS || (beams.len() + 1) * per_beam > MAX_RESAMPLE_WEIGHTS {
            return Err(format!(
                "line {line}: over {} beams for a {rows}×{cols} grid",
                MAX_FRB_BEAMS.min(MAX_RESAMPLE_WEIGHTS / per_beam)
            ));
        }
        beams.push(beam);
    }
    if beams.is_empty() {
        return Err("no beams in the file".into());
    }
    Ok(beams)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(name: &str, text: &str) -> String {
        let dir = std::env::temp_dir().join(format!("cbf-frb-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p.to_str().unwrap().to_string()
    }

    #[test]
    fn parses_grids_maps_and_beams() {
        let map = file("map-ok", "# m n\n0 0\n1 2  # dish 1\n\n0 1\n");
        let beams = file("beams-ok", "0.5 -1.25\n3 4\n");
        let o = FrbBeamOutput::parse(&format!(
            "name=frb,dst=239.1.2.3:7148,grid=2×3,dish_map={map},t_ds=3,beams=4x3"
        ))
        .unwrap();
        assert_eq!((o.grid.rows, o.grid.cols, o.grid.dishes()), (2, 3, 3));
        assert_eq!(o.grid.cells(), [0, 5, 1]);
        assert_eq!(o.beams, FrbBeams::even(2, 3, 4, 3));
        assert!((o.scale() - 1.0 / 18.0).abs() < 1e-15);
        assert!(!o.stage2_f32, "fp16 by default");
        let o = FrbBeamOutput::parse(&format!(
            "name=frb,dst=239.1.2.3:7148,grid=2x3,dish_map={map},t_ds=1,beams={beams},scale=0.5,stage2=f32"
        ))
        .unwrap();
        assert_eq!(o.beams, FrbBeams::List(vec![(0.5, -1.25), (3.0, 4.0)]));
        assert_eq!(o.scale(), 0.5);
        assert!(o.stage2_f32);
    }

    #[test]
    fn refusals_name_the_key() {
        let map = file("map", "0 0\n0 1\n");
        let beams = file("beams", "0 0\n");
        let good = format!("name=f,dst=239.1.2.3:7148,grid=2x2,dish_map={map},t_ds=2,beams=2x2");
        assert!(FrbBeamOutput::parse(&good).is_ok());
        let with = |k: &str, v: &str| {
            let text: Vec<String> = good
                .split(',')
                .map(|p| {
                    if p.starts_with(&format!("{k}=")) {
                        format!("{k}={v}")
                    } else {
                        p.to_string()
                    }
                })
                .collect();
            FrbBeamOutput::parse(&text.join(",")).unwrap_err()
        };
        for (k, v) in [
            ("grid", "0x4"),
            ("grid", "65x2"),
            ("grid", "4"),
            ("t_ds", "0"),
            ("t_ds", "65537"),
            ("beams", "300x300"),
            ("beams", "0x2"),
            ("beams", "/nonexistent"),
            ("dish_map", "/nonexistent"),
        ] {
            let e = with(k, v);
            assert!(e.starts_with(&format!("{k}=")), "{k}={v}: {e}");
        }
        let bad_map = |text: &str| with("dish_map", &file("bad-map", text));
        assert!(bad_map("0 0\n2 0\n").contains("outside"));
        assert!(bad_map("0 1\n0 1\n").contains("share"));
        assert!(bad_map("0 0\n0 x\n").contains("line 2"));
        assert!(bad_map("0 0 0\n").contains("line 1"));
        assert!(bad_map(&"0 0\n".repeat(5)).contains("more dishes"));
        let bad_beams = |text: &str| with("beams", &file("bad-beams", text));
        assert!(bad_beams("1\n").contains("line 1"));
        assert!(bad_beams("0 nan\n").contains("line 1"));
        assert!(bad_beams("0 1e7\n").contains("line 1"));
        assert!(bad_beams("# none\n").contains("no beams"));
        assert!(bad_beams(&"0 0\n".repeat(MAX_FRB_BEAMS + 1)).contains("over"));
        assert!(with(
            "beams",
            &file("big", &"#".repeat(MAX_FILE_BYTES as usize + 1))
        )
        .contains("over"));
        assert!(
            FrbBeamOutput::parse(&good.replace("beams=2x2", &format!("beams={beams}"))).is_ok()
        );
        assert!(FrbBeamOutput::parse(&format!("{good},scale=-1"))
            .unwrap_err()
            .starts_with("scale="));
        assert!(
            !FrbBeamOutput::parse(&format!("{good},stage2=f16"))
                .unwrap()
                .stage2_f32
        );
        assert!(FrbBeamOutput::parse(&format!("{good},stage2=f64"))
            .unwrap_err()
            .starts_with("stage2=f64: expected f16 or f32"));
        assert!(FrbBeamOutput::parse(&format!("{good},colour=red"))
            .unwrap_err()
            .contains("colour"));
        let missing = |k: &str| {
            let text: Vec<&str> = good.split(',').filter(|p| !p.starts_with(k)).collect();
            FrbBeamOutput::parse(&text.join(",")).unwrap_err()
        };
        for k in ["name", "dst", "grid", "dish_map", "t_ds", "beams"] {
            assert!(missing(k).contains(k), "{k}: {}", missing(k));
        }
    }
}
