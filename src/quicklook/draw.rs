//! PNG renderings of a [`QuickLook`] with `plotters`' bitmap backend. No text is drawn: the
//! crate is built without a font backend (no system font libraries), so the pictures carry
//! data only and [`QuickLook::summary`] carries the numbers.
//!
//! Every picture is [`WIDTH`] pixels wide and its column x shows channel ⌊x·N/WIDTH⌋ of N
//! (the strongest channel of those that share a column), so a channel can be read back from a
//! column. Power is in dB, from [`DB_RANGE`] below the strongest value to 3 dB above it.
//!
//! - `f-spectrum.png`: mean power per channel as filled columns, polarisation 0 (blue) above
//!   polarisation 1 (red).
//! - `x-baselines.png`: per baseline (at most [`MAX_BASELINE_ROWS`]), amplitude in dB (left)
//!   and phase from −π to π (right) per channel, products aa (blue) and bb (red).
//! - `x-waterfall.png`: amplitude of the waterfall baseline, one row per dump (oldest at the
//!   top), black (low) to white (high).
//! - `beam-power.png`: beam power in dB per heap, in arrival order.

use std::path::{Path, PathBuf};

use plotters::prelude::*;

use super::QuickLook;

/// Width of every picture, pixels.
pub const WIDTH: u32 = 1024;
/// Decibels shown below the strongest value.
pub const DB_RANGE: f64 = 60.0;
/// Baselines drawn in `x-baselines.png`.
pub const MAX_BASELINE_ROWS: usize = 16;
const PANEL_HEIGHT: u32 = 300;
const ROW_HEIGHT: u32 = 100;
/// Pixel rows per dump in the waterfall.
const WATERFALL_ROW: u32 = 4;

#[derive(Debug, thiserror::Error)]
#[error("{path}: {message}")]
pub struct DrawError {
    pub path: String,
    pub message: String,
}

/// The strongest of the values that share each of `WIDTH` columns: column x shows channels
/// ⌊x·N/W⌋ .. ⌊(x+1)·N/W⌋ (at least the first).
pub fn columns(values: &[f64]) -> Vec<f64> {
    let (n, w) = (values.len(), WIDTH as usize);
    (0..w)
        .map(|x| {
            let lo = x * n / w;
            let hi = ((x + 1) * n / w).max(lo + 1).min(n);
            values[lo.min(n.saturating_sub(1))..hi]
                .iter()
                .copied()
                .fold(f64::NEG_INFINITY, f64::max)
        })
        .collect()
}

fn db(p: f64) -> f64 {
    10.0 * p.max(1e-30).log10()
}

/// The dB axis for values whose strongest is `top` dB.
fn db_axis(top: f64) -> std::ops::Range<f64> {
    let top = if top.is_finite() { top } else { 0.0 };
    top - DB_RANGE..top + 3.0
}

fn fail(path: &Path) -> impl Fn(String) -> DrawError + '_ {
    move |message| DrawError {
        path: path.display().to_string(),
        message,
    }
}

/// Filled columns of `power` (linear) in `area`, in `colour`: column x of the area is
/// [`columns`]' x, drawn in pixel coordinates (one pixel wide, from the bottom up to its
/// value) so that a column can be read back as its channels.
fn spectrum_panel(
    area: &DrawingArea<BitMapBackend, plotters::coord::Shift>,
    power: &[f64],
    colour: RGBColor,
) -> Result<(), String> {
    let cols: Vec<f64> = columns(power).into_iter().map(db).collect();
    let axis = db_axis(cols.iter().copied().fold(f64::NEG_INFINITY, f64::max));
    let bottom = area.dim_in_pixel().1 as i32 - 1;
    for (x, v) in cols.iter().enumerate() {
        let level = (v - axis.start) / (axis.end - axis.start);
        if level.is_nan() || level <= 0.0 {
            continue;
        }
        let top = bottom - (level.min(1.0) * f64::from(bottom)).round() as i32;
        area.draw(&Rectangle::new(
            [(x as i32, top), (x as i32 + 1, bottom + 1)],
            colour.filled(),
        ))
        .map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// `f-spectrum.png`.
pub fn spectrum(q: &QuickLook, path: &Path) -> Result<(), DrawError> {
    let root = BitMapBackend::new(path, (WIDTH, 2 * PANEL_HEIGHT)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| fail(path)(e.to_string()))?;
    let panels = root.split_evenly((2, 1));
    for (pol, colour) in [(0, BLUE), (1, RED)] {
        spectrum_panel(&panels[pol], &q.spectrum(pol), colour).map_err(fail(path))?;
    }
    root.present().map_err(|e| fail(path)(e.to_string()))
}

/// `x-baselines.png`.
pub fn baselines(q: &QuickLook, path: &Path) -> Result<(), DrawError> {
    let rows = q.x_vis.len().clamp(1, MAX_BASELINE_ROWS);
    let root = BitMapBackend::new(path, (WIDTH, rows as u32 * ROW_HEIGHT)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| fail(path)(e.to_string()))?;
    let cells = root.split_evenly((rows, 2));
    for (b, prods) in q.x_vis.iter().take(rows).enumerate() {
        let n = prods[0].len().max(1) as f64;
        let top = prods
            .iter()
            .flatten()
            .flatten()
            .map(|v| db(v.norm_sqr()))
            .fold(f64::NEG_INFINITY, f64::max);
        let mut amp = ChartBuilder::on(&cells[2 * b])
            .margin(2)
            .build_cartesian_2d(0f64..n, db_axis(top))
            .map_err(|e| fail(path)(e.to_string()))?;
        let mut phase = ChartBuilder::on(&cells[2 * b + 1])
            .margin(2)
            .build_cartesian_2d(0f64..n, -std::f64::consts::PI..std::f64::consts::PI)
            .map_err(|e| fail(path)(e.to_string()))?;
        for (prod, colour) in prods.iter().zip([BLUE, RED]) {
            let points = |f: fn(num_complex::Complex64) -> f64| {
                prod.iter()
                    .enumerate()
                    .filter_map(move |(c, v)| v.map(|v| (c as f64 + 0.5, f(v))))
                    .collect::<Vec<_>>()
            };
            amp.draw_series(LineSeries::new(points(|v| db(v.norm_sqr())), &colour))
                .map_err(|e| fail(path)(e.to_string()))?;
            phase
                .draw_series(
                    points(|v| v.arg())
                        .into_iter()
                        .map(|p| Circle::new(p, 1, colour.filled())),
                )
                .map_err(|e| fail(path)(e.to_string()))?;
        }
    }
    root.present().map_err(|e| fail(path)(e.to_string()))
}

/// `x-waterfall.png`.
pub fn waterfall(q: &QuickLook, path: &Path) -> Result<(), DrawError> {
    let rows = q.waterfall.len().max(1) as u32;
    let root = BitMapBackend::new(path, (WIDTH, rows * WATERFALL_ROW)).into_drawing_area();
    root.fill(&BLACK).map_err(|e| fail(path)(e.to_string()))?;
    let db_rows: Vec<Vec<f64>> = q
        .waterfall
        .iter()
        .map(|(_, r)| columns(r).into_iter().map(|v| db(v * v)).collect())
        .collect();
    let top = db_rows
        .iter()
        .flatten()
        .copied()
        .fold(f64::NEG_INFINITY, f64::max);
    let axis = db_axis(top);
    for (y, row) in db_rows.iter().enumerate() {
        for (x, v) in row.iter().enumerate() {
            let level = ((v - axis.start) / (axis.end - axis.start)).clamp(0.0, 1.0);
            let g = (255.0 * level) as u8;
            let (x, y) = (x as i32, y as i32 * WATERFALL_ROW as i32);
            root.draw(&Rectangle::new(
                [(x, y), (x + 1, y + WATERFALL_ROW as i32)],
                RGBColor(g, g, g).filled(),
            ))
            .map_err(|e| fail(path)(e.to_string()))?;
        }
    }
    root.present().map_err(|e| fail(path)(e.to_string()))
}

/// `beam-power.png`.
pub fn beam(q: &QuickLook, path: &Path) -> Result<(), DrawError> {
    let root = BitMapBackend::new(path, (WIDTH, PANEL_HEIGHT)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| fail(path)(e.to_string()))?;
    let values: Vec<f64> = q.beam_power.iter().map(|(_, p)| db(*p)).collect();
    let top = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let mut chart = ChartBuilder::on(&root)
        .margin(2)
        .build_cartesian_2d(0f64..values.len().max(1) as f64, db_axis(top))
        .map_err(|e| fail(path)(e.to_string()))?;
    chart
        .draw_series(LineSeries::new(
            values.iter().enumerate().map(|(i, v)| (i as f64, *v)),
            &BLUE,
        ))
        .map_err(|e| fail(path)(e.to_string()))?;
    root.present().map_err(|e| fail(path)(e.to_string()))
}

/// Write the pictures there is data for into `dir`; their paths.
pub fn write_all(q: &QuickLook, dir: &Path) -> Result<Vec<PathBuf>, DrawError> {
    std::fs::create_dir_all(dir).map_err(|e| fail(dir)(e.to_string()))?;
    let mut written = Vec::new();
    let mut write = |name: &str, f: fn(&QuickLook, &Path) -> Result<(), DrawError>| {
        let path = dir.join(name);
        f(q, &path)?;
        written.push(path);
        Ok::<_, DrawError>(())
    };
    if q.f_heaps > 0 {
        write("f-spectrum.png", spectrum)?;
    }
    if q.x_heaps > 0 {
        write("x-baselines.png", baselines)?;
        write("x-waterfall.png", waterfall)?;
    }
    if !q.beam_power.is_empty() {
        write("beam-power.png", beam)?;
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;
    use num_complex::Complex64;

    /// (width, height, RGB rows) of a PNG file.
    fn read_png(path: &Path) -> (usize, usize, Vec<[u8; 3]>) {
        let mut r = png::Decoder::new(std::fs::File::open(path).unwrap())
            .read_info()
            .unwrap();
        let mut buf = vec![0; r.output_buffer_size()];
        let info = r.next_frame(&mut buf).unwrap();
        let n = info.color_type.samples();
        let px = buf[..info.buffer_size()]
            .chunks_exact(n)
            .map(|p| [p[0], p[1], p[2]])
            .collect();
        (info.width as usize, info.height as usize, px)
    }

    /// Synthetic X and beam data with a tone in channel 43 of 64: the waterfall's brightest
    /// column is the tone's, and every picture opens with its documented size.
    #[test]
    fn x_and_beam_pictures_open_and_show_the_tone() {
        let mut q = QuickLook::new();
        let tone = |c: usize| if c == 43 { 1e6 } else { 10.0 + c as f64 % 3.0 };
        q.x_vis = (0..3)
            .map(|b| {
                [0, 1].map(|_| {
                    (0..64)
                        .map(|c| Some(Complex64::from_polar(tone(c), 0.1 * b as f64)))
                        .collect()
                })
            })
            .collect();
        q.x_heaps = 6;
        for t in 0..5 {
            q.waterfall.push_back((t, (0..64).map(tone).collect()));
        }
        q.beam_power = (0..100).map(|t| (t, 1.0 + t as f64)).collect();
        let dir = std::env::temp_dir().join(format!("cbf-quicklook-{}", std::process::id()));
        let files = write_all(&q, &dir).unwrap();
        assert_eq!(files.len(), 3, "{files:?}");
        let (w, h, px) = read_png(&dir.join("x-waterfall.png"));
        assert_eq!((w, h), (WIDTH as usize, 5 * WATERFALL_ROW as usize));
        let brightness: Vec<u32> = (0..w)
            .map(|x| (0..h).map(|y| u32::from(px[y * w + x][0])).sum())
            .collect();
        let brightest = (0..w)
            .max_by_key(|&x| (brightness[x], std::cmp::Reverse(x)))
            .unwrap();
        assert_eq!(brightest * 64 / w, 43);
        let (w, h, _) = read_png(&dir.join("x-baselines.png"));
        assert_eq!((w, h), (WIDTH as usize, 3 * ROW_HEIGHT as usize));
        let (w, h, _) = read_png(&dir.join("beam-power.png"));
        assert_eq!((w, h), (WIDTH as usize, PANEL_HEIGHT as usize));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn columns_map_channels_to_pixels() {
        let mut v = vec![0.0; 64];
        v[43] = 5.0;
        let c = columns(&v);
        assert_eq!(c.len(), WIDTH as usize);
        // 16 columns per channel: channel 43 is columns 688..704.
        for (x, value) in c.iter().enumerate() {
            assert_eq!(*value == 5.0, (688..704).contains(&x), "{x}");
        }
        let mut v = vec![0.0; 4096];
        v[4095] = 1.0;
        assert_eq!(columns(&v)[1023], 1.0);
        assert_eq!(columns(&v)[1022], 0.0);
    }
}
