//! CPU backend speed of each `src/dsp` operation, per core (criterion). Throughput is in the
//! operation's natural input unit (digitiser samples, complex samples, visibilities), stated
//! per benchmark. Run: `cargo bench --bench dsp`; figures go to bench/RESULTS.md.
//!
//! The correlators and beamformers are also timed in process CPU time (group `xbengine_cpu`), because the
//! development machine is shared: wall time there counts the other engineers' processes, CPU
//! time counts only the cycles this process ran, which is what "per core" means.

use cbf::dsp::beamform::{beamform, Beam, BeamShape};
use cbf::dsp::beamform_fast::Beamformer;
use cbf::dsp::correlate::{correlate_accumulate, reduce, CorrShape};
use cbf::dsp::correlate_fast::{self, Correlator};
use cbf::dsp::ddc::{ddc, ddc_weights_discard, mixer_step};
use cbf::dsp::ddc_fast::FastDdc;
use cbf::dsp::frb::{intensities, DishGrid, FrbShape};
use cbf::dsp::frb_fast::{self, FrbBeamformer, FrbChunkShape};
use cbf::dsp::frb_resample::{resample, FrbBeams, Resample};
use cbf::dsp::pfb::{pfb_fir, pfb_weights, ChannelFft, Window};
use cbf::dsp::postproc::{postproc_heap, HeapInput, OutputBits, SpectrumDelay};
use cbf::dsp::samples::{pack, packed_len, unpack};
use criterion::measurement::{Measurement, ValueFormatter};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use num_complex::{Complex32, Complex64};

fn samples(n: usize) -> Vec<i32> {
    (0..n).map(|i| ((i * 7919) % 1023) as i32 - 511).collect()
}

fn fengine(c: &mut Criterion) {
    let mut g = c.benchmark_group("fengine");
    let n = 1 << 20;
    let x = samples(n);
    let mut packed = vec![0u8; packed_len(n, 10)];
    pack(&x, 10, &mut packed);
    g.throughput(Throughput::Elements(n as u64));
    g.bench_function("unpack_10bit", |b| {
        let mut out = vec![0i32; n];
        b.iter(|| unpack(&packed, 10, &mut out))
    });
    for channels in [4096usize, 32768] {
        let step = 2 * channels;
        let taps = 16;
        let w = pfb_weights(step, taps, 1.0, Window::Hann);
        let spectra = 16;
        let x = samples(step * (taps + spectra));
        let starts: Vec<usize> = (0..spectra).map(|s| s * step).collect();
        let mut frames = vec![0.0f32; spectra * step];
        g.throughput(Throughput::Elements((spectra * step) as u64));
        g.bench_function(format!("pfb_fir_16taps_{channels}ch"), |b| {
            b.iter(|| pfb_fir(&x, &w, step, &starts, &mut frames))
        });
        let mut fft = ChannelFft::new(step);
        let mut out = vec![Complex32::default(); spectra * channels];
        g.bench_function(format!("fft_{channels}ch"), |b| {
            b.iter(|| fft.run(&frames, &mut out))
        });
        let spectra_per_heap = 256 * 4096 / channels.max(4096);
        let spec: Vec<Complex32> = (0..spectra_per_heap * channels)
            .map(|i| Complex32::new((i % 97) as f32, -((i % 89) as f32)))
            .collect();
        let gains = vec![Complex32::new(0.5, 0.1); channels];
        let delays = vec![
            SpectrumDelay {
                coarse: 3,
                fine: 0.2,
                phase: 0.4
            };
            spectra_per_heap
        ];
        let ts: Vec<i64> = (0..spectra_per_heap as i64)
            .map(|s| s * step as i64)
            .collect();
        let input = HeapInput {
            spectra: [&spec, &spec],
            gains: [&gains, &gains],
            delays: [&delays, &delays],
            timestamps: &ts,
            dither: Some(1),
        };
        let mut heap = vec![0i8; channels * spectra_per_heap * 4];
        // Two digitiser samples per output complex value and polarisation.
        g.throughput(Throughput::Elements(
            (2 * channels * spectra_per_heap * 2) as u64,
        ));
        g.bench_function(format!("postproc_dither_{channels}ch"), |b| {
            b.iter(|| postproc_heap(&input, channels, OutputBits::Eight, &mut heap))
        });
    }
    g.finish();
}

/// The CPU narrowband path (issue 16): the DDC oracle and the fast DDC on their own (input
/// samples/s), then one MeerKAT-like output's backend per chunk of 2²⁵ samples per
/// polarisation (10-bit, 32768 channels, decimation 8 and 16, katgpucbf's 16·S DDC taps and 16
/// PFB taps): `load` alone (unpack and DDC of both polarisations, the tail's outputs carried
/// from the chunk before) and the whole chunk through the pipeline (load, front ends, back
/// ends), one chunk after another as the engine feeds them. Throughput: the chunk's digitiser
/// samples per polarisation, so a figure is the ADC rate per polarisation one core keeps up
/// with (MeerKAT L-band: 1712 MS/s).
fn narrowband<M: Measurement>(c: &mut Criterion<M>, group: &str) {
    use cbf::fengine::backend::{Backend, ChunkInput};
    use cbf::fengine::narrowband::{NarrowbandBackend, NarrowbandSizes};
    use cbf::fengine::narrowband_output::NarrowbandOutput;
    use cbf::fengine::output::OutputSpec;
    use cbf::fengine::pipeline::{ChunkView, Pipeline, PipelineConfig};
    use cbf::fengine::place::InputLayout;
    let mut g = c.benchmark_group(group);
    g.sample_size(10);
    let s = 8;
    let h = ddc_weights_discard(16 * s, s, 0.005).unwrap();
    let n_out = 8192;
    let x = samples(s * (n_out - 1) + h.len());
    let mut y = vec![Complex32::default(); n_out];
    g.throughput(Throughput::Elements((s * n_out) as u64));
    g.bench_function("ddc_subsampling8_128taps", |b| {
        b.iter(|| ddc(&x, &h, s, mixer_step(0.3), 0, &mut y))
    });
    // The fast DDC on the same filter (symmetric: the folded form), and on the filter with
    // its last tap nudged (the plain form).
    let mut nudged = h.clone();
    nudged[h.len() - 1] *= 1.001;
    for (name, taps) in [("symmetric", &h), ("plain", &nudged)] {
        let mut d = FastDdc::new(taps, s, mixer_step(0.3));
        g.bench_function(format!("ddc_fast_{name}_subsampling8_128taps"), |b| {
            b.iter(|| d.run(&x, 0, &mut y))
        });
    }
    let (adc_rate, bits, chunk_samples) = (1712e6, 10u32, 1usize << 25);
    let layout = InputLayout {
        heap_samples: 4096,
        heap_bytes: 5120,
        chunk_samples: chunk_samples as u64,
        mask_timestamp: false,
    };
    let data: Vec<u8> = (0..2 * packed_len(chunk_samples, bits))
        .map(|i| (i.wrapping_mul(2654435761) >> 7) as u8)
        .collect();
    let present = vec![1u8; 2 * layout.heaps_per_pol()];
    // Seconds per iteration with the oracle: one iteration per sample.
    g.sampling_mode(criterion::SamplingMode::Flat);
    g.throughput(Throughput::Elements(chunk_samples as u64));
    for decimation in [8usize, 16] {
        let o = NarrowbandOutput::parse(&format!(
            "name=nb,channels=32768,centre_frequency=3.1e8,decimation={decimation},\
             dst=127.0.0.1:9"
        ))
        .unwrap();
        let spec = OutputSpec::Narrowband(o.clone());
        let cfg = PipelineConfig {
            layout,
            sample_bits: bits,
            spectra_per_heap: spec.spectra_per_heap(1 << 20).unwrap(),
            max_delay_diff: 0,
            gain: Complex32::new(0.02, 0.0),
            dither_seed: 1,
            out_bits: OutputBits::Eight,
        };
        let sizes = NarrowbandSizes {
            adc_sample_rate: adc_rate,
            sample_bits: bits,
            body: chunk_samples,
            tail: cfg.tail(spec.shape()),
            spectra_per_heap: cfg.spectra_per_heap,
            out_bits: cfg.out_bits,
        };
        let mut backend = NarrowbandBackend::new(&o, sizes).unwrap();
        let mut id = 0u64;
        g.bench_function(format!("load_dec{decimation}_32768ch"), |b| {
            b.iter(|| {
                id += 1;
                backend.load(ChunkInput {
                    id,
                    data: &data,
                    next: Some(&data),
                })
            })
        });
        let backend = Box::new(NarrowbandBackend::new(&o, sizes).unwrap());
        let mut pipeline = Pipeline::with_backend(spec, cfg, backend);
        let view = |chunk_id| ChunkView {
            chunk_id,
            data: &data,
            present: &present,
        };
        let mut id = 0u64;
        g.bench_function(format!("chunk_dec{decimation}_32768ch"), |b| {
            b.iter(|| {
                id += 1;
                pipeline
                    .process(view(id), Some(view(id + 1)), |h| assert!(h.valid))
                    .unwrap()
            })
        });
    }
    g.finish();
}

/// The correlator oracle and the fast correlator on one batch of 4 channels × 256 spectra;
/// the fast one on 1 thread (per core, the figure compared with the oracle) and on 2. Run once
/// in wall time and once in process CPU time.
fn correlation<M: Measurement>(c: &mut Criterion<M>, group: &str) {
    let mut g = c.benchmark_group(group);
    for n_ants in [16usize, 64, 256] {
        let shape = CorrShape {
            n_ants,
            channels: 4,
            spectra: 256,
        };
        let x: Vec<i8> = (0..shape.input_len())
            .map(|i| ((i * 31) % 255) as i8)
            .collect();
        let mut acc = vec![0i64; shape.vis_len()];
        // Complex input samples (antenna × channel × spectrum × pol).
        g.throughput(Throughput::Elements(
            (shape.n_ants * shape.channels * shape.spectra * 2) as u64,
        ));
        if n_ants == 256 {
            g.sample_size(10);
        }
        g.bench_function(format!("correlate_{n_ants}ants"), |b| {
            b.iter(|| correlate_accumulate(shape, &x, &mut acc))
        });
        for threads in [1, 2] {
            let mut corr = Correlator::new(shape, threads);
            g.bench_function(
                format!("correlate_fast_{n_ants}ants_{threads}thread"),
                |b| b.iter(|| corr.accumulate(&x, &mut acc)),
            );
        }
    }
    // The dump's reduce at 64 antennas × 256 channels (34 MB of i64), one antenna absent.
    let shape = CorrShape {
        n_ants: 64,
        channels: 256,
        spectra: 1,
    };
    let acc: Vec<i64> = (0..shape.vis_len() as i64)
        .map(|i| (i * 0x9e37_79b9) % (1 << 33))
        .collect();
    let mut present = vec![true; 64];
    present[5] = false;
    let mut out = vec![0i32; shape.vis_len()];
    // Visibility values (i64 in, i32 out).
    g.throughput(Throughput::Elements(shape.vis_len() as u64));
    g.bench_function("reduce_64ants_256ch", |b| {
        b.iter(|| reduce(shape, &acc, &present, &mut out))
    });
    g.bench_function("reduce_fast_64ants_256ch", |b| {
        b.iter(|| correlate_fast::reduce(shape, &acc, &present, &mut out))
    });
    g.finish();
}

fn xb_wall(c: &mut Criterion) {
    narrowband(c, "narrowband");
    correlation(c, "xbengine");
    beamforming(c, "xbengine");
}

fn xb_cpu(c: &mut Criterion<CpuTime>) {
    narrowband(c, "narrowband_cpu");
    correlation(c, "xbengine_cpu");
    beamforming(c, "xbengine_cpu");
    frb_case5(c);
    frb_encode(c);
}

/// The FRB heap's float16 encoding (`dsp::frb_fast::encode_f16`, one thread), which both
/// backends run on the engine thread for every beam value: 1 M values of magnitudes around
/// the scale, a few saturating. Seed 004 case 5's 96×96 grid has 75.5 M per 35 ms chunk.
fn frb_encode(c: &mut Criterion<CpuTime>) {
    let mut g = c.benchmark_group("frb_cpu");
    let j: Vec<f32> = (0..1 << 20)
        .map(|i| ((i as u32).wrapping_mul(2654435761) >> 8) as f32 * 1e-2)
        .collect();
    let mut out = vec![0u8; 2 * j.len()];
    g.throughput(Throughput::Elements(j.len() as u64));
    g.bench_function("encode_f16_1M", |b| {
        b.iter(|| frb_fast::encode_f16(&j, 0.5, &mut out))
    });
    g.finish();
}

/// The CPU FRB beamformer (`dsp::frb_fast`, one thread) at seed 004 Table 3's case 5 (full
/// CHORD: 512 dishes on the 24×24 grid, T_ds 40, t_s = 27.3 µs upchannelised), scaled down to
/// one channel (of the case's 256 per GPU) and one chunk of 80 fast spectra (two slow times):
/// stage 1 alone (`FrbBeamformer::intensities`: gridding, 2-D FFTs, |Ẽ|² sums) and stage 2
/// alone (`frb_resample::resample` on 16 slow times of intensities) for Table 4's beam sets,
/// the 96×96 grid (factorisable, §5.3) and 10·MN = 5,760 listed beams (§5.2). In process CPU
/// time; % of real time per core = time ÷ the data's span (stage 1: 80 × 27.3 µs = 2.18 ms;
/// stage 2: 16 × T_ds × t_s = 17.5 ms), per channel.
fn frb_case5(c: &mut Criterion<CpuTime>) {
    let mut g = c.benchmark_group("frb_cpu");
    g.sample_size(10);
    let (m, n, dishes) = (24usize, 24usize, 512usize);
    // The first 512 cells of the 24×24 grid, row by row (64 cells empty).
    let positions: Vec<(usize, usize)> = (0..dishes).map(|c| (c / n, c % n)).collect();
    let grid = DishGrid::new(m, n, &positions).unwrap();
    let shape = FrbChunkShape {
        n_ants: dishes,
        channels: 1,
        spectra: 80,
        batches: 1,
        t_ds: 40,
    };
    let x: Vec<i8> = (0..shape.input_len())
        .map(|i| ((i.wrapping_mul(2654435761) >> 9) % 255) as i8 - 127)
        .collect();
    let present = vec![1u8; dishes];
    let weights: Vec<Complex32> = (0..dishes * 2)
        .map(|i| Complex32::from_polar(1.0, i as f32 * 0.1))
        .collect();
    // Complex dish samples (dish × channel × spectrum × pol).
    g.throughput(Throughput::Elements((shape.input_len() / 2) as u64));
    let mut former = FrbBeamformer::new(shape, &grid, &FrbBeams::even(m, n, 96, 96), 1);
    let mut i = vec![0f32; former.intensities_len()];
    g.bench_function("stage1_case5_512dishes_24x24_80spectra", |b| {
        b.iter(|| former.intensities(&x, &present, &weights, &mut i))
    });
    let slow = 16;
    let intensity: Vec<f32> = (0..slow * 4 * m * n)
        .map(|k| (k % 1013) as f32 * 0.37)
        .collect();
    let list = FrbBeams::List(
        (0..10 * m * n)
            .map(|k| {
                (
                    k as f64 * 0.0131 % 24.0 - 12.0,
                    k as f64 * 0.0077 % 24.0 - 12.0,
                )
            })
            .collect(),
    );
    g.throughput(Throughput::Elements(slow as u64));
    for (name, beams) in [
        (
            "stage2_case5_96x96grid_16slow",
            FrbBeams::even(m, n, 96, 96),
        ),
        ("stage2_case5_5760listbeams_16slow", list),
    ] {
        let table = Resample::new(m, n, &beams);
        let mut v = vec![0f32; 96 * 2 * n];
        let mut out = vec![0f32; slow * beams.len()];
        g.bench_function(name, |b| {
            b.iter(|| resample(&table, n, &intensity, &mut v, &mut out))
        });
    }
    g.finish();
}

/// Process CPU time (all threads), in nanoseconds, as a criterion measurement.
struct CpuTime;

impl CpuTime {
    fn now() -> u64 {
        let mut t = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `t` is a valid, writable timespec; CLOCK_PROCESS_CPUTIME_ID exists on Linux.
        let rc = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut t) };
        assert_eq!(rc, 0, "clock_gettime(CLOCK_PROCESS_CPUTIME_ID)");
        t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
    }
}

impl Measurement for CpuTime {
    type Intermediate = u64;
    type Value = u64;
    fn start(&self) -> u64 {
        Self::now()
    }
    fn end(&self, start: u64) -> u64 {
        Self::now() - start
    }
    fn add(&self, a: &u64, b: &u64) -> u64 {
        a + b
    }
    fn zero(&self) -> u64 {
        0
    }
    fn to_f64(&self, v: &u64) -> f64 {
        *v as f64
    }
    fn formatter(&self) -> &dyn ValueFormatter {
        &CpuTimeFormatter
    }
}

/// Formats CPU nanoseconds as µs / ms of CPU time and element throughput per CPU second.
struct CpuTimeFormatter;

impl ValueFormatter for CpuTimeFormatter {
    fn scale_values(&self, typical: f64, values: &mut [f64]) -> &'static str {
        let (div, unit) = if typical < 1e6 {
            (1e3, "µs(cpu)")
        } else {
            (1e6, "ms(cpu)")
        };
        values.iter_mut().for_each(|v| *v /= div);
        unit
    }
    fn scale_throughputs(&self, _: f64, t: &Throughput, values: &mut [f64]) -> &'static str {
        let n = match *t {
            Throughput::Elements(n) | Throughput::Bytes(n) | Throughput::BytesDecimal(n) => n,
        };
        values.iter_mut().for_each(|v| *v = n as f64 * 1e3 / *v);
        "Melem/s(cpu)"
    }
    fn scale_for_machines(&self, _: &mut [f64]) -> &'static str {
        "ns(cpu)"
    }
}

/// The beamformer oracle and the fast beamformer (1 and 2 threads): 8 beams (4 per pol) of
/// 64 antennas, dither on, on one batch of 4 channels × 256 spectra.
fn beamforming<M: Measurement>(c: &mut Criterion<M>, group: &str) {
    let mut g = c.benchmark_group(group);
    let shape = BeamShape {
        n_ants: 64,
        channels: 4,
        spectra: 256,
    };
    let x: Vec<i8> = (0..64 * 4 * 256 * 4)
        .map(|i| ((i * 31) % 255) as i8)
        .collect();
    // Complex input samples (antenna × channel × spectrum × pol).
    g.throughput(Throughput::Elements((64 * 4 * 256 * 2) as u64));
    let beams: Vec<Beam> = (0..8)
        .map(|i| Beam {
            pol: i % 2,
            weights: vec![Complex64::new(0.01, 0.0); 64],
            delays: vec![0.001 * i as f64; 64],
        })
        .collect();
    let ts: Vec<i64> = (0..256).collect();
    let mut out = vec![0i8; 8 * 4 * 256 * 2];
    g.bench_function("beamform_64ants_8beams", |b| {
        b.iter(|| beamform(shape, &x, &[true; 64], &beams, &ts, Some(3), &mut out))
    });
    for threads in [1, 2] {
        let mut bf = Beamformer::new(shape, threads);
        g.bench_function(
            format!("beamform_fast_64ants_8beams_{threads}thread"),
            |b| b.iter(|| bf.form(&x, &[true; 64], &beams, &ts, Some(3), &mut out)),
        );
    }
    g.finish();
}

fn xb(c: &mut Criterion) {
    let mut g = c.benchmark_group("xbengine");
    let (m, n) = (8, 8);
    let positions: Vec<(usize, usize)> = (0..m * n).map(|c| (c / n, c % n)).collect();
    let grid = DishGrid::new(m, n, &positions).unwrap();
    let fshape = FrbShape { times: 64, t_ds: 8 };
    let e: Vec<Complex64> = (0..fshape.times * 2 * 64)
        .map(|i| Complex64::new((i % 7) as f64, (i % 5) as f64))
        .collect();
    let w = vec![Complex64::new(1.0, 0.0); 2 * m * n];
    // Complex dish samples (time × pol × dish).
    g.throughput(Throughput::Elements((fshape.times * 2 * 64) as u64));
    g.bench_function("frb_intensities_64dishes_8x8", |b| {
        b.iter(|| intensities(&grid, fshape, &e, &w))
    });
    // The engine's CPU FRB beamformer on one thread: a chunk of 16 channels × 256 spectra of
    // the same 8×8 grid, T_ds 16, into 32×32 beams (seed 004 case 1's factorisable beams) and
    // into 256 arbitrary beams. Throughput: complex dish samples (dish × channel × spectrum ×
    // pol).
    let shape = FrbChunkShape {
        n_ants: 64,
        channels: 16,
        spectra: 256,
        batches: 1,
        t_ds: 16,
    };
    let x: Vec<i8> = (0..shape.input_len())
        .map(|i| (i % 23) as i8 - 11)
        .collect();
    let present = vec![1u8; 64];
    let weights = vec![Complex32::new(1.0, 0.0); 16 * 64 * 2];
    g.throughput(Throughput::Elements((shape.input_len() / 2) as u64));
    let list = FrbBeams::List(
        (0..256)
            .map(|i| (i as f64 * 0.031, i as f64 * -0.017))
            .collect(),
    );
    for (name, beams) in [
        ("frb_fast_64dishes_32x32beams", FrbBeams::even(m, n, 32, 32)),
        ("frb_fast_64dishes_256listbeams", list),
    ] {
        let mut former = FrbBeamformer::new(shape, &grid, &beams, 1);
        let mut out = vec![0f32; former.output_len()];
        g.bench_function(name, |b| {
            b.iter(|| former.form(&x, &present, &weights, &mut out))
        });
    }
    g.finish();
}

/// The F-engine's whole per-output processing of one input chunk (both polarisations:
/// unpack, PFB, FFT, post-processing), as `cbf fengine` runs it on one core.
fn fengine_pipeline(c: &mut Criterion) {
    use cbf::fengine::output::WidebandOutput;
    use cbf::fengine::pipeline::{Pipeline, PipelineConfig};
    use cbf::fengine::place::InputLayout;
    use cbf::spead::recv::Chunk;
    let mut g = c.benchmark_group("fengine_pipeline");
    g.sample_size(10);
    let chunk_samples = 1usize << 22;
    let layout = InputLayout {
        heap_samples: 4096,
        heap_bytes: 5120,
        chunk_samples: chunk_samples as u64,
        mask_timestamp: false,
    };
    let per_pol = layout.heaps_per_pol();
    // Two consecutive chunks of pseudo-random 10-bit data, every heap present.
    let chunks: Vec<Chunk> = (0..2u64)
        .map(|id| Chunk {
            chunk_id: id,
            data: (0..2 * layout.pol_bytes())
                .map(|i| (i.wrapping_mul(2654435761) >> 7) as u8)
                .collect::<Box<[u8]>>()
                .into(),
            present: vec![1u8; 2 * per_pol].into_boxed_slice(),
            extra: vec![0u64; 2 * per_pol].into_boxed_slice(),
        })
        .collect();
    for channels in [4096usize, 32768] {
        let out =
            WidebandOutput::parse(&format!("name=b,channels={channels},dst=127.0.0.1:9")).unwrap();
        let sph = (1 << 20) / channels;
        g.throughput(Throughput::Elements(2 * chunk_samples as u64));
        g.bench_function(format!("process_chunk_{channels}ch_16taps"), |b| {
            b.iter_batched(
                || {
                    let cfg = PipelineConfig {
                        layout,
                        sample_bits: 10,
                        spectra_per_heap: sph,
                        max_delay_diff: 0,
                        gain: Complex32::new(0.01, 0.0),
                        dither_seed: 1,
                        out_bits: OutputBits::Eight,
                    };
                    Pipeline::new(out.clone(), cfg)
                },
                |mut p| {
                    p.process((&chunks[0]).into(), Some((&chunks[1]).into()), |h| {
                        assert!(h.valid)
                    })
                    .unwrap()
                },
                criterion::BatchSize::LargeInput,
            )
        });
    }
    g.finish();
}

criterion_group!(benches, fengine, xb_wall, xb, fengine_pipeline);
criterion_group! {
    name = cpu_time;
    config = Criterion::default().with_measurement(CpuTime);
    targets = xb_cpu
}
criterion_main!(benches, cpu_time);
