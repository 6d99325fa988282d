//! Each engine of a band from its placement: its streams, identity, rates and full command
//! line, with the flags that exist in `cbf dsim`, `cbf fengine` and `cbf xbengine` (katgpucbf's
//! names, facts §1.2–§1.5). For a local run ([`super::local`]) the same flags, with this host's
//! binary, loopback addresses, the run's sync time and control on 127.0.0.1, unpinned.
#![deny(unsafe_code)]

use std::collections::BTreeMap;

use super::check::BandShape;
use super::config::{ArrayConfig, Backend, Band};
use super::local::{LocalRun, LOCAL_ADDRESS};
use super::place::Placement;
use super::plan::{BandGroups, EngineKind, EnginePlan};
use super::rates::{self, Rate};

/// Memory of a dsim (the Kubernetes request): its three pattern windows (active, spare, zeros)
/// of up to 2^27 samples per polarisation take about 1 GiB at 10 bits.
const DSIM_MEMORY_GIB: u32 = 4;

/// Threads of an F-engine besides its receive threads: the GPU (or CPU DSP) thread and the
/// send thread. The rest of its cores receive: `cbf fengine --recv-threads 4` took a whole
/// MeerKAT L-band antenna (34.6 Gb/s over 16 groups) where fewer lost heaps (README,
/// Performance).
const FENGINE_OTHER_THREADS: usize = 2;

/// How late an F heap may come to an XB-engine (`--recv-reorder-tol`), in seconds: xbgpu's
/// default of 2^29 ADC ticks at MeerKAT's 1712 MS/s. Given as time, so that the window of a
/// slower band is as long in seconds (2^29 ticks of the 26.75 MS/s test band are 20 s, which
/// would hold every chunk back that long).
const RECV_REORDER_SECONDS: f64 = (1u64 << 29) as f64 / 1712e6;

/// What every engine of one band shares.
pub(super) struct BandEngines<'a> {
    pub cfg: &'a ArrayConfig,
    pub band: &'a Band,
    pub shape: &'a BandShape,
    pub groups: &'a BandGroups,
    pub local: Option<&'a LocalRun>,
}

impl BandEngines<'_> {
    /// The fields every engine has, from its placement.
    fn engine(&self, name: String, kind: EngineKind, at: &Placement) -> EnginePlan {
        let node = &self.cfg.nodes[at.node];
        let nic = &node.nics[at.nic];
        let mut env = BTreeMap::new();
        let gpu = at.gpu.map(|g| node.gpus[g].index);
        if let Some(index) = gpu {
            // The engine is told --gpu-device 0 and sees only its planned GPU, so the same
            // command line serves a unit (this variable) and a pod (the device plugin's choice).
            env.insert("CUDA_DEVICE_ORDER".into(), "PCI_BUS_ID".into());
            env.insert("CUDA_VISIBLE_DEVICES".into(), index.to_string());
        }
        let (host, nic_name, address, cores, binary) = match self.local {
            Some(run) => (
                "localhost".to_string(),
                "lo".to_string(),
                LOCAL_ADDRESS.to_string(),
                vec![],
                run.binary.clone(),
            ),
            None => (
                node.hostname.clone(),
                nic.name.clone(),
                nic.address.clone(),
                at.cores.clone(),
                self.cfg.array.binary.clone(),
            ),
        };
        EnginePlan {
            name,
            kind,
            band: self.band.name.clone(),
            node: host,
            numa: at.numa,
            nic: nic_name,
            nic_address: address,
            gpu,
            cores,
            katcp_port: at.katcp_port,
            prometheus_port: at.prometheus_port,
            inputs: vec![],
            outputs: vec![],
            feng_id: None,
            channels: None,
            rx_gbps: 0.0,
            tx_gbps: 0.0,
            h2d_gbytes_per_s: 0.0,
            d2h_gbytes_per_s: 0.0,
            memory_gib: 0,
            rdma_resource: nic.rdma_resource.clone(),
            env,
            argv: vec![binary, kind.as_str().into()],
        }
    }

    /// The flags every engine takes the same way: time, control ports (and, for a local run,
    /// control on loopback only).
    fn common(&self, e: &mut EnginePlan) {
        let sync_time = self.local.map_or(self.cfg.array.sync_time, |r| r.sync_time);
        let v = [
            ("--adc-sample-rate", self.band.adc_sample_rate.to_string()),
            ("--sync-time", sync_time.to_string()),
            ("--katcp-port", e.katcp_port.to_string()),
            ("--prometheus-port", e.prometheus_port.to_string()),
        ];
        push(&mut e.argv, &v);
        if self.local.is_some() {
            push(&mut e.argv, &[("--katcp-host", LOCAL_ADDRESS.to_string())]);
        }
    }

    pub fn dsim(&self, name: String, ant: usize, at: &Placement) -> EnginePlan {
        let mut e = self.engine(name, EngineKind::Dsim, at);
        self.common(&mut e);
        let cores: Vec<String> = e.cores.iter().map(usize::to_string).collect();
        let mut flags = vec![
            ("--sample-bits", self.band.dig_sample_bits.to_string()),
            // digitiser_id's LSB is the polarisation (facts §1.9): 2 ids per antenna.
            ("--first-id", (2 * ant).to_string()),
            ("--interface", e.nic_address.clone()),
            ("--ttl", self.cfg.network.ttl.to_string()),
        ];
        if !cores.is_empty() {
            flags.push(("--affinity", cores.join(",")));
        }
        if let Some(s) = &self.cfg.dsim.signals {
            flags.push(("--signals", s.clone()));
        }
        if let Some(p) = self.cfg.dsim.period {
            flags.push(("--max-period", p.to_string()));
        }
        push(&mut e.argv, &flags);
        let streams = &self.groups.digitiser[ant];
        e.argv.extend(streams.iter().cloned());
        e.outputs = streams.to_vec();
        e.tx_gbps =
            rates::digitiser(self.band.adc_sample_rate, self.band.dig_sample_bits).wire_bps / 1e9;
        e.memory_gib = DSIM_MEMORY_GIB;
        e
    }

    pub fn fengine(&self, name: String, ant: usize, at: &Placement) -> EnginePlan {
        let mut e = self.engine(name, EngineKind::Fengine, at);
        let b = self.band;
        self.common(&mut e);
        let wideband = format!(
            "name={},channels={},dst={},taps={},dither={}",
            b.wideband,
            b.channels,
            self.groups.fx.endpoint(),
            b.taps,
            b.dither.as_str()
        );
        // A local run's digitiser stream is one address: one receive thread.
        let recv_threads = match self.local {
            Some(_) => 1,
            None => at.cores.len().saturating_sub(FENGINE_OTHER_THREADS).max(1),
        };
        push(
            &mut e.argv,
            &[
                ("--dig-sample-bits", b.dig_sample_bits.to_string()),
                ("--feng-id", ant.to_string()),
                ("--array-size", self.cfg.antennas.len().to_string()),
                ("--jones-per-batch", b.jones_per_batch.to_string()),
                ("--recv-chunk-samples", b.recv_chunk_samples.to_string()),
                ("--max-delay-diff", b.max_delay_diff.to_string()),
                ("--recv-threads", recv_threads.to_string()),
                ("--recv-interface", e.nic_address.clone()),
                ("--send-interface", e.nic_address.clone()),
                ("--send-ttl", self.cfg.network.ttl.to_string()),
                ("--wideband", wideband),
            ],
        );
        self.backend(&mut e, false, at.cores.len());
        let mut src = self.groups.digitiser[ant].to_vec();
        src.dedup();
        let src = src.join(",");
        e.argv.push(src.clone());
        e.inputs = vec![src];
        e.outputs = vec![self.groups.fx.endpoint()];
        e.feng_id = Some(ant);
        e.channels = Some((0, b.channels));
        let input = rates::digitiser(b.adc_sample_rate, b.dig_sample_bits);
        let output = rates::fengine_output(b.adc_sample_rate);
        set_rates(&mut e, input, output);
        e.memory_gib = b.fengine_memory_gib;
        e
    }

    pub fn xbengine(&self, name: String, x: usize, at: &Placement) -> EnginePlan {
        let mut e = self.engine(name, EngineKind::Xbengine, at);
        let (b, s) = (self.band, self.shape);
        let n_ants = self.cfg.antennas.len();
        let src = self.groups.fx.nth(x as u32).endpoint();
        // The positional source first, as katgpucbf's xbgpu is usually written.
        e.argv.push(src.clone());
        self.common(&mut e);
        push(
            &mut e.argv,
            &[
                ("--array-size", n_ants.to_string()),
                ("--channels", b.channels.to_string()),
                ("--channels-per-substream", s.cps.to_string()),
                ("--channel-offset-value", (x * s.cps).to_string()),
                (
                    "--samples-between-spectra",
                    s.samples_between_spectra.to_string(),
                ),
                ("--jones-per-batch", b.jones_per_batch.to_string()),
                (
                    "--recv-reorder-tol",
                    ((RECV_REORDER_SECONDS * b.adc_sample_rate).round() as u64)
                        .max(1)
                        .to_string(),
                ),
                ("--recv-interface", e.nic_address.clone()),
                ("--send-interface", e.nic_address.clone()),
                ("--send-ttl", self.cfg.network.ttl.to_string()),
            ],
        );
        let corrprod = self.groups.corrprod.nth(x as u32).endpoint();
        let mut outputs = vec![(
            "--corrprod",
            format!(
                "name={},dst={corrprod},heap_accumulation_threshold={}",
                b.corrprod, s.heap_accumulation_threshold
            ),
        )];
        e.outputs.push(corrprod);
        let mut tx = rates::corrprod(n_ants, s.cps, s.dump_seconds);
        for (beam, groups) in b.beams.iter().zip(&self.groups.beams) {
            let dst = groups.nth(x as u32).endpoint();
            outputs.push((
                "--beam",
                format!(
                    "name={},dst={dst},pol={},dither={}",
                    beam.name,
                    beam.pol,
                    beam.dither.as_str()
                ),
            ));
            e.outputs.push(dst);
            tx = tx.plus(rates::beam(b.adc_sample_rate, s.cps, b.channels));
        }
        push(&mut e.argv, &outputs);
        if self.local.is_some() {
            // No product controller sends ?capture-start to a local run.
            e.argv.push("--send-enabled".into());
        }
        self.backend(&mut e, true, at.cores.len());
        e.inputs = vec![src];
        e.channels = Some((x * s.cps, (x + 1) * s.cps));
        set_rates(
            &mut e,
            rates::xengine_input(b.adc_sample_rate, n_ants, s.cps, b.channels),
            tx,
        );
        e.memory_gib = b.xengine_memory_gib;
        e
    }

    /// `--backend`, and the GPU (always device 0 of those visible) or the CPU correlator's
    /// threads (one per core the XB-engine is placed with).
    fn backend(&self, e: &mut EnginePlan, xb: bool, cores: usize) {
        match self.cfg.array.backend {
            Backend::Cuda => push(
                &mut e.argv,
                &[("--backend", "cuda".into()), ("--gpu-device", "0".into())],
            ),
            Backend::Cpu if xb => push(
                &mut e.argv,
                &[
                    ("--backend", "cpu".into()),
                    ("--cpu-threads", cores.to_string()),
                ],
            ),
            Backend::Cpu => push(&mut e.argv, &[("--backend", "cpu".into())]),
        }
    }
}

fn push(argv: &mut Vec<String>, flags: &[(&str, String)]) {
    for (flag, value) in flags {
        argv.push(flag.to_string());
        argv.push(value.clone());
    }
}

fn set_rates(e: &mut EnginePlan, input: Rate, output: Rate) {
    e.rx_gbps = input.wire_bps / 1e9;
    e.tx_gbps = output.wire_bps / 1e9;
    if e.gpu.is_some() {
        e.h2d_gbytes_per_s = input.payload_bps / 8e9;
        e.d2h_gbytes_per_s = output.payload_bps / 8e9;
    }
}
