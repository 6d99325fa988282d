//! xbgpu's Prometheus metrics under katgpucbf's names (facts §1.8; namespace `xbgpu`), and
//! cbf's `output_frb_*` for `--frb-beam` outputs (katgpucbf has none), named as the beams' are.

use crate::engine::metrics::{receive, MetricSpec, Metrics, RECV_METRICS, SEND_METRICS};
use crate::spead::recv::StatsSnapshot;

/// (name, help, labels) of every metric.
pub const METRICS: [MetricSpec; 24] = [
    ("input_heaps", "F heaps received", &[]),
    (
        "input_samples",
        "Complex samples of F heaps received (channels × spectra × pols)",
        &[],
    ),
    (
        "input_missing_heaps",
        "F heaps missing from processed chunks",
        &[],
    ),
    ("input_chunks", "Input chunks processed", &[]),
    ("input_bytes", "Bytes of F heaps received", &[]),
    (
        "input_too_old_heaps",
        "Heaps that arrived after their chunk left the window",
        &[],
    ),
    (
        "input_incomplete_heaps",
        "Heaps evicted or flushed before all their packets came",
        &[],
    ),
    (
        "input_metadata_heaps",
        "Heaps without timestamp or feng_id, or of the wrong size",
        &[],
    ),
    (
        "input_bad_timestamp_heaps",
        "Heaps with a timestamp off the heap grid",
        &[],
    ),
    (
        "input_bad_feng_id_heaps",
        "Heaps with a feng_id outside the array",
        &[],
    ),
    ("output_x_heaps", "X heaps sent", &["stream"]),
    ("output_x_bytes", "X heap payload bytes sent", &["stream"]),
    ("output_x_visibilities", "Visibilities sent", &["stream"]),
    (
        "output_x_clipped_visibilities",
        "Visibilities saturated",
        &["stream"],
    ),
    (
        "output_x_skipped_accs",
        "Dumps not sent because no antenna was present",
        &["stream"],
    ),
    (
        "output_x_incomplete_accs",
        "Dumps sent with some antennas missing",
        &["stream"],
    ),
    ("output_b_heaps", "Beam heaps sent", &["stream"]),
    (
        "output_b_bytes",
        "Beam heap payload bytes sent",
        &["stream"],
    ),
    ("output_b_samples", "Beam samples sent", &["stream"]),
    (
        "output_b_clipped_samples",
        "Beam samples saturated",
        &["stream"],
    ),
    ("output_frb_heaps", "FRB heaps sent", &["stream"]),
    (
        "output_frb_bytes",
        "FRB heap payload bytes sent",
        &["stream"],
    ),
    (
        "output_frb_samples",
        "FRB intensities sent (channels x slow times x beams)",
        &["stream"],
    ),
    (
        "output_frb_clipped_samples",
        "FRB intensities saturated to float16",
        &["stream"],
    ),
];

pub fn new() -> Result<Metrics, prometheus::Error> {
    Metrics::new(
        "xbgpu",
        &[&METRICS[..], &RECV_METRICS[..], &SEND_METRICS[..]].concat(),
    )
}

/// The input side's totals.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct InputTotals {
    pub chunks: u64,
    pub heaps: u64,
    pub samples: u64,
    pub missing: u64,
}

/// One correlation output's totals.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct XTotals {
    pub heaps: u64,
    pub bytes: u64,
    pub visibilities: u64,
    pub clipped: u64,
    pub skipped_accs: u64,
    pub incomplete_accs: u64,
}

/// One beam's totals.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct BTotals {
    pub heaps: u64,
    pub bytes: u64,
    pub samples: u64,
    pub clipped: u64,
}

/// One `--frb-beam` output's totals.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct FrbTotals {
    pub heaps: u64,
    pub bytes: u64,
    pub samples: u64,
    pub clipped: u64,
}

pub fn input(m: &Metrics, t: &InputTotals, rx: &StatsSnapshot) {
    m.set("input_chunks", &[], t.chunks);
    m.set("input_heaps", &[], t.heaps);
    m.set("input_samples", &[], t.samples);
    m.set("input_missing_heaps", &[], t.missing);
    m.set("input_bytes", &[], rx.bytes);
    m.set("input_too_old_heaps", &[], rx.too_old_heaps);
    receive(m, rx);
    m.set(
        "input_incomplete_heaps",
        &[],
        rx.incomplete_heaps_evicted + rx.incomplete_heaps_flushed,
    );
    m.set("input_metadata_heaps", &[], rx.rejected_heaps[0]);
    m.set("input_bad_timestamp_heaps", &[], rx.rejected_heaps[1]);
    m.set("input_bad_feng_id_heaps", &[], rx.rejected_heaps[2]);
}

pub fn x_output(m: &Metrics, stream: &str, t: &XTotals) {
    m.set("output_x_heaps", &[stream], t.heaps);
    m.set("output_x_bytes", &[stream], t.bytes);
    m.set("output_x_visibilities", &[stream], t.visibilities);
    m.set("output_x_clipped_visibilities", &[stream], t.clipped);
    m.set("output_x_skipped_accs", &[stream], t.skipped_accs);
    m.set("output_x_incomplete_accs", &[stream], t.incomplete_accs);
}

pub fn b_output(m: &Metrics, stream: &str, t: &BTotals) {
    m.set("output_b_heaps", &[stream], t.heaps);
    m.set("output_b_bytes", &[stream], t.bytes);
    m.set("output_b_samples", &[stream], t.samples);
    m.set("output_b_clipped_samples", &[stream], t.clipped);
}

pub fn frb_output(m: &Metrics, stream: &str, t: &FrbTotals) {
    m.set("output_frb_heaps", &[stream], t.heaps);
    m.set("output_frb_bytes", &[stream], t.bytes);
    m.set("output_frb_samples", &[stream], t.samples);
    m.set("output_frb_clipped_samples", &[stream], t.clipped);
}
