//! `cbf xbengine`: the XB-engine (katgpucbf xbgpu's flags, facts §1.2, §1.4): F heaps from
//! `--array-size` F-engines in, `--corrprod` correlation products, `--beam` beams and
//! `--frb-beam` FFT-beamformed intensities out.

use std::net::IpAddr;

use clap::Args;

use super::ibv::IbvFlags;
use super::katgpucbf::Unsupported;
use super::pinning::Pinning;
use super::CliError;
use crate::engine::control::ControlConfig;
use crate::engine::recv::{RecvTransport, SourceConfig};
use crate::engine::Shutdown;
use crate::fengine::BackendKind;
use crate::xbengine::frb_output::FrbBeamOutput;
use crate::xbengine::output::{BeamOutput, CorrprodOutput};
use crate::xbengine::{Engine, XbengineConfig};

#[derive(Debug, Clone, Args)]
pub struct XbengineArgs {
    /// F-engine stream(s) this engine receives (A.B.C.D[+N]:port[,...]) or a pcap file.
    pub src: String,
    /// Number of antennas (F-engines) in the array.
    #[arg(long)]
    pub array_size: usize,
    /// Channels in the whole band.
    #[arg(long)]
    pub channels: usize,
    /// Channels this engine receives.
    #[arg(long)]
    pub channels_per_substream: usize,
    /// ADC samples between spectra (2 × channels for a critically sampled wideband PFB).
    #[arg(long)]
    pub samples_between_spectra: u64,
    /// First channel of this engine (its heaps' `frequency` item).
    #[arg(long, default_value_t = 0)]
    pub channel_offset_value: u64,
    /// Hz of the whole band [default: --adc-sample-rate / 2].
    #[arg(long)]
    pub bandwidth: Option<f64>,
    /// Channels × spectra per F-engine batch (spectra per heap = this / --channels).
    #[arg(long, default_value_t = 1 << 20)]
    pub jones_per_batch: usize,
    /// Bits per real or imaginary input value: 8, or 4 (packed, real in the high nibble).
    #[arg(long, default_value_t = 8)]
    pub sample_bits: u32,
    /// Consecutive batches per input chunk.
    #[arg(long, default_value_t = 32)]
    pub heaps_per_fengine_per_chunk: usize,
    /// Largest lateness of a heap still accepted, in ADC ticks.
    #[arg(long, default_value_t = 1 << 29)]
    pub recv_reorder_tol: u64,
    /// Send from the start, without ?capture-start.
    #[arg(long)]
    pub send_enabled: bool,
    /// ADC sample rate in Hz.
    #[arg(long)]
    pub adc_sample_rate: f64,
    /// UNIX time of timestamp 0: the digitisers' sync time, against which `?delays` start
    /// times are taken. Required, as in katgpucbf (a default of "now" would put every delay
    /// model at the wrong time).
    #[arg(long)]
    pub sync_time: f64,
    /// A correlation output: name=…,dst=…,heap_accumulation_threshold=…; repeatable.
    #[arg(long)]
    pub corrprod: Vec<String>,
    /// A single-polarisation beam: name=…,dst=…,pol=0|1[,dither=uniform|none]; repeatable.
    #[arg(long)]
    pub beam: Vec<String>,
    /// An FFT ("FRB") beamformer for dishes on a regular grid (seed 004):
    /// name=…,dst=…,grid=M×N,dish_map=FILE,t_ds=T,beams=P×Q|FILE[,scale=S]; repeatable.
    #[arg(long)]
    pub frb_beam: Vec<String>,
    /// Compute backend: `cpu` (src/dsp on the host) or `cuda` (the GPU correlator and
    /// beamformer; needs a CUDA driver and NVRTC).
    #[arg(long, value_enum, default_value_t = BackendKind::Cpu)]
    pub backend: BackendKind,
    /// CUDA device ordinal (with --backend cuda).
    #[arg(long, default_value_t = 0)]
    pub gpu_device: usize,
    /// Threads of the CPU backend's correlator [default: every core].
    #[arg(long)]
    pub cpu_threads: Option<usize>,
    /// Interface on which to receive (multicast joins).
    #[arg(long)]
    pub recv_interface: Option<String>,
    /// Socket receive buffer in bytes.
    #[arg(long, default_value_t = 128 << 20)]
    pub recv_buffer: usize,
    /// Receive threads; the --src endpoints are dealt round-robin between them [default: one
    /// per --recv-affinity entry, or 1].
    #[arg(long)]
    pub recv_threads: Option<usize>,
    /// How --src is read: `udp` (recvmmsg), `uring` (io_uring multishot receive into a
    /// provided-buffer ring; Linux 6.0) or `dpdk` (a DPDK port: --dpdk-args, --dpdk-port).
    #[arg(long, value_enum, default_value_t = RecvTransport::Udp)]
    pub recv_transport: RecvTransport,
    /// Busy-poll the receive sockets for this many µs (1–10000) before sleeping:
    /// SO_BUSY_POLL with `udp`, io_uring NAPI busy polling with `uring` (Linux 6.9); refused
    /// with `dpdk` and `ibv`, whose receive loops poll already.
    #[arg(long, value_name = "µs")]
    pub recv_busy_poll: Option<u32>,
    /// NUMA node for the receive memory (chunks, packet slots, io_uring buffers) [default:
    /// the node of the --recv-interface NICs, from /sys/class/net/<if>/device/numa_node, when
    /// they share one; else not bound].
    #[arg(long, value_name = "NODE")]
    pub recv_numa_node: Option<u32>,
    #[command(flatten)]
    pub dpdk: super::dpdk::DpdkArgs,
    #[command(flatten)]
    pub send_transport: super::dpdk::SendTransportArgs,
    /// Interface(s) to send from (name or address; comma-separated for several NICs; DPDK
    /// ports with --send-transport dpdk).
    #[arg(long, value_delimiter = ',')]
    pub send_interface: Vec<String>,
    /// Multicast TTL of the outputs.
    #[arg(long, default_value_t = 4)]
    pub send_ttl: u32,
    /// Socket send buffer in bytes.
    #[arg(long, default_value_t = 1 << 20)]
    pub send_buffer: usize,
    /// Output rate as a multiple of the data rate (0 = unlimited).
    #[arg(long, default_value_t = 1.1)]
    pub send_rate_factor: f64,
    /// Payload bytes per output packet.
    #[arg(long, default_value_t = 8192)]
    pub send_packet_payload: usize,
    /// Seed of the beams' dither [default: random].
    #[arg(long)]
    pub dither_seed: Option<u64>,
    /// Stop after this many seconds.
    #[arg(long)]
    pub duration: Option<f64>,
    /// katcp port; 0 picks one.
    #[arg(long, default_value_t = 7147)]
    pub katcp_port: u16,
    /// Address the katcp and Prometheus servers listen on.
    #[arg(long, default_value = "0.0.0.0")]
    pub katcp_host: IpAddr,
    /// Serve Prometheus metrics (katgpucbf's xbgpu names) at /metrics on this port.
    #[arg(long)]
    pub prometheus_port: Option<u16>,
    #[command(flatten)]
    pub unsupported: Unsupported,
    #[command(flatten)]
    pub pinning: Pinning,
    #[command(flatten)]
    pub ibv: IbvFlags,
}

impl XbengineArgs {
    /// The engine's configuration from the flags (each parse error names its flag; the
    /// engine validates how they combine).
    pub fn config(&self) -> Result<XbengineConfig, CliError> {
        self.unsupported.refuse()?;
        let (affinity, recv_threads) = self.pinning.affinity(self.recv_threads)?;
        let (recv_transport, comp_vectors, ibv_mprq) = self.ibv.recv(self.recv_transport)?;
        let send_transport =
            self.send_transport
                .transport(self.ibv.send()?, "--send-ibv", &self.dpdk)?;
        let corrprods = self
            .corrprod
            .iter()
            .map(|t| CorrprodOutput::parse(t).map_err(|e| CliError::flag("--corrprod", e)))
            .collect::<Result<Vec<_>, _>>()?;
        let beams = self
            .beam
            .iter()
            .map(|t| BeamOutput::parse(t).map_err(|e| CliError::flag("--beam", e)))
            .collect::<Result<Vec<_>, _>>()?;
        let frb_beams = self
            .frb_beam
            .iter()
            .map(|t| FrbBeamOutput::parse(t).map_err(|e| CliError::flag("--frb-beam", e)))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(XbengineConfig {
            source: SourceConfig {
                src: self.src.clone(),
                interface: self.recv_interface.clone(),
                buffer: self.recv_buffer,
                threads: recv_threads,
                transport: recv_transport,
                dpdk: self.dpdk.config(),
                busy_poll: self.recv_busy_poll,
                numa_node: self.recv_numa_node,
                comp_vectors,
                ibv_mprq,
            },
            array_size: self.array_size,
            channels: self.channels,
            channels_per_substream: self.channels_per_substream,
            samples_between_spectra: self.samples_between_spectra,
            channel_offset_value: self.channel_offset_value,
            bandwidth: self.bandwidth,
            jones_per_batch: self.jones_per_batch,
            sample_bits: self.sample_bits,
            heaps_per_fengine_per_chunk: self.heaps_per_fengine_per_chunk,
            recv_reorder_tol: self.recv_reorder_tol,
            send_enabled: self.send_enabled,
            adc_sample_rate: self.adc_sample_rate,
            sync_time: self.sync_time,
            corrprods,
            beams,
            frb_beams,
            backend: self.backend,
            gpu_device: self.gpu_device,
            cpu_threads: self
                .cpu_threads
                .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get())),
            send_rate_factor: self.send_rate_factor,
            send_packet_payload: self.send_packet_payload,
            send_interfaces: self.send_interface.clone(),
            send_ttl: self.send_ttl,
            send_buffer: self.send_buffer,
            send_transport,
            dither_seed: self.dither_seed.unwrap_or_else(rand::random),
            duration: self.duration,
            control: ControlConfig {
                host: self.katcp_host,
                katcp_port: self.katcp_port,
                prometheus_port: self.prometheus_port,
            },
            affinity,
        })
    }
}

pub fn run(args: XbengineArgs) -> Result<(), CliError> {
    let config = args.config()?;
    let report = Engine::new(config, Shutdown::install())?.run()?;
    let rx = &report.rx;
    let i = &report.input;
    println!(
        "xbengine: input chunks {}, heaps {}, missing {}, incomplete {}, too old {}, far future {}, window jumps {}, resyncs {}, kernel drops {}, metadata {}, bad timestamp {}, bad feng_id {}, malformed {}, worker blocked {} ({:.3} s)",
        i.chunks,
        i.heaps,
        i.missing,
        rx.incomplete_heaps_evicted + rx.incomplete_heaps_flushed,
        rx.too_old_heaps,
        rx.far_future_heaps,
        rx.window_jumps,
        rx.resyncs,
        rx.kernel_drops,
        rx.rejected_heaps[0],
        rx.rejected_heaps[1],
        rx.rejected_heaps[2],
        rx.malformed_total(),
        rx.worker_blocked,
        rx.worker_blocked_seconds()
    );
    for (name, t) in &report.x {
        println!(
            "xbengine: corrprod {name}: sent {} dumps, incomplete {}, skipped {}, clipped {}, {} bytes",
            t.heaps, t.incomplete_accs, t.skipped_accs, t.clipped, t.bytes
        );
    }
    for (name, t) in &report.beams {
        println!(
            "xbengine: beam {name}: sent {} heaps, clipped {}, {} bytes",
            t.heaps, t.clipped, t.bytes
        );
    }
    for (name, t) in &report.frb {
        println!(
            "xbengine: frb-beam {name}: sent {} heaps, clipped {}, {} bytes",
            t.heaps, t.clipped, t.bytes
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    #[command(args_override_self = true)]
    struct Wrap {
        #[command(flatten)]
        a: XbengineArgs,
    }

    /// A good command line but for `--sync-time=0`, which `flag_of` adds.
    const GOOD: [&str; 9] = [
        "xbengine",
        "239.10.0.1:7148",
        "--array-size=4",
        "--channels=1024",
        "--channels-per-substream=256",
        "--samples-between-spectra=2048",
        "--jones-per-batch=262144",
        "--adc-sample-rate=1712e6",
        "--corrprod=name=bl,dst=239.11.0.1:7148,heap_accumulation_threshold=4",
    ];

    /// The flag named by the first error for a command line of good defaults plus `extra`.
    fn flag_of(extra: &[&str]) -> &'static str {
        let mut v: Vec<String> = GOOD.iter().map(|s| s.to_string()).collect();
        v.push("--sync-time=0".into());
        v.extend(extra.iter().map(|s| s.to_string()));
        let config = match Wrap::try_parse_from(v).unwrap().a.config() {
            Err(CliError::Flag { flag, .. }) => return flag,
            Err(e) => panic!("{e}"),
            Ok(c) => c,
        };
        match config.validate() {
            Err(e) => e.flag,
            Ok(_) => "ok",
        }
    }

    #[test]
    fn bad_flags_are_named() {
        assert_eq!(flag_of(&[]), "ok");
        assert_eq!(flag_of(&["--array-size=0"]), "--array-size");
        assert_eq!(
            flag_of(&["--channels-per-substream=300"]),
            "--channels-per-substream"
        );
        assert_eq!(
            flag_of(&["--channel-offset-value=100"]),
            "--channel-offset-value"
        );
        assert_eq!(
            flag_of(&["--channel-offset-value=1024"]),
            "--channel-offset-value"
        );
        assert_eq!(flag_of(&["--jones-per-batch=1000"]), "--jones-per-batch");
        assert_eq!(flag_of(&["--sample-bits=16"]), "--sample-bits");
        assert_eq!(
            flag_of(&["--heaps-per-fengine-per-chunk=0"]),
            "--heaps-per-fengine-per-chunk"
        );
        assert_eq!(flag_of(&["--adc-sample-rate=nan"]), "--adc-sample-rate");
        assert_eq!(flag_of(&["--bandwidth=-5"]), "--bandwidth");
        assert_eq!(
            flag_of(&["--samples-between-spectra=0"]),
            "--samples-between-spectra"
        );
        assert_eq!(flag_of(&["--send-rate-factor=-1"]), "--send-rate-factor");
        assert_eq!(
            flag_of(&["--send-packet-payload=0"]),
            "--send-packet-payload"
        );
        assert_eq!(flag_of(&["--duration=inf"]), "--duration");
        assert_eq!(flag_of(&["--corrprod=name=bl"]), "--corrprod");
        assert_eq!(
            flag_of(&["--beam=name=b,dst=239.1.1.1:7148,pol=3"]),
            "--beam"
        );
        assert_eq!(
            flag_of(&["--beam=name=bl,dst=239.1.1.1:7148,pol=0"]),
            "--corrprod",
            "names must be unique"
        );
        assert_eq!(flag_of(&["--cpu-threads=0"]), "--cpu-threads");
        // --frb-beam: 4 antennas on a 2×3 grid; chunks of 32 batches × 256 spectra.
        let dir = std::env::temp_dir().join(format!("cbf-cli-frb-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let map = dir.join("map");
        std::fs::write(&map, "0 0\n0 1\n1 0\n1 2\n").unwrap();
        let short = dir.join("short");
        std::fs::write(&short, "0 0\n").unwrap();
        let frb = |extra: &str, map: &std::path::Path| {
            format!(
                "--frb-beam=name=f,dst=239.1.1.2:7148,grid=2x3,dish_map={},beams=4x6,{extra}",
                map.display()
            )
        };
        assert_eq!(flag_of(&[&frb("t_ds=64", &map)]), "ok");
        assert_eq!(
            flag_of(&[&frb("t_ds=3", &map)]),
            "--frb-beam",
            "t_ds ∤ 8192"
        );
        assert_eq!(
            flag_of(&[&frb("t_ds=64", &short)]),
            "--frb-beam",
            "dishes ≠ antennas"
        );
        assert_eq!(flag_of(&[&frb("t_ds=0", &map)]), "--frb-beam");
        assert_eq!(flag_of(&[&frb("t_ds=64", &map), "--backend=cuda"]), "ok");
        assert_eq!(
            flag_of(&[
                &frb("t_ds=64", &map).replace("grid=2x3", "grid=2x33"),
                "--backend=cuda"
            ]),
            "--frb-beam",
            "the CUDA backend's grids end at 32 a side"
        );
        assert_eq!(
            flag_of(&[&frb("t_ds=64", &map), "--backend=cuda", "--sample-bits=4"]),
            "--frb-beam",
            "the CUDA backend's FRB stage takes 8-bit samples"
        );
        assert_eq!(
            flag_of(&[&frb("t_ds=64", &map).replace("name=f", "name=bl")]),
            "--corrprod",
            "names unique across kinds"
        );
        let many_frb: Vec<String> = (0..9)
            .map(|k| frb("t_ds=64", &map).replace("name=f", &format!("name=f{k}")))
            .collect();
        let many_frb: Vec<&str> = many_frb.iter().map(String::as_str).collect();
        assert_eq!(flag_of(&many_frb[..8]), "ok");
        assert_eq!(flag_of(&many_frb), "--frb-beam", "at most 8 FRB outputs");
        let many: Vec<String> = (0..64)
            .map(|k| {
                format!("--corrprod=name=x{k},dst=239.11.0.1:7148,heap_accumulation_threshold=4")
            })
            .collect();
        let many: Vec<&str> = many.iter().map(String::as_str).collect();
        assert_eq!(flag_of(&many[..63]), "ok");
        assert_eq!(flag_of(&many), "--corrprod", "at most 64 outputs");
        assert_eq!(
            flag_of(&["--recv-ibv", "--recv-transport=uring"]),
            "--recv-ibv"
        );
        // katgpucbf's pinning flags are real: a core this process may not use is refused.
        assert_eq!(flag_of(&["--send-affinity=1023"]), "--send-affinity");
        assert_eq!(
            flag_of(&["--recv-affinity=0", "--recv-threads=2"]),
            "--recv-affinity"
        );
        assert_eq!(flag_of(&["--recv-comp-vector=-1"]), "--recv-comp-vector");
        assert_eq!(flag_of(&["--monitor-log=/tmp/x"]), "--monitor-log");
    }

    /// Each class of flag refused by name at its extremes (issue 11): durations (negative,
    /// NaN, huge), rates, sizes whose products overflow, ports, the required sync time.
    #[test]
    fn extreme_values_are_refused_by_class() {
        for d in ["-1", "0", "NaN", "inf", "1e300"] {
            assert_eq!(flag_of(&[&format!("--duration={d}")]), "--duration");
        }
        for r in ["0.5", "1e300", "NaN"] {
            let f = format!("--adc-sample-rate={r}");
            assert_eq!(flag_of(&[&f]), "--adc-sample-rate");
        }
        for f in ["1e300", "1e-300", "NaN"] {
            let f = format!("--send-rate-factor={f}");
            assert_eq!(flag_of(&[&f]), "--send-rate-factor");
        }
        assert_eq!(flag_of(&["--sync-time=NaN"]), "--sync-time");
        // spectra per heap × samples between spectra overflowed 64 bits.
        assert_eq!(
            flag_of(&["--samples-between-spectra=18446744073709551615"]),
            "--samples-between-spectra"
        );
        assert_eq!(
            flag_of(&["--heaps-per-fengine-per-chunk=4096", "--array-size=4096"]),
            "--heaps-per-fengine-per-chunk"
        );
        assert_eq!(
            flag_of(&["--corrprod=name=bl,dst=239.11.0.1:0,heap_accumulation_threshold=4"]),
            "--corrprod"
        );
        for flag in ["--katcp-port=70000", "--prometheus-port=-1"] {
            let err = Wrap::try_parse_from(["xbengine", "239.10.0.1:7148", flag])
                .err()
                .unwrap();
            assert!(
                err.to_string().contains(&flag[..flag.find('=').unwrap()]),
                "{err}"
            );
        }
        let err = Wrap::try_parse_from(GOOD).err().unwrap();
        assert!(err.to_string().contains("--sync-time"), "{err}");
    }
}
