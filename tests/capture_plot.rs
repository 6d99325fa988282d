//! `cbf capture --plot`: a dsim tone channelised by an F-engine, captured and drawn; the
//! spectrum PNG is read back and the tone's channel is its brightest (tallest) column in both
//! polarisations' panels. The reference channel comes from the tone's frequency alone:
//! channel c is centred on c · fs / (2 · channels).

mod common;

use std::process::Command;
use std::time::Duration;

use common::Kill;

const FS: f64 = 2e6;
const CHANNELS: usize = 64;
const TONE_HZ: f64 = 671875.0;

/// Per column of the rows `rows`, the pixels that are not white.
fn inked_columns(
    path: &std::path::Path,
    rows: std::ops::Range<usize>,
) -> (Vec<usize>, usize, usize) {
    let decoder = png::Decoder::new(std::fs::File::open(path).unwrap());
    let mut reader = decoder.read_info().unwrap();
    let mut buf = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut buf).unwrap();
    let (w, h) = (info.width as usize, info.height as usize);
    let px = info.color_type.samples();
    let mut ink = vec![0; w];
    for y in rows {
        for (x, n) in ink.iter_mut().enumerate() {
            let p = &buf[(y * w + x) * px..(y * w + x) * px + 3];
            if p != [255, 255, 255] {
                *n += 1;
            }
        }
    }
    (ink, w, h)
}

#[test]
fn the_tone_is_the_brightest_column_of_the_spectrum_png() {
    let cbf = env!("CARGO_BIN_EXE_cbf");
    let (in_port, out_port) = (common::free_udp_port(), common::free_udp_port());
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("capture_plot");
    let _ = std::fs::remove_dir_all(&dir);
    let sync = (std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
        - 10.0)
        .floor()
        .to_string();
    // The capture first: the F-engine sends its descriptors when it starts.
    let capture = Command::new(cbf)
        .args(["capture", &format!("127.0.0.1:{out_port}"), "--plot"])
        .arg(&dir)
        .args(["--plot-every", "1", "--duration", "6"])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let _feng = Kill(
        Command::new(cbf)
            .args(["fengine", "--src", &format!("127.0.0.1:{in_port}")])
            .args(["--adc-sample-rate", &FS.to_string(), "--sync-time", &sync])
            .args([
                "--recv-chunk-samples",
                "65536",
                "--jones-per-batch",
                "16384",
            ])
            .args([
                "--max-delay-diff",
                "0",
                "--gain",
                "0.05",
                "--array-size",
                "1",
            ])
            .args([
                "--katcp-port",
                "0",
                "--katcp-host",
                "127.0.0.1",
                "--duration",
                "8",
            ])
            .args([
                "--wideband",
                &format!("name=wide,channels={CHANNELS},dst=127.0.0.1:{out_port}"),
            ])
            .spawn()
            .unwrap(),
    );
    std::thread::sleep(Duration::from_millis(500));
    let _dsim = Kill(
        Command::new(cbf)
            .args([
                "dsim",
                "--adc-sample-rate",
                &FS.to_string(),
                "--sync-time",
                &sync,
            ])
            .args([
                "--period",
                "65536",
                "--max-period",
                "65536",
                "--duration",
                "5",
            ])
            .args([
                "--katcp-port",
                "0",
                "--signals",
                &format!("cw(0.1, {TONE_HZ});"),
            ])
            .args([
                format!("127.0.0.1:{in_port}"),
                format!("127.0.0.1:{in_port}"),
            ])
            .spawn()
            .unwrap(),
    );
    let out = capture.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");

    let expected = (TONE_HZ / (FS / (2.0 * CHANNELS as f64))).round() as usize;
    assert_eq!(expected, 43);
    assert!(
        err.contains(&format!("peak channel pol0 {expected} ")),
        "{err}"
    );
    let path = dir.join("f-spectrum.png");
    let (_, w, h) = inked_columns(&path, 0..1);
    // Polarisation 0 in the top half, 1 in the bottom half.
    for rows in [0..h / 2, h / 2..h] {
        let (ink, _, _) = inked_columns(&path, rows.clone());
        let brightest = (0..w)
            .max_by_key(|&x| (ink[x], std::cmp::Reverse(x)))
            .unwrap();
        assert_eq!(brightest * CHANNELS / w, expected, "rows {rows:?}: {ink:?}");
        let median = {
            let mut s = ink.clone();
            s.sort_unstable();
            s[w / 2]
        };
        assert!(ink[brightest] > median, "{ink:?}");
    }
    // No X or beam heaps here: only the spectrum is drawn.
    assert!(!dir.join("x-waterfall.png").exists());
}
