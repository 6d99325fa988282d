//! fgpu's Prometheus metrics under katgpucbf's names (facts §1.8; namespace `fgpu`).

use crate::engine::metrics::{receive, MetricSpec, Metrics, RECV_METRICS, SEND_METRICS};
use crate::spead::recv::StatsSnapshot;

/// (name, help, labels) of every metric.
pub const METRICS: [MetricSpec; 15] = [
    ("input_heaps", "Digitiser heaps received", &["pol"]),
    ("input_samples", "Digitiser samples received", &["pol"]),
    (
        "input_bytes",
        "Bytes of digitiser samples received",
        &["pol"],
    ),
    (
        "input_missing_heaps",
        "Digitiser heaps missing from processed chunks",
        &["pol"],
    ),
    (
        "input_clipped_samples",
        "Digitiser samples saturated (digitiser_status)",
        &["pol"],
    ),
    ("input_chunks", "Input chunks processed", &[]),
    (
        "input_too_old_heaps",
        "Heaps that arrived after their chunk left the window",
        &[],
    ),
    (
        "input_metadata_heaps",
        "Heaps without samples or timestamp",
        &[],
    ),
    (
        "input_bad_timestamp_heaps",
        "Heaps with a timestamp off the heap grid",
        &[],
    ),
    ("output_heaps", "Heaps sent", &["stream"]),
    ("output_bytes", "Bytes sent", &["stream"]),
    (
        "output_samples",
        "Complex samples sent (channels × spectra × pols)",
        &["stream"],
    ),
    (
        "output_skipped_heaps",
        "Output heaps not sent because input was missing",
        &["stream"],
    ),
    (
        "output_clipped_samples",
        "Output values saturated",
        &["stream", "pol"],
    ),
    (
        "output_stalled_heaps",
        "Output heaps dropped because the send path held every output buffer past its bound",
        &["stream"],
    ),
];

/// The input side's totals.
#[derive(Debug, Default, Clone, Copy)]
pub struct InputTotals {
    pub chunks: u64,
    pub heaps: [u64; 2],
    pub samples: [u64; 2],
    pub bytes: [u64; 2],
    pub missing: [u64; 2],
    pub clipped: [u64; 2],
}

/// An output's totals.
#[derive(Debug, Default, Clone, Copy)]
pub struct OutputTotals {
    pub heaps: u64,
    pub bytes: u64,
    pub samples: u64,
    pub skipped: u64,
    /// Heaps dropped because the send path held every output buffer (`--use-peerdirect`)
    /// past the wait's bound (cbf's own counter).
    pub stalled: u64,
    pub clipped: [u64; 2],
}

pub fn new() -> Result<Metrics, prometheus::Error> {
    Metrics::new(
        "fgpu",
        &[&METRICS[..], &RECV_METRICS[..], &SEND_METRICS[..]].concat(),
    )
}

pub fn input(m: &Metrics, t: &InputTotals, rx: &StatsSnapshot) {
    m.set("input_chunks", &[], t.chunks);
    for pol in 0..2 {
        let p = pol.to_string();
        m.set("input_heaps", &[&p], t.heaps[pol]);
        m.set("input_samples", &[&p], t.samples[pol]);
        m.set("input_bytes", &[&p], t.bytes[pol]);
        m.set("input_missing_heaps", &[&p], t.missing[pol]);
        m.set("input_clipped_samples", &[&p], t.clipped[pol]);
    }
    m.set("input_too_old_heaps", &[], rx.too_old_heaps);
    receive(m, rx);
    m.set("input_metadata_heaps", &[], rx.rejected_heaps[0]);
    m.set("input_bad_timestamp_heaps", &[], rx.rejected_heaps[1]);
}

pub fn output(m: &Metrics, stream: &str, t: &OutputTotals) {
    m.set("output_heaps", &[stream], t.heaps);
    m.set("output_bytes", &[stream], t.bytes);
    m.set("output_samples", &[stream], t.samples);
    m.set("output_skipped_heaps", &[stream], t.skipped);
    m.set("output_stalled_heaps", &[stream], t.stalled);
    for (pol, v) in t.clipped.iter().enumerate() {
        m.set("output_clipped_samples", &[stream, &pol.to_string()], *v);
    }
}
