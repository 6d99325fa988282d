//! `cbf demo`: the chain on loopback with defaults. For now dsim → capture: a simulated
//! dual-polarisation digitiser sends to two UDP ports on 127.0.0.1 and an in-process receiver
//! checks every heap it assembles against the pattern dsim rendered (timestamp, digitiser_id
//! and every sample byte), printing live rates and a summary. Later engines slot in between.

use std::net::SocketAddrV4;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;

use super::dsim::{send_loop, DsimArgs};
use super::shutdown::Shutdown;
use super::CliError;
use crate::net::udp::{UdpReceiver, UdpSender};
use crate::net::{PacketReceiver, Received, RecvBatch};
use crate::sim::dsim::DigitiserHeaps;
use crate::spead::items::{ItemValue, ADC_SAMPLES_ID, DIGITISER_ID_ID, TIMESTAMP_ID};
use crate::spead::recv::{HeapStream, HeapStreamConfig, ReceivedHeap, StatsSnapshot};
use crate::spead::send::SendStream;

#[derive(Debug, Clone, Args)]
pub struct DemoArgs {
    /// ADC sample rate in Hz of the simulated digitiser.
    #[arg(long, default_value_t = 100e6)]
    pub adc_sample_rate: f64,
    /// Seconds to run.
    #[arg(long, default_value_t = 5.0)]
    pub duration: f64,
    /// Signal program for dsim.
    #[arg(long, default_value = "cw(0.5, 12.5e6) + wgn(0.05);")]
    pub signals: String,
    /// Bits per sample.
    #[arg(long, default_value_t = 10)]
    pub sample_bits: u32,
}

/// Checks of what the receiver saw.
#[derive(Debug, Default)]
struct Tally {
    heaps: AtomicU64,
    incomplete: AtomicU64,
    mismatched: AtomicU64,
}

fn check(heap: &ReceivedHeap, dsim: &DigitiserHeaps, tally: &Tally) {
    if heap.item(TIMESTAMP_ID).is_none() {
        return; // descriptors or a stop heap
    }
    if !heap.complete {
        tally.incomplete.fetch_add(1, Relaxed);
        return;
    }
    tally.heaps.fetch_add(1, Relaxed);
    let ts = heap.item(TIMESTAMP_ID).and_then(|v| v.as_u64());
    let id = heap.item(DIGITISER_ID_ID).and_then(|v| v.as_u64());
    let ok = match (ts, id, heap.item(ADC_SAMPLES_ID)) {
        (Some(ts), Some(id), Some(ItemValue::Bytes(samples))) => {
            let pol = (id & 1) as usize;
            let want = dsim.heap(pol, ts);
            want.items.iter().any(|(i, d)| {
                *i == ADC_SAMPLES_ID && matches!(d, crate::spead::send::ItemData::Bytes { data, .. } if data.as_ref() == samples)
            })
        }
        _ => false,
    };
    if !ok {
        tally.mismatched.fetch_add(1, Relaxed);
    }
}

fn free_port() -> Result<u16, CliError> {
    Ok(std::net::UdpSocket::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

pub fn run(args: DemoArgs) -> Result<(), CliError> {
    let ports = [free_port()?, free_port()?];
    let dests: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
    let dsim_args = DsimArgs {
        adc_sample_rate: args.adc_sample_rate,
        sample_bits: args.sample_bits,
        heap_samples: 4096,
        signals: args.signals.clone(),
        sync_time: None,
        first_id: 0,
        dither_seed: None,
        period: None,
        max_period: 1 << 20,
        max_heaps: None,
        duration: Some(args.duration),
        send_rate_factor: 1.0,
        interface: vec![],
        ttl: 1,
        send_buffer: 1 << 20,
        send_stop: true,
        katcp_port: 0,
        katcp_host: std::net::Ipv4Addr::LOCALHOST.into(),
        prometheus_port: None,
        dest: dests,
    };
    let plan = dsim_args.plan().map_err(|e| match e {
        CliError::Flag { flag, message } => CliError::Run(format!("demo: dsim {flag}: {message}")),
        other => other,
    })?;
    let shutdown = Shutdown::install();
    let endpoints: Vec<SocketAddrV4> = plan.dests.iter().flatten().copied().collect();
    let mut rx = UdpReceiver::bind(&endpoints, None, 64 << 20)?;
    let dsim = Arc::new(DigitiserHeaps::new(plan.config.clone(), &plan.signals));
    let tally = Arc::new(Tally::default());
    println!(
        "demo: dsim at {:.0} MS/s × 2 pols, {}-bit, signals {:?} → capture on {:?}, {:.1} s",
        args.adc_sample_rate / 1e6,
        args.sample_bits,
        plan.signals
            .iter()
            .map(ToString::to_string)
            .collect::<String>(),
        ports,
        args.duration
    );
    let receiver = std::thread::Builder::new().name("demo-rx".into()).spawn({
        let (dsim, tally, shutdown) = (Arc::clone(&dsim), Arc::clone(&tally), shutdown.clone());
        move || -> Result<StatsSnapshot, CliError> {
            // Stop heaps arrive on each port separately: end on silence after dsim is done instead.
            let mut stream = HeapStream::new(HeapStreamConfig {
                substreams: 2,
                stop_on_stop_item: false,
                ..Default::default()
            });
            let mut batch = RecvBatch::new(64, rx.slot_size(9200));
            let mut heaps = Vec::new();
            let give_up = Duration::from_secs(2);
            let mut done_at: Option<Instant> = None;
            while done_at.is_none_or(|t| t.elapsed() < give_up) {
                if shutdown.requested() && done_at.is_none() {
                    done_at = Some(Instant::now());
                }
                match rx.recv_batch(&mut batch)? {
                    Received::Packets(_) => {
                        for p in batch.iter() {
                            stream.add_packet(p, &mut heaps);
                        }
                    }
                    _ if done_at.is_some() => break,
                    _ => {}
                }
                for h in heaps.drain(..) {
                    check(&h, &dsim, &tally);
                }
            }
            stream.flush(&mut heaps);
            for h in heaps.drain(..) {
                check(&h, &dsim, &tally);
            }
            Ok(stream.stats())
        }
    })?;
    let senders = vec![UdpSender::new(&endpoints, None, 1, 1 << 20)?];
    let mut stream =
        SendStream::new(plan.send_config(), senders).map_err(|e| CliError::Run(e.to_string()))?;
    let sent = send_loop(
        &plan,
        Arc::clone(&dsim),
        None,
        &mut stream,
        plan.start_timestamp(),
        &shutdown,
        |r| {
            let secs = r.elapsed.as_secs_f64();
            println!(
                "  {:5.1} s  dsim {:8} heaps {:6.3} Gb/s   capture {:8} heaps",
                secs,
                r.heaps,
                r.bytes as f64 * 8.0 / secs / 1e9,
                tally.heaps.load(Relaxed)
            );
        },
    )?;
    shutdown.request();
    let stats = receiver
        .join()
        .map_err(|_| CliError::Run("receiver thread panicked".into()))??;
    let received = tally.heaps.load(Relaxed);
    let lost = sent.heaps.saturating_sub(received);
    let mismatched = tally.mismatched.load(Relaxed);
    let secs = sent.elapsed.as_secs_f64().max(1e-9);
    println!(
        "demo: sent {} heaps ({:.3} Gb/s, {:.0} packets/s); received {} complete, {} incomplete, {} lost, {} with wrong data; malformed packets {}",
        sent.heaps,
        sent.bytes as f64 * 8.0 / secs / 1e9,
        sent.packets as f64 / secs,
        received,
        tally.incomplete.load(Relaxed),
        lost,
        mismatched,
        stats.malformed_total()
    );
    if mismatched > 0 {
        return Err(CliError::Run(format!(
            "{mismatched} heaps arrived with data that differs from what dsim sent"
        )));
    }
    Ok(())
}
