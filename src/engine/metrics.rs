//! An engine's Prometheus counters under katgpucbf's names (facts §1.8): a fixed table of
//! (name, help, labels) registered once in a registry namespaced by the program (`fgpu`,
//! `xbgpu`, `fsim`, ...). Each counter is exposed as `{namespace}_{name}_total`, as Python's
//! prometheus_client (katgpucbf's) names a counter, so that dashboards and alerts written for
//! katgpucbf read cbf unchanged; the code refers to it by its bare name. Engines keep their
//! own totals and bring the counters up to them, since a Prometheus counter only moves
//! forward.

use std::collections::HashMap;
use std::sync::atomic::Ordering;

use prometheus::{CounterVec, IntCounterVec, Opts, Registry};

use super::send::SinkCounters;
use crate::spead::recv::StatsSnapshot;

/// (name, help, label names) of one counter.
pub type MetricSpec = (&'static str, &'static str, &'static [&'static str]);

/// Receive counters every engine adds to katgpucbf's set (cbf's own names; katgpucbf exports
/// none of spead2's stream statistics but its own, facts §1.8): the window protections of
/// issue 11, the kernel's socket drops, so that no loss goes unseen, and spead2's
/// `worker_blocked` (the waits of receive threads for a free chunk: the consumer is behind,
/// and the drops that follow are the engine's, not the network's), with the time they took
/// (`_seconds`, a float counter: see [`Metrics::new`]).
pub const RECV_METRICS: [MetricSpec; 6] = [
    (
        "input_far_future_heaps",
        "Heaps far ahead of the window, dropped until enough agreed",
        &[],
    ),
    ("input_window_jumps", "Far jumps of the chunk window", &[]),
    (
        "input_resyncs",
        "Resynchronisations of the chunk window after persistent too-old input",
        &[],
    ),
    (
        "input_kernel_dropped_packets",
        "Datagrams the kernel dropped because the socket buffer was full (with UDP GRO one \
         datagram can hold up to 64 KiB of coalesced packets; DPDK: frames the port missed)",
        &[],
    ),
    (
        "input_worker_blocked",
        "Times a receive thread waited for a free chunk (spead2's worker_blocked)",
        &[],
    ),
    (
        "input_worker_blocked_seconds",
        "Seconds receive threads spent waiting for a free chunk, summed over threads",
        &[],
    ),
];

/// Send counters every engine adds to katgpucbf's set (cbf's own names): how the output of
/// each stream spreads over its `--send-interface` list and what an interface outage cost,
/// by cause: heaps not sent because no interface was up, and packets (with the heaps they
/// carried) that an interface's NIC had taken and lost when its link failed under them.
pub const SEND_METRICS: [MetricSpec; 5] = [
    (
        "output_interface_bytes",
        "Bytes sent on each send interface",
        &["stream", "interface"],
    ),
    (
        "output_interface_downs",
        "Times a send interface failed and was taken out of the rotation",
        &["stream", "interface"],
    ),
    (
        "output_lost_heaps",
        "Heaps not sent because no send interface was up",
        &["stream"],
    ),
    (
        "output_interface_lost_packets",
        "Packets a send interface's NIC had taken and lost when its link failed",
        &["stream", "interface"],
    ),
    (
        "output_interface_lost_heaps",
        "Heaps with packets among those lost on a send interface (a send call's heaps counted whole)",
        &["stream", "interface"],
    ),
];

/// Bring the [`SEND_METRICS`] of `stream` up to its send thread's counters `c`.
pub fn send(m: &Metrics, stream: &str, c: &SinkCounters) {
    m.set(
        "output_lost_heaps",
        &[stream],
        c.lost_heaps.load(Ordering::Relaxed),
    );
    for i in &c.interfaces {
        let labels = [stream, i.name.as_str()];
        m.set(
            "output_interface_bytes",
            &labels,
            i.bytes.load(Ordering::Relaxed),
        );
        m.set(
            "output_interface_downs",
            &labels,
            i.downs.load(Ordering::Relaxed),
        );
        m.set(
            "output_interface_lost_packets",
            &labels,
            i.lost_packets.load(Ordering::Relaxed),
        );
        m.set(
            "output_interface_lost_heaps",
            &labels,
            i.lost_heaps.load(Ordering::Relaxed),
        );
    }
}

/// Bring the [`RECV_METRICS`] up to the receive statistics `rx`.
pub fn receive(m: &Metrics, rx: &StatsSnapshot) {
    m.set("input_far_future_heaps", &[], rx.far_future_heaps);
    m.set("input_window_jumps", &[], rx.window_jumps);
    m.set("input_resyncs", &[], rx.resyncs);
    m.set("input_kernel_dropped_packets", &[], rx.kernel_drops);
    m.set("input_worker_blocked", &[], rx.worker_blocked);
    m.set_seconds(
        "input_worker_blocked_seconds",
        &[],
        rx.worker_blocked_seconds(),
    );
}

/// The registry and its counters.
pub struct Metrics {
    pub registry: Registry,
    counters: HashMap<&'static str, IntCounterVec>,
    /// Counters of seconds (names ending in [`SECONDS`]), kept as floats.
    seconds: HashMap<&'static str, CounterVec>,
}

/// The unit suffix of a counter of seconds (Prometheus' base unit of time).
pub const SECONDS: &str = "_seconds";

impl Metrics {
    /// Register every counter of `table` under `namespace`: integer counters, except those
    /// whose name ends in [`SECONDS`], which count seconds as floats (moved by
    /// [`Metrics::set_seconds`]), as Prometheus' naming conventions have time counted.
    pub fn new(namespace: &str, table: &[MetricSpec]) -> Result<Metrics, prometheus::Error> {
        let registry = Registry::new_custom(Some(namespace.into()), None)?;
        let mut counters = HashMap::new();
        let mut seconds = HashMap::new();
        for &(name, help, labels) in table {
            let opts = Opts::new(format!("{name}_total"), help);
            if name.ends_with(SECONDS) {
                let c = CounterVec::new(opts, labels)?;
                registry.register(Box::new(c.clone()))?;
                if labels.is_empty() {
                    c.with_label_values::<&str>(&[]);
                }
                seconds.insert(name, c);
                continue;
            }
            let c = IntCounterVec::new(opts, labels)?;
            registry.register(Box::new(c.clone()))?;
            if labels.is_empty() {
                // Shown (at 0) from the start, as katgpucbf's counters are.
                c.with_label_values::<&str>(&[]);
            }
            counters.insert(name, c);
        }
        Ok(Metrics {
            registry,
            counters,
            seconds,
        })
    }

    /// Bring counter of seconds `name{labels}` up to `value`; a smaller value leaves it.
    pub fn set_seconds(&self, name: &str, labels: &[&str], value: f64) {
        if let Some(c) = self.seconds.get(name) {
            if let Ok(c) = c.get_metric_with_label_values(labels) {
                let up = value - c.get();
                if up > 0.0 {
                    c.inc_by(up);
                }
            }
        }
    }

    /// Show counter `name{labels}` (at 0) before it first moves.
    pub fn touch(&self, name: &str, labels: &[&str]) {
        self.set(name, labels, 0);
    }

    /// Every counter whose name starts with `prefix`, for one set of labels.
    pub fn touch_all(&self, prefix: &str, labels: &[&str]) {
        for (name, c) in &self.counters {
            if name.starts_with(prefix) {
                let _ = c.get_metric_with_label_values(labels);
            }
        }
    }

    /// Bring counter `name{labels}` up to `value`; a smaller value leaves it as it is.
    pub fn set(&self, name: &str, labels: &[&str], value: u64) {
        if let Some(c) = self.counters.get(name) {
            if let Ok(c) = c.get_metric_with_label_values(labels) {
                c.inc_by(value.saturating_sub(c.get()));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus::{Encoder, TextEncoder};

    fn text(m: &Metrics) -> String {
        let mut out = Vec::new();
        TextEncoder::new()
            .encode(&m.registry.gather(), &mut out)
            .unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn counters_carry_the_namespace_and_never_go_back() {
        let m = Metrics::new("xbgpu", &[("output_x_heaps", "X heaps sent", &["stream"])]).unwrap();
        m.set("output_x_heaps", &["bl"], 5);
        m.set("output_x_heaps", &["bl"], 3);
        // Wrong label count and unknown names are ignored, not fatal.
        m.set("output_x_heaps", &[], 9);
        m.set("nope", &[], 1);
        let t = text(&m);
        assert!(
            t.contains("xbgpu_output_x_heaps_total{stream=\"bl\"} 5"),
            "{t}"
        );
        assert!(
            t.contains("# TYPE xbgpu_output_x_heaps_total counter"),
            "{t}"
        );
    }

    #[test]
    fn receive_counters_carry_the_worker_blocked_count_and_seconds() {
        let m = Metrics::new("fgpu", &RECV_METRICS).unwrap();
        let t = text(&m);
        assert!(t.contains("fgpu_input_worker_blocked_total 0\n"), "{t}");
        assert!(
            t.contains("fgpu_input_worker_blocked_seconds_total 0\n"),
            "{t}"
        );
        let rx = StatsSnapshot {
            worker_blocked: 3,
            worker_blocked_ns: 2_500_000_000,
            ..StatsSnapshot::default()
        };
        receive(&m, &rx);
        // Going back (a smaller snapshot) leaves both where they were.
        receive(&m, &StatsSnapshot::default());
        let t = text(&m);
        assert!(t.contains("fgpu_input_worker_blocked_total 3\n"), "{t}");
        assert!(
            t.contains("# TYPE fgpu_input_worker_blocked_seconds_total counter"),
            "{t}"
        );
        assert!(
            t.contains("fgpu_input_worker_blocked_seconds_total 2.5\n"),
            "{t}"
        );
    }
}
