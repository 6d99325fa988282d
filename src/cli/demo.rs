//! `cbf demo`: the chain on loopback with defaults: dsim → fengine → capture. A simulated
//! dual-polarisation digitiser sends a tone at the centre of one channel plus noise to an
//! in-process F-engine (CPU backend), whose F heaps an in-process receiver assembles; it prints
//! live rates and a one-line spectrum summary (the peak channel per polarisation, which must be
//! the tone's channel), and fails if the tone is not where it was put.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Args;

use super::dsim::DsimArgs;
use super::fengine::FengineArgs;
use super::CliError;
use crate::dsp::pfb::{pfb_weights, Window};
use crate::engine::Shutdown;
use crate::fengine::BackendKind;
use crate::net::udp::{UdpReceiver, UdpSender};
use crate::net::{PacketReceiver, Received, RecvBatch};
use crate::sim::dsim::DigitiserHeaps;
use crate::sim::dsim_engine::send_loop;
use crate::spead::items::{ItemValue, FENG_RAW_ID, FREQUENCY_ID};
use crate::spead::recv::{HeapStream, HeapStreamConfig};
use crate::spead::send::SendStream;

#[derive(Debug, Clone, Args)]
pub struct DemoArgs {
    /// ADC sample rate in Hz of the simulated digitiser.
    #[arg(long, default_value_t = 20e6)]
    pub adc_sample_rate: f64,
    /// Seconds to run.
    #[arg(long, default_value_t = 5.0)]
    pub duration: f64,
    /// F-engine channels.
    #[arg(long, default_value_t = 1024)]
    pub channels: usize,
    /// Channel whose centre the test tone sits at.
    #[arg(long, default_value_t = 300)]
    pub tone_channel: usize,
}

fn free_port() -> Result<u16, CliError> {
    Ok(std::net::UdpSocket::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

pub fn run(args: DemoArgs) -> Result<(), CliError> {
    if args.tone_channel >= args.channels {
        return Err(CliError::flag(
            "--tone-channel",
            format!("must be below --channels ({})", args.channels),
        ));
    }
    let (in_port, out_port) = (free_port()?, free_port()?);
    let spectra_per_heap = 256;
    let chunk = (spectra_per_heap * 2 * args.channels).max(1 << 18);
    let tone = args.tone_channel as f64 * args.adc_sample_rate / (2 * args.channels) as f64;
    let dsim_args = DsimArgs {
        adc_sample_rate: args.adc_sample_rate,
        sample_bits: 10,
        heap_samples: 4096,
        signals: format!("cw(0.2, {tone}) + wgn(0.02);"),
        sync_time: None,
        first_id: 0,
        dither_seed: None,
        period: Some(chunk),
        max_period: chunk,
        max_heaps: None,
        duration: Some(args.duration),
        send_rate_factor: 1.0,
        interface: vec![],
        ttl: 1,
        send_buffer: 1 << 20,
        send_stop: false,
        katcp_port: 0,
        katcp_host: std::net::Ipv4Addr::LOCALHOST.into(),
        prometheus_port: None,
        dest: vec![
            format!("127.0.0.1:{in_port}"),
            format!("127.0.0.1:{in_port}"),
        ],
    };
    let plan = dsim_args
        .plan()
        .map_err(|e| CliError::Run(format!("demo: dsim {e}")))?;
    let feng_args = FengineArgs {
        src: format!("127.0.0.1:{in_port}"),
        recv_interface: None,
        recv_buffer: 64 << 20,
        recv_threads: 1,
        adc_sample_rate: args.adc_sample_rate,
        feng_id: 0,
        array_size: 1,
        dig_sample_bits: 10,
        recv_packet_samples: 4096,
        recv_chunk_samples: chunk,
        backend: BackendKind::Cpu,
        gpu_device: 0,
        jones_per_batch: spectra_per_heap * args.channels,
        max_delay_diff: 0,
        send_rate_factor: 1.1,
        send_sample_bits: 8,
        send_packet_payload: 8192,
        send_interface: None,
        send_ttl: 1,
        // Scale the tone's channel to about 30 of the 8-bit output's 127.
        gain: format!(
            "{}",
            30.0 / (0.2 * 511.0 / 2.0
                * pfb_weights(2 * args.channels, 16, 1.0, Window::Hann)
                    .iter()
                    .map(|&w| f64::from(w))
                    .sum::<f64>())
        ),
        dither_seed: None,
        wideband: vec![format!(
            "name=demo,channels={},dst=127.0.0.1:{out_port}",
            args.channels
        )],
        duration: Some(args.duration + 2.0),
        sync_time: None,
        katcp_port: 0,
        katcp_host: std::net::Ipv4Addr::LOCALHOST.into(),
        prometheus_port: None,
    };
    println!(
        "demo: dsim ({:.0} MS/s, tone at the centre of channel {}) → fengine ({} channels, CPU) → capture, {:.1} s",
        args.adc_sample_rate / 1e6,
        args.tone_channel,
        args.channels,
        args.duration
    );
    // The receiver: accumulate power per channel and polarisation over every F heap.
    let mut rx = UdpReceiver::bind(
        &[format!("127.0.0.1:{out_port}")
            .parse()
            .map_err(|_| CliError::Run("bad address".into()))?],
        None,
        64 << 20,
    )?;
    let power = Arc::new(Mutex::new(vec![[0.0f64; 2]; args.channels]));
    let f_heaps = Arc::new(AtomicU64::new(0));
    let stop = Shutdown::manual();
    let receiver = std::thread::Builder::new().name("demo-rx".into()).spawn({
        let (power, f_heaps, stop) = (Arc::clone(&power), Arc::clone(&f_heaps), stop.clone());
        move || -> Result<(), CliError> {
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
                    let (Some(ItemValue::Immediate(first)), Some(ItemValue::Bytes(raw))) =
                        (h.item(FREQUENCY_ID), h.item(FENG_RAW_ID))
                    else {
                        continue;
                    };
                    let cps = raw.len() / (spectra_per_heap * 4);
                    let mut pw = power.lock().map_err(|_| CliError::Run("poisoned".into()))?;
                    // Layout (channel, spectrum, pol, re/im): each 4 bytes are one spectrum of one
                    // channel, both polarisations.
                    for (i, v) in raw.chunks_exact(4).enumerate().take(cps * spectra_per_heap) {
                        let k = first as usize + i / spectra_per_heap;
                        for pol in 0..2 {
                            let (re, im) =
                                (f64::from(v[2 * pol] as i8), f64::from(v[2 * pol + 1] as i8));
                            pw[k][pol] += re * re + im * im;
                        }
                    }
                    f_heaps.fetch_add(1, Relaxed);
                }
            }
            Ok(())
        }
    })?;
    let engine = std::thread::Builder::new()
        .name("demo-fengine".into())
        .spawn(move || super::fengine::run(feng_args))?;
    std::thread::sleep(Duration::from_millis(300));
    let heaps = Arc::new(DigitiserHeaps::new(plan.config.clone(), &plan.signals));
    let all: Vec<std::net::SocketAddrV4> = plan.dests.iter().flatten().copied().collect();
    let senders = vec![UdpSender::new(&all, None, 1, 1 << 20)?];
    let mut stream =
        SendStream::new(plan.send_config(), senders).map_err(|e| CliError::Run(e.to_string()))?;
    let shutdown = Shutdown::install();
    let sent = send_loop(
        &plan,
        heaps,
        None,
        &mut stream,
        plan.start_timestamp(),
        &shutdown,
        |r| {
            let secs = r.elapsed.as_secs_f64();
            println!(
                "  {secs:5.1} s  dsim {:8} heaps {:6.3} Gb/s   F heaps received {:6}",
                r.heaps,
                r.bytes as f64 * 8.0 / secs / 1e9,
                f_heaps.load(Relaxed)
            );
        },
    )?;
    engine
        .join()
        .map_err(|_| CliError::Run("engine thread panicked".into()))??;
    let deadline = Instant::now() + Duration::from_millis(500);
    while Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    stop.request();
    receiver
        .join()
        .map_err(|_| CliError::Run("receiver thread panicked".into()))??;
    let pw = power.lock().map_err(|_| CliError::Run("poisoned".into()))?;
    let peak = |pol: usize| {
        (0..args.channels)
            .max_by(|&a, &b| pw[a][pol].total_cmp(&pw[b][pol]))
            .unwrap_or(0)
    };
    let (p0, p1) = (peak(0), peak(1));
    let n = f_heaps.load(Relaxed);
    println!(
        "demo: dsim sent {} heaps ({:.3} Gb/s); capture received {} F heaps; peak channel pol0 {}, pol1 {} (tone in channel {}): {}",
        sent.heaps,
        sent.bytes as f64 * 8.0 / sent.elapsed.as_secs_f64().max(1e-9) / 1e9,
        n,
        p0,
        p1,
        args.tone_channel,
        if p0 == args.tone_channel && p1 == args.tone_channel && n > 0 { "OK" } else { "WRONG" }
    );
    if n == 0 || p0 != args.tone_channel || p1 != args.tone_channel {
        return Err(CliError::Run(
            "the tone did not come out in its channel".into(),
        ));
    }
    Ok(())
}
