//! An event timeline of a stream's work, for benchmarks: spans (label, start, end) recorded
//! with timing events around copies and launches, summarised per label as count, busy time
//! and the idle time between consecutive spans of that label. It answers the question a
//! throughput figure cannot: which of the copies and launches ran back to back, and where a
//! stream sat idle waiting for the host or for another stream. Off, it records nothing.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use cudarc::driver::{CudaEvent, CudaStream, DevicePtrMut};

use super::{Gpu, GpuError};

/// Spans recorded so far (empty and inert unless [`Timeline::enable`]d); clones share them, so
/// a benchmark keeps a handle to the timeline of a backend it hands over.
#[derive(Default, Clone)]
pub struct Timeline {
    spans: Option<Arc<Mutex<Vec<Span>>>>,
    /// Host time spent blocked, per label: (count, total).
    waits: Option<Arc<Mutex<Waits>>>,
}

type Span = (&'static str, CudaEvent, CudaEvent);

/// Per label: how many waits and their total.
type Waits = BTreeMap<&'static str, (usize, Duration)>;

/// One label's summary, in milliseconds from the first recorded event.
#[derive(Debug, Clone)]
pub struct LabelSummary {
    pub label: &'static str,
    pub count: usize,
    pub busy_ms: f64,
    pub mean_ms: f64,
    pub max_ms: f64,
    /// Σ of the gaps between one span's end and the next span's start, and the largest.
    pub idle_ms: f64,
    pub max_gap_ms: f64,
}

impl Timeline {
    pub fn enable(&mut self) {
        self.spans.get_or_insert_with(Arc::default);
        self.waits.get_or_insert_with(Arc::default);
    }

    /// Run `f` (a host wait on the device), timing it under `label` if recording.
    pub fn wait<T>(&self, label: &'static str, f: impl FnOnce() -> T) -> T {
        let Some(waits) = &self.waits else {
            return f();
        };
        let t = Instant::now();
        let r = f();
        let mut w = waits.lock().unwrap_or_else(PoisonError::into_inner);
        let e = w.entry(label).or_default();
        e.0 += 1;
        e.1 += t.elapsed();
        r
    }

    /// Host waits so far per label: (label, count, total ms); then forgotten.
    pub fn host_waits(&self) -> Vec<(&'static str, usize, f64)> {
        let Some(waits) = &self.waits else {
            return Vec::new();
        };
        let mut w = waits.lock().unwrap_or_else(PoisonError::into_inner);
        let out = w
            .iter()
            .map(|(l, (n, d))| (*l, *n, d.as_secs_f64() * 1e3))
            .collect();
        w.clear();
        out
    }

    /// A timing event recorded now on `stream`, if recording.
    pub fn start(
        &self,
        gpu: &Arc<Gpu>,
        stream: &CudaStream,
    ) -> Result<Option<CudaEvent>, GpuError> {
        if self.spans.is_none() {
            return Ok(None);
        }
        let e = gpu
            .ctx
            .new_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT))?;
        e.record(stream)?;
        Ok(Some(e))
    }

    /// A timing event recorded on `stream` once its work so far and `after`'s have finished,
    /// if recording: `stream` is made to wait for `after` first (it would wait for some of
    /// that work anyway, at its next dependent call), so the span times `stream`'s own work
    /// only, not that wait.
    pub fn start_after(
        &self,
        gpu: &Arc<Gpu>,
        stream: &CudaStream,
        after: &CudaStream,
    ) -> Result<Option<CudaEvent>, GpuError> {
        if self.spans.is_none() {
            return Ok(None);
        }
        stream.join(after)?;
        self.start(gpu, stream)
    }

    /// A timing event recorded on `stream` once it has waited, as a write of `buf` on it would,
    /// for the work on other streams that last read or wrote `buf` (cudarc's per-buffer
    /// events), if recording: the span then times the stream's own work, not that wait, and no
    /// wait is added that the write would not make anyway.
    pub fn start_writing<T>(
        &self,
        gpu: &Arc<Gpu>,
        stream: &CudaStream,
        buf: &mut impl DevicePtrMut<T>,
    ) -> Result<Option<CudaEvent>, GpuError> {
        if self.spans.is_none() {
            return Ok(None);
        }
        // Taking the pointer for writing queues the waits; the guard records a write event
        // when dropped, which the real write records again after it.
        drop(buf.device_ptr_mut(stream));
        self.start(gpu, stream)
    }

    /// Close the span `start` opened, under `label`.
    pub fn end(
        &self,
        gpu: &Arc<Gpu>,
        stream: &CudaStream,
        label: &'static str,
        start: Option<CudaEvent>,
    ) -> Result<(), GpuError> {
        if let (Some(s), Some(e), Some(spans)) = (start, self.start(gpu, stream)?, &self.spans) {
            spans
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push((label, s, e));
        }
        Ok(())
    }

    /// Per label, in label order, after every span has completed (waits for them); the
    /// recorded spans are then forgotten.
    pub fn summarise(&self) -> Result<(f64, Vec<LabelSummary>), GpuError> {
        let Some(spans) = &self.spans else {
            return Ok((0.0, Vec::new()));
        };
        let mut spans = spans.lock().unwrap_or_else(PoisonError::into_inner);
        let Some((_, first, _)) = spans.first() else {
            return Ok((0.0, Vec::new()));
        };
        let mut by_label: BTreeMap<&'static str, Vec<(f64, f64)>> = BTreeMap::new();
        let mut window = 0f64;
        for (label, s, e) in spans.iter() {
            e.synchronize()?;
            let t0 = f64::from(first.elapsed_ms(s)?);
            let t1 = f64::from(first.elapsed_ms(e)?);
            window = window.max(t1);
            by_label.entry(label).or_default().push((t0, t1));
        }
        let out = by_label
            .into_iter()
            .map(|(label, mut v)| {
                v.sort_by(|a, b| a.0.total_cmp(&b.0));
                let durations: Vec<f64> = v.iter().map(|(a, b)| b - a).collect();
                let gaps: Vec<f64> = v.windows(2).map(|w| (w[1].0 - w[0].1).max(0.0)).collect();
                let busy: f64 = durations.iter().sum();
                LabelSummary {
                    label,
                    count: v.len(),
                    busy_ms: busy,
                    mean_ms: busy / v.len() as f64,
                    max_ms: durations.iter().copied().fold(0.0, f64::max),
                    idle_ms: gaps.iter().sum(),
                    max_gap_ms: gaps.iter().copied().fold(0.0, f64::max),
                }
            })
            .collect();
        spans.clear();
        Ok((window, out))
    }
}
