//! `cbf fengine`: the F-engine on the CPU or CUDA backend (katgpucbf fgpu's flags, facts §1.2,
//! §1.3). One stream receives both polarisations into chunks (pol from the digitiser_id LSB);
//! each `--wideband` and `--narrowband` output has its own
//! pipeline and send stream over those chunks; output heaps touched by lost input are not sent
//! and are counted.

use clap::Args;

use super::ibv::IbvFlags;
use super::katgpucbf::Unsupported;
use super::pinning::Pinning;
use super::CliError;
use crate::engine::control::ControlConfig;
use crate::engine::recv::{RecvTransport, SourceConfig};
use crate::engine::Shutdown;
use crate::fengine::control::parse_complex;
use crate::fengine::narrowband_output::NarrowbandOutput;
use crate::fengine::output::WidebandOutput;
use crate::fengine::{BackendKind, Engine, FengineConfig};

#[derive(Debug, Clone, Args)]
pub struct FengineArgs {
    /// Digitiser streams (A.B.C.D[+N]:port[,...], both polarisations) or a pcap file
    /// (katgpucbf's positional `src`, also accepted as `--src`).
    #[arg(
        value_name = "SRC",
        required_unless_present = "src_flag",
        conflicts_with = "src_flag"
    )]
    pub src: Option<String>,
    #[arg(long = "src", value_name = "SRC")]
    pub src_flag: Option<String>,
    /// Interface(s) on which to receive (multicast joins); a comma-separated list is dealt
    /// to the receive threads in turn.
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
    /// Compute backend: `cpu` (src/dsp on the host) or `cuda` (the GPU kernels; needs a CUDA
    /// driver, NVRTC and cuFFT).
    #[arg(long, value_enum, default_value_t = BackendKind::Cpu)]
    pub backend: BackendKind,
    /// CUDA device ordinal (with --backend cuda).
    #[arg(long, default_value_t = 0)]
    pub gpu_device: usize,
    /// File in which the DDC kernel's mappings, tuned at the first start on a device for each
    /// narrowband filter shape, are kept for later starts (with --backend cuda) [default:
    /// $XDG_CACHE_HOME/cbf/ddc-tuning.json, else ~/.cache/cbf/ddc-tuning.json]. A path that
    /// cannot be written is warned about: the mappings are then tuned at each start.
    #[arg(long, value_name = "PATH")]
    pub tuning_cache: Option<std::path::PathBuf>,
    /// Complex values (channels × spectra) per output heap batch.
    #[arg(long, default_value_t = 1 << 20)]
    pub jones_per_batch: usize,
    /// Largest coarse-delay difference between the polarisations, in samples.
    #[arg(long, default_value_t = 1 << 20)]
    pub max_delay_diff: usize,
    /// Output rate as a multiple of the data rate (0 = unlimited).
    #[arg(long, default_value_t = 1.1)]
    pub send_rate_factor: f64,
    /// Send threads per output, each with its own sockets and an equal share of the output's
    /// rate (cbf's flag): one thread's kernel UDP sockets carry about 27 Gb/s. Kernel UDP only.
    #[arg(long, default_value_t = 1)]
    pub send_threads: usize,
    /// Bits per output sample (real or imaginary part): 8, or 4 (packed, real in the high nibble).
    #[arg(long, default_value_t = 8)]
    pub send_sample_bits: u32,
    /// Payload bytes per output packet.
    #[arg(long, default_value_t = 8192)]
    pub send_packet_payload: usize,
    /// Interface(s) to send from (names or addresses, comma-separated: the output rate is
    /// shared between them; DPDK ports with --send-transport dpdk).
    #[arg(long)]
    pub send_interface: Option<String>,
    /// Socket send buffer in bytes.
    #[arg(long, default_value_t = 1 << 20)]
    pub send_buffer: usize,
    /// Jones vectors per output chunk (katgpucbf's GPU → host transfer unit, rounded up to a
    /// multiple of --jones-per-batch). cbf transfers and sends heap by heap, so this sets no
    /// buffer: it is checked, and a value other than the default is logged as having no
    /// effect.
    #[arg(long, default_value_t = 1 << 23)]
    pub send_chunk_jones: usize,
    /// Clear the timestamp's bits below the heap size before placing a heap (a workaround for
    /// digitisers that set them).
    #[arg(long)]
    pub mask_timestamp: bool,
    /// Receive straight into GPU memory through a host mapping of it (Vulkan device-local
    /// host-visible memory imported into CUDA, as katgpucbf's vkgdr): no host-to-device copy
    /// of the input. Needs --backend cuda, a Vulkan driver for the GPU and a BAR window as
    /// large as the receive chunks (resizable BAR); refused at start-up, saying which is
    /// missing, otherwise.
    #[arg(long)]
    pub use_vkgdr: bool,
    /// Send the output heaps straight from GPU memory (GPUDirect RDMA, as katgpucbf's
    /// PeerDirect): the NIC reads each packet's payload from the device, so the heaps are never
    /// copied to the host. Needs --backend cuda, --send-ibv, a build with ibverbs, and the
    /// nvidia_peermem kernel module; refused at start-up, saying which is missing, otherwise.
    #[arg(long)]
    pub use_peerdirect: bool,
    /// A narrowband output: name=…,channels=…,centre_frequency=…,decimation=…,dst=…[,ddc_taps=16×subsampling,weight_pass=0.005,pass_bandwidth=…,taps=16,w_cutoff=1.0,window_function=hann,dither=uniform,jones_per_batch=…]; pass_bandwidth (Hz) selects no-discard mode; repeatable.
    #[arg(long)]
    pub narrowband: Vec<String>,
    #[command(flatten)]
    pub unsupported: Unsupported,
    #[command(flatten)]
    pub pinning: Pinning,
    #[command(flatten)]
    pub ibv: IbvFlags,
    /// Multicast TTL of the output.
    #[arg(long, default_value_t = 4)]
    pub send_ttl: u32,
    /// Initial complex gain of every channel (e.g. 1.0 or 0.5+0.5j).
    #[arg(long, default_value = "1.0")]
    pub gain: String,
    /// Seed of the output dither [default: random].
    #[arg(long)]
    pub dither_seed: Option<u64>,
    /// A wideband output: name=…,channels=…,dst=…[,taps=16,w_cutoff=1.0,window_function=hann,dither=uniform,jones_per_batch=…]; repeatable (at least one --wideband or --narrowband).
    #[arg(long, required_unless_present = "narrowband")]
    pub wideband: Vec<String>,
    /// Stop after this many seconds.
    #[arg(long)]
    pub duration: Option<f64>,
    /// UNIX time of timestamp 0: the digitisers' sync time, against which `?delays` start
    /// times are taken. Required, as in katgpucbf (a default of "now" would put every delay
    /// model at the wrong time).
    #[arg(long)]
    pub sync_time: f64,
    /// katcp port (`?gain`, `?gain-all`, `?delays`, `?capture-start/stop`, sensors); 0 picks one.
    #[arg(long, default_value_t = 7147)]
    pub katcp_port: u16,
    /// Address the katcp and Prometheus servers listen on.
    #[arg(long, default_value = "0.0.0.0")]
    pub katcp_host: std::net::IpAddr,
    /// Serve Prometheus metrics (katgpucbf's fgpu names) at /metrics on this port.
    #[arg(long)]
    pub prometheus_port: Option<u16>,
}

impl FengineArgs {
    /// The engine's configuration from the flags (each parse error names its flag; the
    /// engine validates how they combine).
    pub fn config(&self) -> Result<FengineConfig, CliError> {
        self.unsupported.refuse()?;
        let (affinity, recv_threads) = self.pinning.affinity(self.recv_threads)?;
        let (recv_transport, comp_vectors, ibv_mprq) = self.ibv.recv(self.recv_transport)?;
        let send_transport =
            self.send_transport
                .transport(self.ibv.send()?, "--send-ibv", &self.dpdk)?;
        if self.send_chunk_jones == 0 {
            return Err(CliError::flag("--send-chunk-jones", "must be positive"));
        }
        if self.send_chunk_jones != 1 << 23 {
            tracing::info!(
                send_chunk_jones = self.send_chunk_jones,
                "--send-chunk-jones has no effect: cbf transfers and sends heap by heap"
            );
        }
        let src = self
            .src
            .clone()
            .or_else(|| self.src_flag.clone())
            .ok_or_else(|| CliError::flag("--src", "no source given"))?;
        let gain = parse_complex(&self.gain).ok_or_else(|| {
            CliError::flag(
                "--gain",
                format!("{:?} is not a finite complex number", self.gain),
            )
        })?;
        let outputs = self
            .wideband
            .iter()
            .map(|t| WidebandOutput::parse(t).map_err(|e| CliError::flag("--wideband", e)))
            .collect::<Result<Vec<_>, _>>()?;
        let narrowband = self
            .narrowband
            .iter()
            .map(|t| NarrowbandOutput::parse(t).map_err(|e| CliError::flag("--narrowband", e)))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(FengineConfig {
            source: SourceConfig {
                src,
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
            adc_sample_rate: self.adc_sample_rate,
            feng_id: self.feng_id,
            array_size: self.array_size,
            dig_sample_bits: self.dig_sample_bits,
            recv_packet_samples: self.recv_packet_samples,
            recv_chunk_samples: self.recv_chunk_samples,
            backend: self.backend,
            gpu_device: self.gpu_device,
            use_vkgdr: self.use_vkgdr,
            use_peerdirect: self.use_peerdirect,
            tuning_cache: self.tuning_cache.clone(),
            jones_per_batch: self.jones_per_batch,
            max_delay_diff: self.max_delay_diff,
            send_rate_factor: self.send_rate_factor,
            send_threads: self.send_threads,
            send_sample_bits: self.send_sample_bits,
            send_packet_payload: self.send_packet_payload,
            send_interfaces: self
                .send_interface
                .iter()
                .flat_map(|list| list.split(','))
                .map(str::to_string)
                .collect(),
            send_buffer: self.send_buffer,
            send_transport,
            mask_timestamp: self.mask_timestamp,
            send_ttl: self.send_ttl,
            gain,
            dither_seed: self.dither_seed.unwrap_or_else(rand::random),
            outputs,
            narrowband,
            duration: self.duration,
            sync_time: self.sync_time,
            control: ControlConfig {
                host: self.katcp_host,
                katcp_port: self.katcp_port,
                prometheus_port: self.prometheus_port,
            },
            affinity,
        })
    }
}

pub fn run(args: FengineArgs) -> Result<(), CliError> {
    let config = args.config()?;
    let report = Engine::new(config, Shutdown::install())?.run()?;
    let rx = &report.rx;
    let i = &report.input;
    println!(
        "fengine: input chunks {}, heaps {}, missing {:?}, incomplete {}, too old {}, far future {}, window jumps {}, resyncs {}, kernel drops {}, metadata {}, bad timestamp {}, malformed {}, worker blocked {} ({:.3} s)",
        i.chunks,
        rx.heaps,
        i.missing,
        rx.incomplete_heaps_evicted + rx.incomplete_heaps_flushed,
        rx.too_old_heaps,
        rx.far_future_heaps,
        rx.window_jumps,
        rx.resyncs,
        rx.kernel_drops,
        rx.rejected_heaps[0],
        rx.rejected_heaps[1],
        rx.malformed_total(),
        rx.worker_blocked,
        rx.worker_blocked_seconds()
    );
    for (name, t) in &report.outputs {
        println!(
            "fengine: output {name}: sent {} heaps, skipped {}, stalled {}, clipped {:?}, {} bytes",
            t.heaps, t.skipped, t.stalled, t.clipped, t.bytes
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Wrap {
        #[command(flatten)]
        a: FengineArgs,
    }

    /// Plan with good defaults, `extra` (flag, value) pairs replacing or adding flags.
    fn flag_of(extra: &[&str]) -> &'static str {
        let mut args: Vec<(String, String)> = [
            ("--src", "127.0.0.1:7148"),
            ("--adc-sample-rate", "1712e6"),
            ("--recv-chunk-samples", "4194304"),
            ("--max-delay-diff", "0"),
            ("--sync-time", "0"),
            ("--wideband", "name=w,channels=1024,dst=239.0.0.1+3:7148"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        for pair in extra.chunks(2) {
            match args.iter_mut().find(|(k, _)| k == pair[0]) {
                Some(slot) => slot.1 = pair[1].to_string(),
                None => args.push((pair[0].to_string(), pair[1].to_string())),
            }
        }
        let mut v = vec!["fengine".to_string()];
        for (k, val) in args {
            v.push(format!("{k}={val}"));
        }
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

    /// `--use-vkgdr` is taken with the CUDA backend (whether the device can serve it is found
    /// at start-up) and refused by name with the CPU one.
    #[test]
    fn use_vkgdr_needs_the_cuda_backend() {
        let flag = |backend: Option<&str>| {
            let config = config_with(&[&["--use-vkgdr"], backend.as_slice()].concat());
            assert!(config.use_vkgdr);
            config
                .validate()
                .map(|_| ())
                .map_err(|e| (e.flag, e.to_string()))
        };
        for refused in [None, Some("--backend=cpu")] {
            let (f, message) = flag(refused).unwrap_err();
            assert_eq!(f, "--use-vkgdr");
            assert!(message.contains("--backend cuda"), "{message}");
        }
        assert!(flag(Some("--backend=cuda")).is_ok());
    }

    /// The config of a command line sending from eth0, with `extra` flags.
    fn config_with(extra: &[&str]) -> FengineConfig {
        let mut v = vec![
            "fengine",
            "--adc-sample-rate=1712e6",
            "--sync-time=0",
            "--recv-chunk-samples=4194304",
            "--wideband=name=w,channels=1024,dst=239.0.0.1:7148",
            "--send-interface=eth0",
            "127.0.0.1:7148",
        ];
        v.extend(extra);
        Wrap::try_parse_from(v).unwrap().a.config().unwrap()
    }

    /// `--use-peerdirect` is taken with the CUDA backend and `--send-ibv` in a build with
    /// ibverbs (whether the host can do GPUDirect RDMA is found at start-up), and refused by
    /// name, saying what it needs, otherwise.
    #[test]
    fn use_peerdirect_needs_cuda_and_ibverbs() {
        let check = |extra: &[&str]| {
            let config = config_with(&[&["--use-peerdirect"], extra].concat());
            assert!(config.use_peerdirect);
            config.validate().map(|_| ()).map_err(|e| {
                assert_eq!(e.flag, "--use-peerdirect");
                e.message
            })
        };
        for cpu in [&["--send-ibv"][..], &["--send-ibv", "--backend=cpu"]] {
            let message = check(cpu).unwrap_err();
            assert!(message.contains("--backend cuda"), "{message}");
        }
        let message = check(&["--backend=cuda"]).unwrap_err();
        assert!(message.contains("--send-ibv"), "{message}");
        let built = check(&["--backend=cuda", "--send-ibv"]);
        if cfg!(feature = "ibv") {
            assert!(built.is_ok(), "{built:?}");
        } else {
            let message = built.unwrap_err();
            assert!(message.contains("built without ibverbs"), "{message}");
        }
    }

    /// Several send threads per output are for kernel UDP sockets: with ibverbs (which sends
    /// without the kernel's copy) `--send-threads` above 1 is refused by name.
    #[test]
    fn send_threads_are_for_kernel_sockets() {
        let check = |extra: &[&str]| {
            config_with(extra)
                .validate()
                .map(|_| ())
                .map_err(|e| e.flag)
        };
        assert_eq!(
            check(&["--send-threads=2", "--send-ibv"]),
            Err("--send-threads")
        );
        assert_eq!(check(&["--send-threads=2"]), Ok(()));
        // io_uring's sends go through the kernel's sockets too.
        assert_eq!(
            check(&["--send-threads=2", "--send-transport", "uring"]),
            Ok(())
        );
        // One thread is not refused with ibverbs.
        assert_ne!(
            check(&["--send-threads=1", "--send-ibv"]),
            Err("--send-threads")
        );
    }

    #[test]
    fn bad_flags_are_named() {
        assert_eq!(flag_of(&[]), "ok");
        assert_eq!(flag_of(&["--adc-sample-rate", "-1"]), "--adc-sample-rate");
        assert_eq!(flag_of(&["--dig-sample-bits", "11"]), "--dig-sample-bits");
        assert_eq!(
            flag_of(&["--recv-packet-samples", "100"]),
            "--recv-packet-samples"
        );
        assert_eq!(
            flag_of(&["--recv-chunk-samples", "1000"]),
            "--recv-chunk-samples"
        );
        assert_eq!(
            flag_of(&["--feng-id", "5", "--array-size", "4"]),
            "--feng-id"
        );
        assert_eq!(flag_of(&["--send-rate-factor", "-2"]), "--send-rate-factor");
        assert_eq!(flag_of(&["--send-threads", "0"]), "--send-threads");
        assert_eq!(flag_of(&["--send-threads", "17"]), "--send-threads");

        assert_eq!(flag_of(&["--gain", "abc"]), "--gain");
        assert_eq!(flag_of(&["--send-sample-bits", "6"]), "--send-sample-bits");
        assert_eq!(
            flag_of(&["--wideband", "name=w,channels=1000,dst=239.0.0.1:7148"]),
            "--wideband"
        );
        assert_eq!(
            flag_of(&["--wideband", "name=w,channels=1024,dst=239.0.0.1+2:7148"]),
            "--wideband"
        );
        assert_eq!(flag_of(&["--jones-per-batch", "1000"]), "--jones-per-batch");
        // A chunk too small for the heap span (1024 ch × 1024 spectra × 2 = 2 Mi samples).
        assert_eq!(
            flag_of(&["--recv-chunk-samples", "65536"]),
            "--recv-chunk-samples"
        );
        assert_eq!(
            flag_of(&["--max-delay-diff", "5000000"]),
            "--max-delay-diff"
        );
    }

    /// Each class of flag refused by name at its extremes (issue 11): durations (negative,
    /// NaN, huge), rates, sizes whose products overflow, ports.
    #[test]
    fn extreme_values_are_refused_by_class() {
        for d in ["-1", "0", "NaN", "inf", "1e300"] {
            assert_eq!(flag_of(&["--duration", d]), "--duration", "{d}");
        }
        for r in ["0.5", "1e300", "NaN"] {
            assert_eq!(flag_of(&["--adc-sample-rate", r]), "--adc-sample-rate");
        }
        for f in ["1e300", "1e-300", "NaN"] {
            assert_eq!(flag_of(&["--send-rate-factor", f]), "--send-rate-factor");
        }
        for t in ["NaN", "-5", "inf"] {
            assert_eq!(flag_of(&["--sync-time", t]), "--sync-time");
        }
        // 2^60 samples: a multiple of every span, and 1.4 EiB of chunk.
        assert_eq!(
            flag_of(&["--recv-chunk-samples", "1152921504606846976"]),
            "--recv-chunk-samples"
        );
        // Overflowed the tail arithmetic.
        assert_eq!(
            flag_of(&["--max-delay-diff", "18446744073709551615"]),
            "--max-delay-diff"
        );
        assert_eq!(
            flag_of(&["--wideband", "name=w,channels=1024,dst=239.0.0.1+3:0"]),
            "--wideband"
        );
        for (flag, value) in [("--katcp-port", "70000"), ("--prometheus-port", "65536")] {
            let line = [
                "fengine",
                "--src=x:1",
                "--adc-sample-rate=1",
                "--sync-time=0",
            ];
            let err = Wrap::try_parse_from(line.iter().copied().chain([
                "--wideband=name=w,channels=8,dst=1.2.3.4:5",
                flag,
                value,
            ]))
            .err()
            .unwrap();
            assert!(err.to_string().contains(flag), "{err}");
        }
    }

    /// A command line as katsdpcontroller starts fgpu (positional source, every tuning flag)
    /// is accepted as it is.
    #[test]
    fn a_katgpucbf_command_line_starts() {
        let line = "fengine --katcp-port 7147 --prometheus-port 7150 --adc-sample-rate 1712e6 \
            --sync-time 1700000000 --recv-interface lo --send-interface lo,lo --recv-buffer 134217728 \
            --send-buffer 1048576 --send-ttl 4 --send-rate-factor 1.1 --recv-packet-samples 4096 \
            --send-packet-payload 8192 --feng-id 3 --array-size 64 --jones-per-batch 1048576 \
            --recv-chunk-samples 33554432 --send-chunk-jones 8388608 --max-delay-diff 1048576 \
            --dig-sample-bits 10 --send-sample-bits 8 --gain 1.0 --mask-timestamp \
            --wideband name=wideband,channels=4096,dst=239.10.11.0+15:7148,taps=16 \
            239.10.10.0+7:7148";
        let args = Wrap::try_parse_from(line.split_whitespace()).unwrap().a;
        let config = args.config().unwrap();
        assert_eq!(config.source.src, "239.10.10.0+7:7148");
        assert_eq!(config.send_interfaces, ["lo", "lo"]);
        assert!(config.mask_timestamp);
        assert!(config.validate().is_ok());
    }

    /// katgpucbf flags cbf cannot honour are refused by name, with the reason.
    #[test]
    fn flags_cbf_cannot_honour_are_refused_by_name() {
        for (flag, value) in [
            // A completion vector without its ibverbs switch would be ignored: refused.
            ("--send-comp-vector", Some("-1")),
            ("--recv-comp-vector", Some("0,1")),
            ("--recv-ibv-mprq", Some("on")),
            ("--monitor-log", Some("/tmp/m")),
            ("--aiomonitor", None),
            ("--send-chunk-jones", Some("0")),
        ] {
            let mut v = vec![
                "fengine".to_string(),
                "--adc-sample-rate=1712e6".into(),
                "--sync-time=0".into(),
                "--wideband=name=w,channels=1024,dst=239.0.0.1:7148".into(),
                "239.0.0.1:7148".into(),
            ];
            v.push(match value {
                Some(x) => format!("{flag}={x}"),
                None => flag.to_string(),
            });
            match Wrap::try_parse_from(v).unwrap().a.config() {
                Err(CliError::Flag { flag: f, .. }) => assert_eq!(f, flag),
                other => panic!("{flag}: {other:?}"),
            }
        }
    }

    /// `--narrowband` beside `--wideband` or alone, on either backend; its refusals name
    /// `--narrowband`.
    #[test]
    fn narrowband_outputs_are_accepted_and_refused_by_name() {
        let nb = "name=nb,channels=1024,centre_frequency=4e8,decimation=8,dst=239.1.1.1:7148,\
                  jones_per_batch=65536";
        assert_eq!(flag_of(&["--narrowband", nb]), "ok");
        assert_eq!(flag_of(&["--narrowband", nb, "--backend", "cuda"]), "ok");
        for bad in [
            // decimation odd in discard mode; out of the digitised band; a name used twice.
            "name=nb,channels=1024,centre_frequency=4e8,decimation=7,dst=239.1.1.1:7148",
            "name=nb,channels=1024,centre_frequency=8.5e8,decimation=8,dst=239.1.1.1:7148",
            "name=w,channels=1024,centre_frequency=4e8,decimation=8,dst=239.1.1.1:7148",
            "name=nb,channels=1024,centre_frequency=4e8,decimation=8,dst=239.1.1.1:7148,pass_bandwidth=2e8",
        ] {
            let bad = format!("{bad},jones_per_batch=65536");
            assert_eq!(flag_of(&["--narrowband", &bad]), "--narrowband", "{bad}");
        }
        // Its heap span (1024 spectra × 16384 samples at the engine's --jones-per-batch)
        // must divide the chunk.
        let nb_default =
            "name=nb,channels=1024,centre_frequency=4e8,decimation=8,dst=239.1.1.1:7148";
        assert_eq!(
            flag_of(&["--narrowband", nb_default]),
            "--recv-chunk-samples"
        );
        let line = [
            "fengine",
            "--src=239.0.0.1:7148",
            "--adc-sample-rate=1712e6",
            "--sync-time=0",
            "--recv-chunk-samples=33554432",
            "--max-delay-diff=0",
        ];
        let alone = Wrap::try_parse_from(line.iter().copied().chain([
            "--narrowband",
            "name=nb,channels=4096,centre_frequency=3e8,decimation=8,dst=239.1.1.1+3:7148",
        ]))
        .unwrap()
        .a
        .config()
        .unwrap();
        assert!(alone.outputs.is_empty());
        assert_eq!(alone.validate().unwrap().outputs.len(), 1);
        let none = Wrap::try_parse_from(line).err().unwrap();
        assert!(none.to_string().contains("--wideband"), "{none}");
    }

    /// katgpucbf requires the sync time; "now" would put every `?delays` model elsewhere.
    #[test]
    fn the_sync_time_is_required() {
        let err = Wrap::try_parse_from([
            "fengine",
            "--src=239.0.0.1:7148",
            "--adc-sample-rate=1712e6",
            "--wideband=name=w,channels=1024,dst=239.0.0.1:7148",
        ])
        .err()
        .unwrap();
        assert!(err.to_string().contains("--sync-time"), "{err}");
    }
}
