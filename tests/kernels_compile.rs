//! Every CUDA kernel compiles with NVRTC (13.0, from NVIDIA's pip wheel, which `tools/test`
//! installs and puts on the library path) for each supported architecture, with the `-D`
//! constants the backend uses: every decode path, unzip factor, output width and dither
//! setting. Real `sm_XY` targets run the PTX assembler, so errors that only it finds fail
//! here too. No GPU is needed; a kernel that does not compile cannot land.

use cbf::gpu::beamform::{BeamformConfig, OCCUPANCIES};
use cbf::gpu::compile::{compile, nvrtc_present, Kernel};
use cbf::gpu::ddc::{DdcPlan, DdcShape, DdcTuning};
use cbf::gpu::frb::{FrbConfig, FrbIntensities, FrbTuning, Stage2Table, WgmmaShape};

const ARCHES: [&str; 4] = ["sm_80", "sm_89", "sm_90", "sm_90a"];

#[test]
fn every_kernel_compiles_for_every_architecture() {
    assert!(
        nvrtc_present(),
        "libnvrtc.so.13 not found: run the tests with tools/test (it installs NVRTC 13.0 and sets LD_LIBRARY_PATH)"
    );
    let mut compiled = 0;
    for arch in ARCHES {
        for bits in [2, 3, 4, 8, 10, 12, 16] {
            for (channels, unzip, taps) in [(4096, 4, 16), (4, 2, 4), (2, 1, 16)] {
                let defs = vec![
                    ("CHANNELS", channels),
                    ("TAPS", taps),
                    ("SAMPLE_BITS", bits),
                    ("UNZIP", unzip),
                    ("SPECTRA", 256),
                    ("HEAP_SPECTRA", 32),
                ];
                let cubin = compile(Kernel::Pfb, &defs, arch).unwrap_or_else(|e| panic!("{e}"));
                assert!(cubin.starts_with(b"\x7fELF"), "not a cubin");
                compiled += 1;
            }
        }
        // ptxas's register allocation depends on the whole shape: the self-test's shapes
        // (whole-heap launches of 40 and 48 spectra) once spilled where these others did not.
        for (channels, unzip, spectra) in [
            (32768, 4, 32),
            (4, 2, 32),
            (2, 1, 32),
            (4, 2, 40),
            (64, 2, 48),
        ] {
            for out_bits in [4, 8] {
                for dither in [0, 1] {
                    let defs = vec![
                        ("CHANNELS", channels),
                        ("UNZIP", unzip),
                        ("SPECTRA", spectra),
                        (
                            "HEAP_SPECTRA",
                            if dither == 1 || spectra > 32 {
                                spectra
                            } else {
                                8
                            },
                        ),
                        ("OUT_BITS", out_bits),
                        ("DITHER", dither),
                        ("STILE", if dither == 1 { 32 } else { 8 }),
                        ("SPECTRUM_SAMPLES", 2 * channels),
                    ];
                    compile(Kernel::Postproc, &defs, arch).unwrap_or_else(|e| panic!("{e}"));
                    compiled += 1;
                }
            }
        }
        compile(Kernel::Copy, &[], arch).unwrap_or_else(|e| panic!("{e}"));
        compile(Kernel::F16Encode, &[], arch).unwrap_or_else(|e| panic!("{e}"));
        compiled += 2;
        // The correlator: a single antenna, an odd count, and 1024 antennas; both input widths.
        // Short heaps are merged in groups of batches (32 spectra: 2 per 64-time step). Rows
        // longer than the mma kernel's int32 window (65536 times) loop over windows, which
        // holds more registers (the self-test's long-row case).
        for (ants, channels, spectra, group) in [
            (1, 1, 1, 1),
            (2, 1, 140_032, 1),
            (19, 3, 255, 1),
            (80, 512, 32, 2),
            (1024, 512, 256, 1),
        ] {
            let np = (2 * ants + 63) / 64 * 64;
            let tpad = (group * spectra + 63) / 64 * 64;
            // Rows for the mma kernel, and the wgmma kernel's tiled order (128-time steps,
            // 128-antenna-pol tiles).
            for (tiled, np, tpad) in [
                (0, np, tpad),
                (1, (np + 127) / 128 * 128, (tpad + 127) / 128 * 128),
            ] {
                for in_bits in [8, 4] {
                    let defs = vec![
                        ("N_ANTS", ants),
                        ("CHANNELS", channels),
                        ("SPECTRA", spectra),
                        ("GROUP", group),
                        ("TPAD", tpad),
                        ("NP", np),
                        ("IN_BITS", in_bits),
                        ("TILED", tiled),
                    ];
                    compile(Kernel::CorrTurn, &defs, arch).unwrap_or_else(|e| panic!("{e}"));
                    compiled += 1;
                }
            }
            let defs = vec![
                ("N_ANTS", ants),
                ("CHANNELS", channels),
                ("TPAD", tpad),
                ("NP", np),
                ("WINDOW", 65536),
            ];
            compile(Kernel::CorrMma, &defs, arch).unwrap_or_else(|e| panic!("{e}"));
            let defs = vec![("N_ANTS", ants), ("CHANNELS", channels), ("N_ACC", 32)];
            compile(Kernel::CorrReduce, &defs, arch).unwrap_or_else(|e| panic!("{e}"));
            compiled += 2;
        }
        compile(Kernel::CorrPeak, &[], arch).unwrap_or_else(|e| panic!("{e}"));
        compiled += 1;
        // The beamformer: MeerKAT's 8 beams, one beam, 130 beams (several beam batches, one
        // partial), 4-bit input, short and odd spectra (a partial block).
        for (n_ants, beams, spectra, batches, in_bits) in [
            (80, 8, 256, 4, 8),
            (1, 1, 1, 1, 8),
            (130, 130, 100, 3, 4),
            (1024, 64, 32, 32, 8),
        ] {
            let cfg = BeamformConfig {
                n_ants,
                channels: 512,
                spectra,
                batches,
                beams,
                in_bits,
            };
            // The last occupancy is the fallback every shape must compile at.
            let defs = cfg.defines(OCCUPANCIES[OCCUPANCIES.len() - 1]);
            compile(Kernel::Beamform, &defs, arch).unwrap_or_else(|e| panic!("{e}"));
            compiled += 1;
        }
    }
    // The wgmma correlator exists for sm_90a only: from the corner turn's rows (FUSED 0),
    // staging the chunk itself (FUSED 1, spectra a multiple of 128) and turning it in its own
    // launch (RIDE 1, spectra a multiple of 16), one heap or merged ones (katgpucbf's 32 heaps
    // of 256 spectra), one window of times or several.
    for (ants, channels, spectra, group, fused, ride) in [
        (1, 1, 1, 1, 0, 0),
        (19, 3, 255, 1, 0, 0),
        (1024, 512, 256, 1, 0, 0),
        (1, 1, 128, 1, 1, 0),
        (19, 3, 384, 3, 1, 0),
        (80, 512, 256, 32, 1, 0),
        (128, 512, 256, 1, 1, 0),
        (576, 480, 256, 1, 1, 0),
        (2, 1, 140_032, 1, 1, 0),
        (130, 2, 3072, 2, 0, 1),
        (200, 2, 32, 100, 0, 1),
        (200, 1, 3088, 1, 0, 1),
        (576, 120, 12_288, 1, 0, 1),
        (1024, 64, 256, 32, 0, 1),
    ] {
        // As `gpu::correlate` builds them: the chunk's layout for the kernel's own producers
        // only.
        let mut defs = vec![
            ("N_ANTS", ants),
            ("CHANNELS", channels),
            ("TPAD", (spectra * group + 127) / 128 * 128),
            ("NP", (2 * ants + 127) / 128 * 128),
            ("STAGES", 4),
            ("FUSED", fused),
            ("RIDE", ride),
        ];
        if fused == 1 || ride == 1 {
            defs.extend([("SPECTRA", spectra), ("GROUP", group)]);
        }
        let target = Kernel::CorrWgmma.target("sm_90");
        compile(Kernel::CorrWgmma, &defs, &target).unwrap_or_else(|e| panic!("{e}"));
        compiled += 1;
    }
    // The beamformer at every shape the self-test and the benchmark build, for the lent H100
    // (ptxas decides register allocation per shape: one spilled there and nowhere else).
    for (n_ants, channels, spectra, batches, beams, in_bits) in [
        (3, 5, 37, 2, 8, 8),
        (80, 16, 256, 3, 8, 8),
        (80, 8, 64, 2, 8, 8),
        (19, 7, 33, 3, 64, 8),
        (130, 4, 100, 2, 130, 4),
        (4, 16, 256, 3, 2, 8),
        (19, 33, 40, 5, 3, 4),
        (80, 32, 256, 4, 8, 8),
        (130, 8, 128, 2, 64, 8),
        (80, 512, 32, 32, 8, 8),
        (80, 512, 256, 4, 256, 8),
        (256, 512, 256, 2, 64, 8),
        (1024, 32, 256, 4, 8, 8),
        (300, 4, 36, 2, 8, 8),
        (40, 4, 128, 5, 6, 4),
        (160, 2, 32, 24, 8, 8),
    ] {
        let cfg = BeamformConfig {
            n_ants,
            channels,
            spectra,
            batches,
            beams,
            in_bits,
        };
        let floor = OCCUPANCIES[OCCUPANCIES.len() - 1];
        compile(Kernel::Beamform, &cfg.defines(floor), "sm_90").unwrap_or_else(|e| panic!("{e}"));
        compiled += 1;
        // MeerKAT's 8 beams must fit the first (fastest) occupancy, or the benchmark's figure
        // would silently be the fallback's.
        if n_ants == 80 && beams == 8 && channels == 512 {
            compile(Kernel::Beamform, &cfg.defines(OCCUPANCIES[0]), "sm_90")
                .unwrap_or_else(|e| panic!("{e}"));
            compiled += 1;
        }
    }
    // `cbf-xb-bench --frb`'s chunk (seed 004 case 5: 512 antennas, 256 channels, 5 heaps of 256
    // spectra merged into one row set of 1280 times) on the lent H100: the wgmma correlator's
    // turn, MMA and reduce kernels and the beamformer (8 beams) at its fallback occupancy.
    let (ants, channels) = (512, 256);
    let turn = vec![
        ("N_ANTS", ants),
        ("CHANNELS", channels),
        ("SPECTRA", 256),
        ("GROUP", 5),
        ("TPAD", 1280),
        ("NP", 1024),
        ("IN_BITS", 8),
        ("TILED", 1),
    ];
    compile(Kernel::CorrTurn, &turn, "sm_90").unwrap_or_else(|e| panic!("{e}"));
    let defs = vec![
        ("N_ANTS", ants),
        ("CHANNELS", channels),
        ("TPAD", 1280),
        ("NP", 1024),
        ("STAGES", 4),
        ("FUSED", 0),
    ];
    let target = Kernel::CorrWgmma.target("sm_90");
    compile(Kernel::CorrWgmma, &defs, &target).unwrap_or_else(|e| panic!("{e}"));
    let defs = vec![("N_ANTS", ants), ("CHANNELS", channels), ("N_ACC", 5)];
    compile(Kernel::CorrReduce, &defs, "sm_90").unwrap_or_else(|e| panic!("{e}"));
    let cfg = BeamformConfig {
        n_ants: 512,
        channels: 256,
        spectra: 256,
        batches: 5,
        beams: 8,
        in_bits: 8,
    };
    let floor = OCCUPANCIES[OCCUPANCIES.len() - 1];
    compile(Kernel::Beamform, &cfg.defines(floor), "sm_90").unwrap_or_else(|e| panic!("{e}"));
    compiled += 4;
    // The FRB beamformer's first stage: every architecture at one shape in both output types,
    // and for the lent H100 every shape the self-tests and the benchmarks build (seed 004
    // Table 3's five grids, with the benchmark's block steps; the XB-engine benchmark's case 5
    // chunk), each in the output types they build it with. `FrbStage1::new` takes the first of
    // the config's builds that compiles; here each shape's first build must (no fallback at any
    // shape the engine or the benchmarks run), except the large grids below.
    let config =
        |(rows, cols, dishes, t_ds), (channels, spectra, batches), tuning, output| FrbConfig {
            rows,
            cols,
            dishes,
            t_ds,
            channels,
            spectra,
            batches,
            tuning,
            output,
        };
    let frb = |grid, call, tuning: Option<(usize, usize)>, output| {
        let tuning = tuning.map_or(FrbTuning::default(), |(tb, r)| FrbTuning {
            time_block: Some(tb),
            groups: Some(r),
            ..FrbTuning::default()
        });
        let builds = config(grid, call, tuning, output)
            .builds()
            .unwrap_or_else(|e| panic!("{e}"));
        builds[0].1.clone()
    };
    let both = [FrbIntensities::Float32, FrbIntensities::Float16];
    for arch in ARCHES {
        for output in both {
            compile(
                Kernel::FrbStage1,
                &frb((24, 24, 512, 40), (256, 2064, 1), None, output),
                arch,
            )
            .unwrap_or_else(|e| panic!("{e}"));
            compiled += 1;
        }
        // The beam list's W built on the device, both element types (seed 004 case 5's grid).
        for half in [0, 1] {
            let defs = vec![("ROWS", 24), ("COLS", 24), ("HALF", half)];
            compile(Kernel::FrbWeights, &defs, arch).unwrap_or_else(|e| panic!("{e}"));
            compiled += 1;
        }
    }
    // The W builder at every grid the self-test, the tests and the benchmark use, for the lent
    // H100: odd and unequal sides, one cell, and the largest grid.
    for (rows, cols) in [
        (1, 1),
        (3, 4),
        (3, 5),
        (5, 3),
        (7, 2),
        (7, 4),
        (13, 11),
        (8, 12),
        (16, 20),
        (64, 64),
    ] {
        for half in [0, 1] {
            let defs = vec![("ROWS", rows), ("COLS", cols), ("HALF", half)];
            compile(Kernel::FrbWeights, &defs, "sm_90").unwrap_or_else(|e| panic!("{e}"));
            compiled += 1;
        }
    }
    let mut shapes = Vec::new();
    // `selftest::frb`'s cases and `selftest::xbengine_frb`'s grid; the five cases of
    // `cbf-frb-bench`: both outputs.
    for (grid, call) in [
        ((5, 3, 15, 1), (2, 7, 1)),
        ((8, 12, 64, 3), (3, 16, 2)),
        ((16, 20, 256, 7), (2, 24, 2)),
        ((24, 24, 512, 40), (2, 64, 2)),
        ((24, 24, 400, 40), (1, 100, 1)),
        ((12, 16, 150, 3), (2, 24, 2)),
        ((4, 8, 20, 7), (1, 16, 1)),
        ((16, 16, 256, 1), (1, 16, 1)),
        ((3, 4, 10, 16), (8, 64, 2)),
        ((8, 8, 64, 40), (2048, 2064, 1)),
        ((8, 12, 64, 40), (2048, 2064, 1)),
        ((16, 16, 256, 25), (1024, 2050, 1)),
        ((16, 20, 256, 25), (1024, 2050, 1)),
        ((24, 24, 512, 40), (256, 2064, 1)),
    ] {
        for output in both {
            shapes.push(frb(grid, call, None, output));
        }
    }
    // `selftest::frb`'s grouped cases (both outputs).
    for (grid, call, groups) in [
        ((24, 24, 512, 40), (2, 64, 2), 2),
        ((16, 16, 200, 7), (2, 24, 2), 2),
        ((8, 12, 64, 3), (3, 16, 2), 4),
    ] {
        let tb = (4..=64).find(|tb| (2 * tb) % groups == 0).unwrap_or(4);
        for output in both {
            shapes.push(frb(grid, call, Some((tb, groups)), output));
        }
    }
    // `cbf-frb-bench`'s block steps at case 5 and `cbf-xb-bench --frb`'s chunk: fp16 output.
    for tuning in [(4, 2), (8, 2), (4, 4)] {
        shapes.push(frb(
            (24, 24, 512, 40),
            (256, 2064, 1),
            Some(tuning),
            FrbIntensities::Float16,
        ));
    }
    shapes.push(frb(
        (24, 24, 512, 40),
        (256, 256, 5),
        None,
        FrbIntensities::Float16,
    ));
    // The self-test's builds with stage 2's table in shared memory, both outputs: the first
    // (the blocks per SM asked for).
    for (grid, call, groups) in [
        ((24, 24, 512, 40), (2, 64, 2), None),
        ((16, 16, 200, 7), (2, 24, 2), Some(2)),
        ((8, 12, 64, 3), (3, 16, 2), None),
        ((5, 3, 15, 3), (2, 7, 1), Some(1)),
    ] {
        let tuning = FrbTuning {
            groups,
            table: Some(Stage2Table::Shared),
            ..FrbTuning::default()
        };
        for output in both {
            shapes.push(
                config(grid, call, tuning, output).builds().unwrap()[0]
                    .1
                    .clone(),
            );
        }
    }
    // Large grids, where the table in registers spills: the shared-table build at the blocks
    // per SM asked for (the second build `FrbStage1::new` tries) must compile; at 30×28, which
    // spills there too, the third (one block per SM); at 32×32 (4 | M, half the table) the
    // first. The self-test's large grids too.
    for (grid, call, first) in [
        ((32, 24, 691, 40), (4, 64, 1), 1),
        ((28, 28, 705, 40), (4, 64, 1), 1),
        ((25, 28, 630, 40), (4, 64, 1), 1),
        ((30, 28, 800, 40), (4, 64, 1), 2),
        ((30, 32, 900, 40), (4, 64, 1), 1),
        ((25, 24, 600, 40), (4, 64, 1), 1),
        ((30, 28, 800, 3), (1, 12, 1), 2),
        ((25, 24, 600, 7), (1, 16, 1), 1),
        ((32, 32, 921, 40), (4, 64, 1), 0),
    ] {
        let builds = config(grid, call, FrbTuning::default(), FrbIntensities::Float16)
            .builds()
            .unwrap();
        assert_eq!(builds[1].0, Stage2Table::Shared);
        shapes.push(builds[first].1.clone());
    }
    for defs in &shapes {
        compile(Kernel::FrbStage1, defs, "sm_90").unwrap_or_else(|e| panic!("{e}"));
        compiled += 1;
    }
    // The wgmma first stage (sm_90a) at every shape the op, the self-test and the benchmarks
    // give it, both outputs: seed 004 case 5 (the benchmark's call and the XB-engine
    // benchmark's chunk) and the self-test's; no spill, no serialised MMA.
    for (grid, call) in [
        ((24, 24, 512, 40), (256, 2064, 1)),
        ((24, 24, 512, 40), (256, 256, 5)),
        ((24, 24, 512, 40), (2, 64, 2)),
        ((24, 24, 400, 40), (1, 100, 1)),
        ((24, 24, 512, 7), (2, 64, 2)),
        ((24, 24, 300, 1), (1, 16, 1)),
        ((16, 16, 200, 25), (2, 100, 2)),
        ((8, 8, 50, 3), (3, 16, 2)),
        ((12, 12, 100, 24), (2, 48, 2)),
    ] {
        for output in both {
            let cfg = config(grid, call, FrbTuning::default(), output);
            let shape = WgmmaShape::choose(&cfg).expect("a wgmma shape");
            compile(Kernel::FrbStage1Wgmma, &shape.defines(&cfg), "sm_90a")
                .unwrap_or_else(|e| panic!("{e}"));
            compiled += 1;
        }
    }
    assert_eq!(
        compiled,
        ARCHES.len() * (7 * 3 + 20 + 2 + 5 * 6 + 1 + 4 + 2 + 2) + 14 + 16 + 1 + 4 + 20 + 55 + 18
    );
}

/// The narrowband kernels: the DDC for every sample width on every architecture (the default
/// mapping) and each shape and mapping the self-test runs, including the largest subsampling
/// factor; the complex PFB and the narrowband post-processing for both output widths, with and
/// without dither.
#[test]
fn the_narrowband_kernels_compile() {
    let plan = |sample_bits, subsampling, taps, tuning: Option<(usize, usize, usize)>| {
        let shape = DdcShape {
            sample_bits,
            subsampling,
            taps,
        };
        let tuning = tuning.map_or(DdcTuning::default_for(shape), |(c, g, sg)| DdcTuning {
            coarsen: c,
            groups: g,
            subgroup: sg,
        });
        DdcPlan::new(shape, tuning).unwrap_or_else(|e| panic!("{e}"))
    };
    for arch in ARCHES {
        for bits in [2, 3, 4, 5, 6, 7, 8, 9, 10, 12, 16] {
            compile(Kernel::Ddc, &plan(bits, 8, 128, None).defines(), arch)
                .unwrap_or_else(|e| panic!("{bits} bits, {arch}: {e}"));
        }
    }
    for p in [
        plan(10, 8, 123, None),
        plan(10, 4, 3, None),
        plan(10, 10, 155, None),
        plan(10, 100, 1601, None),
        plan(10, 512, 8192, None),
        plan(10, 2, 1000, None),
        plan(10, 16, 256, Some((1, 32, 1))),
        plan(10, 16, 256, Some((2, 64, 8))),
        plan(10, 16, 256, Some((8, 32, 2))),
        plan(10, 16, 256, Some((4, 256, 4))),
        plan(12, 12, 200, Some((8, 128, 3))),
        // The narrowband backend self-test's filters (default mappings).
        plan(8, 8, 128, None),
        plan(12, 8, 128, None),
        plan(16, 6, 160, None),
        plan(10, 6, 96, None),
    ] {
        compile(Kernel::Ddc, &p.defines(), "sm_90").unwrap_or_else(|e| panic!("{p:?}: {e}"));
    }
    for arch in ARCHES {
        compile(Kernel::FmaPeak, &[], arch).unwrap_or_else(|e| panic!("{arch}: {e}"));
        for (fft_len, taps) in [(8192, 16), (64, 4), (2, 1)] {
            let defs = vec![("FFT_LEN", fft_len), ("TAPS", taps), ("SPECTRA", 40)];
            compile(Kernel::PfbComplex, &defs, arch).unwrap_or_else(|e| panic!("{arch}: {e}"));
        }
        for out_bits in [4, 8] {
            for dither in [0, 1] {
                let defs = vec![
                    ("CHANNELS", 4096),
                    ("UNZIP", 1),
                    ("SPECTRA", 64),
                    ("HEAP_SPECTRA", 16),
                    ("OUT_BITS", out_bits),
                    ("DITHER", dither),
                    ("STILE", 8),
                    ("SPECTRUM_SAMPLES", 4096 * 2 * 8),
                    ("FFT_LEN", 8192),
                ];
                compile(Kernel::Postproc, &defs, arch).unwrap_or_else(|e| panic!("{arch}: {e}"));
            }
        }
    }
}

#[test]
fn a_compile_error_is_reported_with_the_log() {
    // A define the kernel needs is missing: NVRTC fails and the log names the identifier.
    let err = compile(Kernel::Postproc, &[("CHANNELS", 64)], "sm_90").unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("postproc.cu") && text.contains("UNZIP"),
        "{text}"
    );
}

#[test]
fn a_ptxas_warning_fails_the_compile() {
    // Logs as ptxas wrote them: a spill (the wgmma correlator with four epilogue batches, seen
    // on the device 2026-11-23), serialised wgmma, and an information line that must pass.
    use cbf::gpu::compile::check_log;
    let spill = "ptxas warning : Registers are spilled to local memory in function 'corr_wgmma', 8 bytes spill stores, 8 bytes spill loads";
    let serial = "ptxas warning : (C7510) Potential Performance Loss: wgmma.mma_async instructions are serialized due to the presence of Extern calls in the function 'corr_wgmma'";
    // As ptxas wrote it for a wgmma whose trimmed shapes named the full one's last accumulator
    // registers (2026-11-26): an info line, not a warning.
    let starved = "ptxas info    : (C7511) Potential Performance Loss: wgmma.mma_async instructions are serialized due to insufficient register resources for the wgmma pipeline in the function 'corr_wgmma'";
    let info = "ptxas info    : (C7519) warpgroup.arrive is injected in around line 802 by compiler to allow use of registers in GMMA in function 'corr_wgmma'";
    assert!(check_log(spill).is_err());
    assert!(check_log(serial).is_err());
    assert!(check_log(starved).is_err());
    assert!(check_log(info).is_ok());
    assert!(check_log("").is_ok());
}

/// Every mapping the start-up DDC tuner times (`gpu::ddc_tune::candidates`) compiles without
/// spills for MeerKAT's narrowband shapes (10-bit, discard S = 8 to 64 and no-discard S = 16,
/// 16 × S taps): a candidate that failed would cost the search a compile for nothing.
#[test]
fn every_ddc_tuning_candidate_compiles() {
    use cbf::gpu::ddc_tune::candidates;
    let start = std::time::Instant::now();
    let mut compiled = 0;
    for s in [8, 16, 32, 64] {
        let shape = DdcShape {
            sample_bits: 10,
            subsampling: s,
            taps: 16 * s,
        };
        for t in candidates(shape) {
            let p = DdcPlan::new(shape, t).unwrap_or_else(|e| panic!("{t:?}: {e}"));
            compile(Kernel::Ddc, &p.defines(), "sm_90").unwrap_or_else(|e| panic!("{p:?}: {e}"));
            compiled += 1;
        }
    }
    eprintln!(
        "{compiled} DDC candidates compiled in {:.1} s",
        start.elapsed().as_secs_f64()
    );
}
