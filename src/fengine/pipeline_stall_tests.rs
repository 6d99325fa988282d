//! A send path that holds every output buffer past the backend's bound: the pipeline drops
//! the heaps it cannot compute instead of stalling, counts each once, and changes nothing else.
//! Checked against the same chunks through a backend whose send path keeps up (the drops must
//! be exactly the heaps that one emits), and by the heaps after recovery, which must be those
//! it emits, bit for bit.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use num_complex::Complex32;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::super::backend::Finished;
use super::*;

/// The CPU backend, but while `stuck` is raised its send path holds every buffer: never
/// ready, and its bounded wait runs out.
struct Stuck {
    inner: CpuBackend,
    stuck: Arc<AtomicBool>,
}

impl Backend for Stuck {
    fn load(&mut self, chunk: ChunkInput<'_>) -> Result<(), BackendError> {
        self.inner.load(chunk)
    }
    fn release(&mut self) -> Result<(), BackendError> {
        self.inner.release()
    }
    fn front_end(&mut self, pol: usize, offset: usize, k: usize) -> Result<(), BackendError> {
        self.inner.front_end(pol, offset, k)
    }
    fn discard(&mut self) -> Result<(), BackendError> {
        self.inner.discard()
    }
    fn back_end(&mut self, input: &BackEndInput<'_>) -> Result<(), BackendError> {
        assert!(
            !self.stuck.load(Ordering::Relaxed),
            "computed into a held buffer"
        );
        self.inner.back_end(input)
    }
    fn ready(&self) -> bool {
        !self.stuck.load(Ordering::Relaxed) && self.inner.ready()
    }
    fn wait_ready(&mut self) -> Result<bool, BackendError> {
        if self.stuck.load(Ordering::Relaxed) {
            Ok(false)
        } else {
            self.inner.wait_ready()
        }
    }
    fn finished(&mut self, wait: bool) -> Result<Option<Finished<'_>>, BackendError> {
        self.inner.finished(wait)
    }
}

pub(super) fn output() -> WidebandOutput {
    WidebandOutput::parse("name=w,channels=64,dst=127.0.0.1:7148,taps=4").unwrap()
}

pub(super) fn config() -> PipelineConfig {
    PipelineConfig {
        layout: InputLayout {
            heap_samples: 1024,
            heap_bytes: 1280,
            chunk_samples: 8192,
            mask_timestamp: false,
        },
        sample_bits: 10,
        spectra_per_heap: 4,
        max_delay_diff: 0,
        gain: Complex32::new(1.0, 0.0),
        dither_seed: 1,
        out_bits: OutputBits::Eight,
    }
}

fn pipeline(stuck: &Arc<AtomicBool>) -> Pipeline {
    let (o, cfg) = (output(), config());
    let inner = CpuBackend::new(
        &o,
        cfg.sample_bits,
        cfg.layout.chunk_samples as usize,
        cfg.tail(o.shape()),
        cfg.spectra_per_heap,
        cfg.out_bits,
    );
    let backend = Box::new(Stuck {
        inner,
        stuck: Arc::clone(stuck),
    });
    Pipeline::with_backend(o.into(), cfg, backend)
}

/// Run chunk `id` of `chunks` (with the next as its tail); the heaps emitted, as (timestamp,
/// bytes), and the heaps skipped.
fn run(p: &mut Pipeline, chunks: &[Vec<u8>], id: usize) -> (Vec<(u64, Vec<u8>)>, u64) {
    let present = vec![1u8; 16];
    let view = |i: usize| ChunkView {
        chunk_id: i as u64,
        data: &chunks[i],
        present: &present,
    };
    let mut out = Vec::new();
    let mut keep = |h: &OutputHeap<'_>| {
        let HeapData::Host(b) = &h.data else {
            panic!("a CPU heap in device memory")
        };
        out.push((h.timestamp, b.to_vec()));
    };
    let next = chunks.get(id + 1).map(|_| view(id + 1));
    let skipped = p.process(view(id), next, &mut keep).unwrap();
    (out, skipped)
}

#[test]
fn a_held_send_path_turns_each_heap_into_one_counted_drop() {
    let mut rng = SmallRng::seed_from_u64(15);
    // Four chunks of 8192 10-bit samples per pol: 2 × 10240 bytes each.
    let chunks: Vec<Vec<u8>> = (0..4)
        .map(|_| (0..20480).map(|_| rng.random()).collect())
        .collect();
    let free = Arc::new(AtomicBool::new(false));
    let mut reference = pipeline(&free);
    let stuck = Arc::new(AtomicBool::new(true));
    let mut held = pipeline(&stuck);
    let mut dropped = 0;
    for id in 0..3 {
        if id == 2 {
            stuck.store(false, Ordering::Relaxed);
        }
        let (want, want_skipped) = run(&mut reference, &chunks, id);
        let (got, skipped) = run(&mut held, &chunks, id);
        assert_eq!(skipped, want_skipped, "chunk {id}: skips are input's alone");
        if id < 2 {
            assert!(got.is_empty(), "chunk {id}: a heap out of a held buffer");
            assert!(!want.is_empty());
            dropped += want.len() as u64;
            assert_eq!(held.stalled_heaps(), dropped, "chunk {id}");
        } else {
            assert_eq!(got, want, "after recovery");
            assert_eq!(held.stalled_heaps(), dropped, "no drop once free");
        }
    }
}
