//! Fuzz the `key=value,...` output specs, `--wideband` and `--narrowband` (F-engine),
//! `--corrprod` and `--beam` (XB-engine): no panic; an accepted spec satisfies the documented
//! bounds, and the derived spectra-per-heap and shapes never divide by zero or overflow.
//! Seeds: fuzz/seeds/output_spec.
#![no_main]

use cbf::fengine::narrowband_output::{NarrowbandOutput, MAX_DDC_TAPS, MAX_DECIMATION};
use cbf::fengine::output::{OutputSpec, WidebandOutput, MAX_CHANNELS, MAX_TAPS};
use cbf::xbengine::output::{BeamOutput, CorrprodOutput};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(o) = WidebandOutput::parse(text) {
        assert!(o.channels >= 2 && o.channels <= MAX_CHANNELS && o.channels.is_power_of_two());
        assert!(o.taps >= 1 && o.taps <= MAX_TAPS);
        assert!(!o.dst.is_empty() && o.channels % o.dst.len() == 0);
        let _ = o.spectra_per_heap(1 << 20);
        let _ = o.spectra_per_heap(0);
    }
    if let Ok(n) = NarrowbandOutput::parse(text) {
        assert!(n.decimation >= 1 && n.decimation <= MAX_DECIMATION);
        assert!(n.ddc_taps >= 1 && n.ddc_taps <= MAX_DDC_TAPS);
        assert!(!n.discard() || n.decimation % 2 == 0);
        assert!(n.centre_frequency.is_finite() && n.weight_pass > 0.0);
        let shape = n.shape();
        assert!(shape.window >= shape.spectra_samples && shape.subsampling >= 1);
        let _ = n.check(1712e6);
        let _ = OutputSpec::Narrowband(n).spectra_per_heap(1 << 20);
    }
    if let Ok(c) = CorrprodOutput::parse(text) {
        assert!(c.heap_accumulation_threshold >= 1 && c.dst.port() != 0);
    }
    if let Ok(b) = BeamOutput::parse(text) {
        assert!(b.pol <= 1 && b.dst.port() != 0);
    }
});
