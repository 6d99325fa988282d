//! The whole chain in one process over loopback, as `cbf demo` runs it: one `dsim` per
//! antenna, all fed by one noise source (antenna i delayed by i·n samples with the signal
//! language's `delay`), one F-engine per antenna, one XB-engine with correlation products and
//! two beams (one pointed straight up, one steered by `?beam-delays` to undo the delays), and
//! capture threads. It reports the delay measured from the baseline (0, 1)'s phase slope
//! ([`analysis`]) against the delay injected, and the two beams' powers: the steered beam adds
//! the antennas coherently (N² times one antenna's power), the other on average incoherently
//! (N times), so their ratio is the antenna count.

pub mod analysis;

use std::net::{Ipv4Addr, SocketAddrV4};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use num_complex::{Complex32, Complex64};

use crate::control::katcp::Handler;
use crate::dsp::correlate::{baseline_index, n_baselines};
use crate::engine::control::ControlConfig;
use crate::engine::recv::{RecvTransport, SourceConfig};
use crate::engine::{unix_now, ConfigError, EngineError, Shutdown};
use crate::fengine::output::WidebandOutput;
use crate::fengine::{BackendKind, FengineConfig};
use crate::net::udp::UdpReceiver;
use crate::net::{PacketReceiver, Received, RecvBatch};
use crate::sim::dsim_config::DsimConfig;
use crate::sim::dsim_engine::Dsim;
use crate::spead::items::{ItemValue, BF_RAW_ID, XENG_RAW_ID};
use crate::spead::recv::{HeapStream, HeapStreamConfig};
use crate::xbengine::output::{BeamOutput, CorrprodOutput};
use crate::xbengine::XbengineConfig;

/// The chain's shape.
#[derive(Debug, Clone)]
pub struct ChainConfig {
    pub antennas: usize,
    pub adc_sample_rate: f64,
    pub channels: usize,
    /// Seconds of signal.
    pub duration: f64,
    /// Samples by which each antenna lags the one before.
    pub delay_samples: u32,
}

/// What the chain measured.
#[derive(Debug, Clone)]
pub struct ChainReport {
    pub dsim_heaps: u64,
    pub x_dumps: u64,
    pub complete_dumps: u64,
    pub beam_heaps: u64,
    /// Delay of antenna 1 behind antenna 0, in samples: measured and injected.
    pub delay_measured: f64,
    pub delay_injected: f64,
    /// Mean power per antenna in the F-engine output (from the autocorrelations).
    pub antenna_power: f64,
    /// Mean power of the beam pointed straight up, and of the steered beam.
    pub beam_power: [f64; 2],
}

/// Counters the progress line shows.
#[derive(Debug, Default)]
pub struct Progress {
    pub x_dumps: AtomicU64,
    pub beam_heaps: AtomicU64,
}

/// What the capture threads gather.
#[derive(Debug, Default)]
struct Gathered {
    /// Σ V₀₁ over both polarisations and every complete dump, per channel.
    v01: Vec<Complex64>,
    /// Σ autocorrelation power and the spectra it covers.
    auto: f64,
    spectra: u64,
    complete: u64,
    /// Per beam: Σ power, samples.
    beams: [(f64, u64); 2],
}

fn free_udp_port() -> Result<u16, EngineError> {
    Ok(std::net::UdpSocket::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

fn local(port: u16) -> SocketAddrV4 {
    SocketAddrV4::new(Ipv4Addr::LOCALHOST, port)
}

fn loopback_control() -> ControlConfig {
    ControlConfig {
        host: Ipv4Addr::LOCALHOST.into(),
        katcp_port: 0,
        prometheus_port: None,
    }
}

/// Receive heaps on `port` until `stop`, handing each to `take`.
fn capture(
    port: u16,
    stop: Shutdown,
    mut take: impl FnMut(&crate::spead::recv::ReceivedHeap) + Send + 'static,
) -> Result<JoinHandle<Result<(), EngineError>>, EngineError> {
    let mut rx = UdpReceiver::bind(&[local(port)], None, 32 << 20)?;
    Ok(std::thread::Builder::new()
        .name(format!("chain-rx{port}"))
        .spawn(move || {
            let mut stream = HeapStream::new(HeapStreamConfig::default());
            let mut batch = RecvBatch::new(64, rx.slot_size(9200));
            let mut heaps = Vec::new();
            while !stop.requested() {
                if let Received::Packets(_) = rx.recv_batch(&mut batch)? {
                    for p in batch.iter() {
                        stream.add_packet(p, &mut heaps);
                    }
                }
                for h in heaps.drain(..) {
                    take(&h);
                }
            }
            Ok(())
        })?)
}

/// Run the chain; `tick` is called about once a second with the elapsed time.
pub fn run(
    cfg: &ChainConfig,
    mut tick: impl FnMut(f64, &Progress),
) -> Result<ChainReport, EngineError> {
    let (n_ants, channels, fs) = (cfg.antennas, cfg.channels, cfg.adc_sample_rate);
    if !(2..=16).contains(&n_ants) {
        return Err(ConfigError::new("--antennas", "must be 2–16").into());
    }
    if !(channels.is_power_of_two() && (64..=8192).contains(&channels)) {
        return Err(ConfigError::new("--channels", "must be a power of two, 64–8192").into());
    }
    let n = cfg.delay_samples;
    if n as usize * (n_ants - 1) >= channels {
        return Err(ConfigError::new(
            "--delay",
            "the largest delay must stay below --channels samples (one phase wrap per channel)",
        )
        .into());
    }
    let sync_time = (unix_now() - 1.0).floor();
    let spectra = 256;
    let chunk = (spectra * 2 * channels).max(1 << 18);
    let xb_port = free_udp_port()?;
    let (x_port, beam_ports) = (free_udp_port()?, [free_udp_port()?, free_udp_port()?]);
    // The F-engines scale white noise of 0.1 full scale to about 10 of the 8-bit output's 127
    // (the PFB weights have Σw² = 1, so a channel's variance is the samples').
    let sigma = 0.1;
    let gain = 10.0 / (sigma * 511.0);
    let stop_engines = Shutdown::manual();
    let mut fengines = Vec::new();
    let mut dsims = Vec::new();
    for a in 0..n_ants {
        let in_port = free_udp_port()?;
        let feng = crate::fengine::Engine::new(
            FengineConfig {
                source: SourceConfig {
                    src: format!("127.0.0.1:{in_port}"),
                    interface: None,
                    buffer: 32 << 20,
                    threads: 1,
                    transport: RecvTransport::Udp,
                    dpdk: None,
                    comp_vectors: vec![],
                    ibv_mprq: Default::default(),
                    busy_poll: None,
                    numa_node: None,
                },
                adc_sample_rate: fs,
                feng_id: a as u64,
                array_size: n_ants as u64,
                dig_sample_bits: 10,
                recv_packet_samples: 4096,
                recv_chunk_samples: chunk,
                backend: BackendKind::Cpu,
                gpu_device: 0,
                use_vkgdr: false,
                use_peerdirect: false,
                tuning_cache: None,
                jones_per_batch: spectra * channels,
                max_delay_diff: 0,
                send_rate_factor: 1.1,
                send_threads: 1,
                send_sample_bits: 8,
                send_packet_payload: 8192,
                send_interfaces: vec![],
                send_ttl: 1,
                send_buffer: 1 << 20,
                send_transport: crate::engine::send::SendTransport::Udp,
                mask_timestamp: false,
                gain: Complex32::new(gain as f32, 0.0),
                dither_seed: 1 + a as u64,
                outputs: vec![WidebandOutput {
                    dst: vec![local(xb_port)],
                    ..WidebandOutput::parse(&format!(
                        "name=wide,channels={channels},dst=127.0.0.1:{xb_port}"
                    ))
                    .map_err(|e| ConfigError::new("--channels", e))?
                }],
                narrowband: vec![],
                duration: None,
                sync_time,
                control: loopback_control(),
                affinity: Default::default(),
            },
            stop_engines.clone(),
        )?;
        fengines.push(std::thread::spawn(move || feng.run()));
        // Every antenna sees the same noise (one seed), antenna a lagging by a·n samples.
        let signal = format!("delay(wgn({sigma}, 12345), {});", a as u32 * n);
        let dsim = Dsim::new(
            DsimConfig {
                adc_sample_rate: fs,
                sample_bits: 10,
                heap_samples: 4096,
                signals: signal,
                sync_time,
                first_id: 0,
                dither_seed: 100 + a as u64,
                period: Some(chunk),
                max_period: chunk,
                max_heaps: None,
                duration: Some(cfg.duration),
                send_rate_factor: 1.0,
                interfaces: vec![],
                ttl: 1,
                send_buffer: 1 << 20,
                send_transport: crate::engine::send::SendTransport::Udp,
                send_stop: false,
                send_threads: None,
                affinity: vec![],
                dests: vec![vec![local(in_port)], vec![local(in_port)]],
                control: loopback_control(),
            },
            Shutdown::manual(),
        )?;
        dsims.push(dsim);
    }
    let stop_xb = Shutdown::manual();
    let xb = crate::xbengine::Engine::new(
        XbengineConfig {
            source: SourceConfig {
                src: format!("127.0.0.1:{xb_port}"),
                interface: None,
                buffer: 32 << 20,
                threads: 1,
                transport: RecvTransport::Udp,
                dpdk: None,
                comp_vectors: vec![],
                ibv_mprq: Default::default(),
                busy_poll: None,
                numa_node: None,
            },
            array_size: n_ants,
            channels,
            channels_per_substream: channels,
            samples_between_spectra: 2 * channels as u64,
            channel_offset_value: 0,
            bandwidth: None,
            jones_per_batch: spectra * channels,
            sample_bits: 8,
            heaps_per_fengine_per_chunk: 4,
            // A second of lateness between the F-engines.
            recv_reorder_tol: fs as u64,
            send_enabled: true,
            adc_sample_rate: fs,
            sync_time,
            corrprods: vec![CorrprodOutput {
                name: "baseline-correlation-products".into(),
                dst: local(x_port),
                heap_accumulation_threshold: 8,
            }],
            beams: vec![
                BeamOutput {
                    name: "beam-zenith".into(),
                    dst: local(beam_ports[0]),
                    pol: 0,
                    dither: true,
                },
                BeamOutput {
                    name: "beam-steered".into(),
                    dst: local(beam_ports[1]),
                    pol: 0,
                    dither: true,
                },
            ],
            frb_beams: vec![],
            backend: BackendKind::Cpu,
            gpu_device: 0,
            cpu_threads: 1,
            send_rate_factor: 1.1,
            send_packet_payload: 8192,
            send_interfaces: vec![],
            send_ttl: 1,
            send_buffer: 4 << 20,
            send_transport: crate::engine::send::SendTransport::Udp,
            dither_seed: 99,
            duration: None,
            control: loopback_control(),
            affinity: Default::default(),
        },
        stop_xb.clone(),
    )?;
    // Steer the second beam to undo antenna a's lag: a delay of τ = −a·n/fs and, since the
    // beam's phase is given at the band centre (channel N/2), φ = π·a·n/2 (xbengine::beams).
    let delays: Vec<String> = (0..n_ants)
        .map(|a| {
            let lag = (a as u32 * n) as f64;
            format!("{}:{}", -lag / fs, std::f64::consts::PI * lag / 2.0)
        })
        .collect();
    let mut args = vec!["beam-steered".to_string()];
    args.extend(delays);
    if let Some(Err(e)) = xb.control().handle("beam-delays", &args) {
        return Err(EngineError::Backend(format!("beam-delays: {e}")));
    }
    let xb_thread = std::thread::spawn(move || xb.run());
    let gathered = Arc::new(Mutex::new(Gathered {
        v01: vec![Complex64::new(0.0, 0.0); channels],
        ..Default::default()
    }));
    let progress = Arc::new(Progress::default());
    let stop_capture = Shutdown::manual();
    let n_bl = n_baselines(n_ants);
    let x_capture = capture(x_port, stop_capture.clone(), {
        let (g, p) = (Arc::clone(&gathered), Arc::clone(&progress));
        move |h| {
            let Some(ItemValue::Bytes(raw)) = h.item(XENG_RAW_ID) else {
                return;
            };
            p.x_dumps.fetch_add(1, Relaxed);
            let v: Vec<i32> = raw
                .chunks_exact(4)
                .map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect();
            if v.len() != channels * n_bl * 8 || v.contains(&i32::MIN) {
                return; // a dump with missing antennas: not used
            }
            let mut g = g.lock().unwrap_or_else(|e| e.into_inner());
            g.complete += 1;
            let (b01, b00) = (baseline_index(0, 1), baseline_index(0, 0));
            for c in 0..channels {
                for prod in [0, 3] {
                    // aa and bb: both polarisations carry the same signal.
                    let o = ((c * n_bl + b01) * 4 + prod) * 2;
                    g.v01[c] += Complex64::new(f64::from(v[o]), f64::from(v[o + 1]));
                    let a = ((c * n_bl + b00) * 4 + prod) * 2;
                    g.auto += f64::from(v[a]);
                }
            }
            g.spectra += (2 * channels * 8 * spectra) as u64;
        }
    })?;
    let mut beam_captures = Vec::new();
    for (b, &port) in beam_ports.iter().enumerate() {
        let (g, p) = (Arc::clone(&gathered), Arc::clone(&progress));
        beam_captures.push(capture(port, stop_capture.clone(), move |h| {
            let Some(ItemValue::Bytes(raw)) = h.item(BF_RAW_ID) else {
                return;
            };
            p.beam_heaps.fetch_add(1, Relaxed);
            let power = analysis::mean_power(raw);
            let mut g = g.lock().unwrap_or_else(|e| e.into_inner());
            g.beams[b].0 += power * (raw.len() / 2) as f64;
            g.beams[b].1 += (raw.len() / 2) as u64;
        })?);
    }
    let start = Instant::now();
    let dsim_threads: Vec<_> = dsims
        .into_iter()
        .map(|d| std::thread::spawn(move || d.run()))
        .collect();
    while dsim_threads.iter().any(|t| !t.is_finished()) {
        std::thread::sleep(Duration::from_secs(1));
        tick(start.elapsed().as_secs_f64(), &progress);
    }
    let mut dsim_heaps = 0;
    for t in dsim_threads {
        dsim_heaps += t.join().map_err(|_| EngineError::Panicked("dsim"))??.heaps;
    }
    // Let the last chunks through each stage, then stop it.
    std::thread::sleep(Duration::from_millis(500));
    stop_engines.request();
    for f in fengines {
        f.join().map_err(|_| EngineError::Panicked("fengine"))??;
    }
    std::thread::sleep(Duration::from_millis(300));
    stop_xb.request();
    xb_thread
        .join()
        .map_err(|_| EngineError::Panicked("xbengine"))??;
    std::thread::sleep(Duration::from_millis(300));
    stop_capture.request();
    for c in beam_captures.into_iter().chain([x_capture]) {
        c.join().map_err(|_| EngineError::Panicked("capture"))??;
    }
    let g = gathered.lock().unwrap_or_else(|e| e.into_inner());
    let beam = |b: usize| g.beams[b].0 / g.beams[b].1.max(1) as f64;
    Ok(ChainReport {
        dsim_heaps,
        x_dumps: progress.x_dumps.load(Relaxed),
        complete_dumps: g.complete,
        beam_heaps: progress.beam_heaps.load(Relaxed),
        delay_measured: analysis::delay_from_phase_slope(&g.v01),
        delay_injected: f64::from(n),
        antenna_power: g.auto / g.spectra.max(1) as f64,
        beam_power: [beam(0), beam(1)],
    })
}
