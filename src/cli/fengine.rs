//! `cbf fengine`: the wideband F-engine on the CPU backend (katgpucbf fgpu's flags, facts §1.2,
//! §1.3). One stream receives both polarisations into chunks (pol from the digitiser_id LSB);
//! each `--wideband` output has its own pipeline and send stream; output heaps touched by lost
//! input are not sent and are counted.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use num_complex::Complex32;

use super::shutdown::Shutdown;
use super::CliError;
use crate::dsp::samples::{packed_len, valid_sample_bits};
use crate::fengine::heaps::{descriptor_heap, f_heap};
use crate::fengine::output::WidebandOutput;
use crate::fengine::pipeline::{tail_samples, Pipeline};
use crate::fengine::place::{InputLayout, ITEMS, REJECT_REASONS};
use crate::net::pcap::PcapReceiver;
use crate::net::udp::{UdpReceiver, UdpSender};
use crate::net::{parse_endpoints, PacketReceiver, Received, RecvBatch};
use crate::spead::recv::{ChunkGroup, ChunkGroupConfig, ChunkStream, StatsSnapshot};
use crate::spead::send::{Heap, HeapRef, SendMode, SendStream, SendStreamConfig};

#[derive(Debug, Clone, Args)]
pub struct FengineArgs {
    /// Digitiser streams (A.B.C.D[+N]:port[,...], both polarisations) or a pcap file.
    #[arg(long)]
    pub src: String,
    /// Interface on which to receive (multicast joins).
    #[arg(long)]
    pub recv_interface: Option<String>,
    /// Socket receive buffer in bytes.
    #[arg(long, default_value_t = 128 << 20)]
    pub recv_buffer: usize,
    /// ADC sample rate in Hz.
    #[arg(long)]
    pub adc_sample_rate: f64,
    /// This F-engine's index in the array.
    #[arg(long, default_value_t = 0)]
    pub feng_id: u64,
    /// Number of F-engines in the array (the heap counter step).
    #[arg(long, default_value_t = 65536)]
    pub array_size: u64,
    /// Bits per digitiser sample.
    #[arg(long, default_value_t = 10)]
    pub dig_sample_bits: u32,
    /// Samples per digitiser heap.
    #[arg(long, default_value_t = 4096)]
    pub recv_packet_samples: usize,
    /// Samples per polarisation in an input chunk.
    #[arg(long, default_value_t = 1 << 25)]
    pub recv_chunk_samples: usize,
    /// Complex values (channels × spectra) per output heap batch.
    #[arg(long, default_value_t = 1 << 20)]
    pub jones_per_batch: usize,
    /// Largest coarse-delay difference between the polarisations, in samples.
    #[arg(long, default_value_t = 1 << 20)]
    pub max_delay_diff: usize,
    /// Output rate as a multiple of the data rate (0 = unlimited).
    #[arg(long, default_value_t = 1.1)]
    pub send_rate_factor: f64,
    /// Payload bytes per output packet.
    #[arg(long, default_value_t = 8192)]
    pub send_packet_payload: usize,
    /// Interface to send from (name or address).
    #[arg(long)]
    pub send_interface: Option<String>,
    /// Multicast TTL of the output.
    #[arg(long, default_value_t = 4)]
    pub send_ttl: u32,
    /// Initial complex gain of every channel (e.g. 1.0 or 0.5+0.5j).
    #[arg(long, default_value = "1.0")]
    pub gain: String,
    /// Seed of the output dither [default: random].
    #[arg(long)]
    pub dither_seed: Option<u64>,
    /// A wideband output: name=…,channels=…,dst=…[,taps=16,w_cutoff=1.0,window_function=hann,dither=uniform,jones_per_batch=…]; repeatable.
    #[arg(long, required = true)]
    pub wideband: Vec<String>,
    /// Stop after this many seconds.
    #[arg(long)]
    pub duration: Option<f64>,
}

/// Parse a complex number as katcp/Python writes it: `1.5`, `0.5+0.25j`, `-2j`.
pub fn parse_complex(text: &str) -> Option<Complex32> {
    let t = text.trim().trim_start_matches('(').trim_end_matches(')');
    if let Some(body) = t.strip_suffix('j') {
        // Split at the last sign that is not an exponent sign or the leading sign.
        let bytes = body.as_bytes();
        let split = (1..bytes.len()).rev().find(|&i| {
            (bytes[i] == b'+' || bytes[i] == b'-') && !matches!(bytes[i - 1], b'e' | b'E')
        });
        return match split {
            Some(i) => Some(Complex32::new(
                body[..i].parse().ok()?,
                body[i..].parse().ok()?,
            )),
            None => Some(Complex32::new(
                0.0,
                if body.is_empty() || body == "+" {
                    1.0
                } else {
                    body.parse().ok()?
                },
            )),
        };
    }
    t.parse::<f32>().ok().map(|re| Complex32::new(re, 0.0))
}

struct Plan {
    layout: InputLayout,
    outputs: Vec<(WidebandOutput, usize)>,
    gain: Complex32,
}

impl FengineArgs {
    fn plan(&self) -> Result<Plan, CliError> {
        if !(self.adc_sample_rate.is_finite() && self.adc_sample_rate > 0.0) {
            return Err(CliError::flag(
                "--adc-sample-rate",
                "must be a positive number of Hz",
            ));
        }
        if !valid_sample_bits(self.dig_sample_bits) {
            return Err(CliError::flag(
                "--dig-sample-bits",
                format!("{} is not one of 2–10, 12, 16", self.dig_sample_bits),
            ));
        }
        let hs = self.recv_packet_samples;
        if hs == 0 || hs % 8 != 0 {
            return Err(CliError::flag(
                "--recv-packet-samples",
                "must be a positive multiple of 8",
            ));
        }
        if self.recv_chunk_samples == 0 || self.recv_chunk_samples % hs != 0 {
            return Err(CliError::flag(
                "--recv-chunk-samples",
                format!("must be a positive multiple of --recv-packet-samples ({hs})"),
            ));
        }
        if self.feng_id >= self.array_size {
            return Err(CliError::flag(
                "--feng-id",
                format!("must be less than --array-size ({})", self.array_size),
            ));
        }
        if !(self.send_rate_factor.is_finite() && self.send_rate_factor >= 0.0) {
            return Err(CliError::flag("--send-rate-factor", "must be ≥ 0"));
        }
        let gain = parse_complex(&self.gain)
            .filter(|g| g.re.is_finite() && g.im.is_finite())
            .ok_or_else(|| {
                CliError::flag(
                    "--gain",
                    format!("{:?} is not a finite complex number", self.gain),
                )
            })?;
        let mut outputs = Vec::new();
        for text in &self.wideband {
            let o = WidebandOutput::parse(text).map_err(|e| CliError::flag("--wideband", e))?;
            let sph = o.spectra_per_heap(self.jones_per_batch).map_err(|e| {
                CliError::flag("--jones-per-batch", format!("output {}: {e}", o.name))
            })?;
            let span = sph * 2 * o.channels;
            if self.recv_chunk_samples % span != 0 {
                return Err(CliError::flag(
                    "--recv-chunk-samples",
                    format!(
                        "must be a multiple of output {}'s heap span ({span} samples)",
                        o.name
                    ),
                ));
            }
            if tail_samples(o.taps, 2 * o.channels, self.max_delay_diff, hs)
                > self.recv_chunk_samples
            {
                return Err(CliError::flag(
                    "--max-delay-diff",
                    format!(
                        "with output {}'s PFB footprint it exceeds --recv-chunk-samples",
                        o.name
                    ),
                ));
            }
            outputs.push((o, sph));
        }
        Ok(Plan {
            layout: InputLayout {
                heap_samples: hs as u64,
                heap_bytes: packed_len(hs, self.dig_sample_bits) as u64,
                chunk_samples: self.recv_chunk_samples as u64,
            },
            outputs,
            gain,
        })
    }
}

/// A pipeline and its send stream.
struct Output {
    pipeline: Pipeline,
    stream: SendStream<UdpSender>,
    spectra_per_heap: usize,
    sent: u64,
    skipped: u64,
    clipped: [u64; 2],
}

fn open_source(
    src: &str,
    interface: Option<&str>,
    buffer: usize,
) -> Result<Box<dyn PacketReceiver>, CliError> {
    if Path::new(src).is_file() {
        return Ok(Box::new(
            PcapReceiver::open(Path::new(src), &[]).map_err(|e| CliError::flag("--src", e))?,
        ));
    }
    let eps = parse_endpoints(src)
        .map_err(|e| CliError::flag("--src", format!("{e} (and no such file)")))?;
    Ok(Box::new(
        UdpReceiver::bind(&eps, interface, buffer).map_err(|e| CliError::flag("--src", e))?,
    ))
}

pub fn run(args: FengineArgs) -> Result<(), CliError> {
    let plan = args.plan()?;
    let shutdown = Shutdown::install();
    let seed = args.dither_seed.unwrap_or_else(rand::random);
    let layout = plan.layout;
    let per_pol = layout.heaps_per_pol();
    let group = ChunkGroup::new(ChunkGroupConfig {
        heaps_per_chunk: 2 * per_pol,
        chunk_bytes: 2 * layout.pol_bytes(),
        max_chunks: 2,
        n_chunks: 6,
        n_streams: 1,
        max_heaps: 16,
        items: ITEMS.to_vec(),
        reject_reasons: REJECT_REASONS.to_vec(),
    })
    .map_err(|e| CliError::Run(e.to_string()))?;
    let mut source = open_source(&args.src, args.recv_interface.as_deref(), args.recv_buffer)?;
    let receiver = std::thread::Builder::new()
        .name("fengine-rx".into())
        .spawn({
            let group = Arc::clone(&group);
            let shutdown = shutdown.clone();
            move || -> StatsSnapshot {
                let place = Arc::new(move |p: &crate::spead::recv::PlaceInput<'_>| layout.place(p));
                let mut stream = ChunkStream::new(Arc::clone(&group), place);
                let mut batch = RecvBatch::new(64, source.slot_size(9200));
                while !stream.is_stopped() && !shutdown.requested() {
                    match source.recv_batch(&mut batch) {
                        Ok(Received::Packets(n)) => {
                            stream.note_batch(n);
                            for p in batch.iter() {
                                stream.add_packet(p);
                            }
                        }
                        Ok(Received::Idle) => {}
                        Ok(Received::End) => break,
                        Err(e) => {
                            tracing::error!(error = %e, "receive failed");
                            break;
                        }
                    }
                    stream.release_old();
                }
                stream.finish()
            }
        })?;
    let mut outputs = Vec::new();
    for (o, sph) in plan.outputs {
        let dests = o.dst.clone();
        let tx = UdpSender::new(
            &dests,
            args.send_interface.as_deref(),
            args.send_ttl,
            4 << 20,
        )
        .map_err(|e| CliError::flag("--send-interface", e))?;
        let cps = o.channels / dests.len();
        let payload = cps * sph * 4;
        let max_packet = args.send_packet_payload + 72;
        let packets = payload.div_ceil(args.send_packet_payload);
        let heaps_per_s = args.adc_sample_rate / (sph * 2 * o.channels) as f64 * dests.len() as f64;
        let rate = heaps_per_s * (payload + packets * 72) as f64 * args.send_rate_factor;
        let cfg = SendStreamConfig {
            max_packet_size: max_packet,
            rate,
            cnt_first: args.feng_id,
            cnt_step: args.array_size,
            ..Default::default()
        };
        let stream = SendStream::new(cfg, vec![tx]).map_err(|e| CliError::Run(e.to_string()))?;
        tracing::info!(output = %o.name, channels = o.channels, destinations = dests.len(), rate_gbps = rate * 8e-9, "wideband output");
        outputs.push(Output {
            pipeline: Pipeline::new(
                o,
                layout,
                args.dig_sample_bits,
                sph,
                args.max_delay_diff,
                plan.gain,
                seed,
            ),
            stream,
            spectra_per_heap: sph,
            sent: 0,
            skipped: 0,
            clipped: [0; 2],
        });
    }
    let start = Instant::now();
    // Descriptors every array_size × 5 s, the first after (feng_id + 1) × 5 s (katgpucbf's stagger).
    let mut next_descriptors = start + Duration::from_secs(5 * (args.feng_id + 1));
    let descriptor_period = Duration::from_secs(5 * args.array_size.min(1 << 20));
    let mut prev: Option<Box<crate::spead::recv::Chunk>> = None;
    let deadline = args.duration.map(|d| start + Duration::from_secs_f64(d));
    let mut chunks = 0u64;
    loop {
        if deadline.is_some_and(|d| Instant::now() >= d) || shutdown.requested() {
            group.stop();
        }
        let next = match group.ready().recv_timeout(Duration::from_millis(100)) {
            Ok(c) => Some(c),
            Err(crossbeam_channel::RecvTimeoutError::Timeout) => continue,
            Err(crossbeam_channel::RecvTimeoutError::Disconnected) => None,
        };
        if Instant::now() >= next_descriptors {
            for out in &mut outputs {
                let d = descriptor_heap(
                    out.pipeline.output.channels / out.pipeline.output.dst.len(),
                    out.spectra_per_heap,
                );
                let refs: Vec<HeapRef> = (0..out.stream.destinations())
                    .map(|i| HeapRef {
                        heap: &d,
                        cnt: None,
                        substream: i,
                        unpaced: true,
                    })
                    .collect();
                out.stream
                    .send_heaps(&refs, SendMode::RoundRobin)
                    .map_err(|e| CliError::Run(e.to_string()))?;
            }
            next_descriptors += descriptor_period;
        }
        if let Some(chunk) = prev.take() {
            chunks += 1;
            for out in &mut outputs {
                let channels = out.pipeline.output.channels;
                let n_dst = out.pipeline.output.dst.len();
                let sph = out.spectra_per_heap;
                let (stream, sent, skipped, clipped) = (
                    &mut out.stream,
                    &mut out.sent,
                    &mut out.skipped,
                    &mut out.clipped,
                );
                let mut err = None;
                *skipped += out.pipeline.process(&chunk, next.as_deref(), |h| {
                    if !h.valid {
                        *skipped += 1;
                        return;
                    }
                    clipped[0] += h.clips[0];
                    clipped[1] += h.clips[1];
                    let heaps: Vec<Heap<'_>> = (0..n_dst)
                        .map(|d| {
                            f_heap(h.data, h.timestamp, args.feng_id, d, channels / n_dst, sph)
                        })
                        .collect();
                    let refs: Vec<HeapRef> = heaps
                        .iter()
                        .enumerate()
                        .map(|(d, heap)| HeapRef::new(heap, d))
                        .collect();
                    match stream.send_heaps(&refs, SendMode::RoundRobin) {
                        Ok(()) => *sent += 1,
                        Err(e) => err = Some(e),
                    }
                });
                if let Some(e) = err {
                    return Err(CliError::Run(format!("send failed: {e}")));
                }
            }
            group.free(chunk);
        }
        match next {
            Some(c) => prev = Some(c),
            None => break,
        }
    }
    let rx = receiver
        .join()
        .map_err(|_| CliError::Run("receive thread panicked".into()))?;
    let reject = |i: usize| rx.rejected_heaps[i];
    println!(
        "fengine: input chunks {chunks}, heaps {}, incomplete {}, too old {}, metadata {}, bad timestamp {}, malformed {}",
        rx.heaps,
        rx.incomplete_heaps_evicted + rx.incomplete_heaps_flushed,
        rx.too_old_heaps,
        reject(0),
        reject(1),
        rx.malformed_total()
    );
    for out in &outputs {
        println!(
            "fengine: output {}: sent {} batches, skipped {}, clipped {:?}, {} bytes",
            out.pipeline.output.name,
            out.sent,
            out.skipped,
            out.clipped,
            out.stream.counters().bytes
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn complex_numbers_as_katcp_writes_them() {
        assert_eq!(parse_complex("1.5"), Some(Complex32::new(1.5, 0.0)));
        assert_eq!(parse_complex("0.5+0.25j"), Some(Complex32::new(0.5, 0.25)));
        assert_eq!(parse_complex("(1-2j)"), Some(Complex32::new(1.0, -2.0)));
        assert_eq!(parse_complex("-2j"), Some(Complex32::new(0.0, -2.0)));
        assert_eq!(
            parse_complex("1e-3+1e+2j"),
            Some(Complex32::new(1e-3, 100.0))
        );
        assert_eq!(parse_complex("x"), None);
    }
}
