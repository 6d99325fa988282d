//! Missing-data propagation in the F-engine (seed 000 §Missing data handling; facts §1.10):
//! input heap presence → per-spectrum validity (a spectrum is valid only if every input heap
//! its window touches arrived) → per-output-heap validity (an output heap is sent only if all
//! its spectra are valid). Prefix sums make each spectrum O(1), as on the GPU.
#![deny(unsafe_code)]

/// Prefix sums of missing input heaps: whether a sample window touches a missing heap is then
/// O(1) (the GPU's `present_cumsum`).
#[derive(Debug, Clone, Default)]
pub struct MissingPrefix {
    heap_samples: usize,
    /// `missing[h]` = number of missing heaps before heap h.
    missing: Vec<u32>,
}

impl MissingPrefix {
    /// Rebuild for `present` (one flag per input heap of `heap_samples` samples), reusing memory.
    pub fn reset(&mut self, present: impl IntoIterator<Item = bool>, heap_samples: usize) {
        self.heap_samples = heap_samples;
        self.missing.clear();
        self.missing.push(0);
        for p in present {
            let last = self.missing[self.missing.len() - 1];
            self.missing.push(last + u32::from(!p));
        }
    }

    /// Every heap under samples [start, start + len) is present (and inside the covered range).
    pub fn window_ok(&self, start: usize, len: usize) -> bool {
        let first = start / self.heap_samples;
        let last = (start + len - 1) / self.heap_samples;
        last + 1 < self.missing.len() && self.missing[last + 1] == self.missing[first]
    }
}

/// Validity of each spectrum. `heap_present[h]` covers input samples `[h·heap_samples,
/// (h+1)·heap_samples)`; spectrum `s` reads `[starts[s], starts[s] + window)`. Windows
/// reaching past the last heap are invalid.
pub fn spectra_valid(
    heap_present: &[bool],
    heap_samples: usize,
    starts: &[usize],
    window: usize,
) -> Vec<bool> {
    let mut prefix = MissingPrefix::default();
    prefix.reset(heap_present.iter().copied(), heap_samples);
    starts
        .iter()
        .map(|&o| prefix.window_ok(o, window))
        .collect()
}

/// Validity of each output heap of `spectra_per_heap` consecutive spectra.
pub fn heaps_valid(spectra: &[bool], spectra_per_heap: usize) -> Vec<bool> {
    spectra
        .chunks(spectra_per_heap)
        .map(|c| c.len() == spectra_per_heap && c.iter().all(|&v| v))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Against the definition, sample by sample.
        #[test]
        fn matches_brute_force(present in prop::collection::vec(prop::bool::weighted(0.9), 1..40), hs in 1usize..50, window in 1usize..200, spacing in 1usize..60) {
            let total = present.len() * hs;
            let starts: Vec<usize> = (0..total).step_by(spacing).collect();
            let got = spectra_valid(&present, hs, &starts, window);
            for (&o, &v) in starts.iter().zip(&got) {
                let want = o + window <= total && (o..o + window).all(|t| present[t / hs]);
                prop_assert_eq!(v, want, "start {}", o);
            }
            let heaps = heaps_valid(&got, 3);
            for (h, &v) in heaps.iter().enumerate() {
                let group = &got[h * 3..(h * 3 + 3).min(got.len())];
                prop_assert_eq!(v, group.len() == 3 && group.iter().all(|&x| x));
            }
        }
    }
}
