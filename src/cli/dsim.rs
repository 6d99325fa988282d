//! `cbf dsim`: the digitiser simulator and soak-test packet generator (katgpucbf's dsim,
//! facts §1.5): flags → [`DsimConfig`] → [`Dsim`]; prints the final counters. The send loop,
//! katcp and metrics are in `crate::sim`.

use clap::Args;

use super::ibv::DsimIbvFlags;
use super::katgpucbf::DsimUnsupported;
use super::CliError;
use crate::engine::control::ControlConfig;
use crate::engine::{unix_now, Shutdown};
use crate::net::parse_endpoints;
use crate::sim::{Dsim, DsimConfig, DsimPlan};

#[derive(Debug, Clone, Args)]
pub struct DsimArgs {
    /// ADC sample rate in Hz.
    #[arg(long)]
    pub adc_sample_rate: f64,
    /// Bits per sample: 2–10, 12 or 16.
    #[arg(long, default_value_t = 10)]
    pub sample_bits: u32,
    /// Samples per heap.
    #[arg(long, default_value_t = 4096)]
    pub heap_samples: usize,
    /// Signal program: one `;`-terminated expression per polarisation (or one for all).
    #[arg(long, default_value = "cw(1.0, 232101234.0);")]
    pub signals: String,
    /// UNIX time of timestamp 0 [default: now].
    #[arg(long)]
    pub sync_time: Option<f64>,
    /// digitiser_id of the first polarisation (polarisation p sends first-id + p).
    #[arg(long, default_value_t = 0)]
    pub first_id: u64,
    /// Seed of the LSB dither [default: random].
    #[arg(long)]
    pub dither_seed: Option<u64>,
    /// Samples in the replayed pattern (a multiple of --heap-samples) [default: --max-period].
    #[arg(long)]
    pub period: Option<usize>,
    /// Largest pattern `?signals` may ask for, in samples.
    #[arg(long, default_value_t = 1 << 27)]
    pub max_period: usize,
    /// Stop after this many heaps per polarisation.
    #[arg(long)]
    pub max_heaps: Option<u64>,
    /// Stop after this many seconds.
    #[arg(long)]
    pub duration: Option<f64>,
    /// Send at this multiple of the ADC rate (0 = as fast as possible).
    #[arg(long, default_value_t = 1.0)]
    pub send_rate_factor: f64,
    /// Sending interfaces (names or addresses, comma-separated; DPDK ports with
    /// --send-transport dpdk); heaps go to the least loaded.
    #[arg(long, value_delimiter = ',')]
    pub interface: Vec<String>,
    /// Multicast TTL.
    #[arg(long, default_value_t = 4)]
    pub ttl: u32,
    /// Socket send buffer in bytes.
    #[arg(long, default_value_t = 1 << 20)]
    pub send_buffer: usize,
    /// Send a stop heap to every destination when done.
    #[arg(long)]
    pub send_stop: bool,
    /// Send threads, each with its own sockets and an equal share of the rate (one thread
    /// sends about 25 Gb/s; a 1712 MS/s 10-bit antenna is 34 Gb/s) [default: one per
    /// --affinity core, or 1].
    #[arg(long)]
    pub send_threads: Option<usize>,
    /// Cores for the send threads, one per thread (katgpucbf: one core for its send thread);
    /// -1 = not bound.
    #[arg(long, value_delimiter = ',', allow_hyphen_values = true)]
    pub affinity: Vec<i64>,
    /// katcp port (`?signals`, `?time`, sensors); 0 picks a free one.
    #[arg(long, default_value_t = 7147)]
    pub katcp_port: u16,
    /// Address the katcp server listens on.
    #[arg(long, default_value = "0.0.0.0")]
    pub katcp_host: std::net::IpAddr,
    /// Serve Prometheus metrics (`dsim_output_heaps`, `dsim_output_bytes`,
    /// `dsim_time_error_s`) at http://HOST:PORT/metrics.
    #[arg(long)]
    pub prometheus_port: Option<u16>,
    /// One destination list per polarisation: A.B.C.D[+N]:port[,...].
    #[arg(required = true)]
    pub dest: Vec<String>,
    #[command(flatten)]
    pub unsupported: DsimUnsupported,
    #[command(flatten)]
    pub ibv: DsimIbvFlags,
    #[command(flatten)]
    pub send_transport: super::dpdk::SendTransportArgs,
    #[command(flatten)]
    pub dpdk: super::dpdk::DpdkArgs,
}

impl DsimArgs {
    /// The library configuration; destination lists are parsed here (errors name `dest`).
    pub fn config(&self) -> Result<DsimConfig, CliError> {
        self.unsupported.refuse()?;
        let dests = self
            .dest
            .iter()
            .map(|d| parse_endpoints(d).map_err(|e| CliError::flag("dest", e)))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(DsimConfig {
            adc_sample_rate: self.adc_sample_rate,
            sample_bits: self.sample_bits,
            heap_samples: self.heap_samples,
            signals: self.signals.clone(),
            sync_time: self.sync_time.unwrap_or_else(unix_now),
            first_id: self.first_id,
            dither_seed: self.dither_seed.unwrap_or_else(rand::random),
            period: self.period,
            max_period: self.max_period,
            max_heaps: self.max_heaps,
            duration: self.duration,
            send_rate_factor: self.send_rate_factor,
            interfaces: self.interface.clone(),
            ttl: self.ttl,
            send_buffer: self.send_buffer,
            send_transport: self
                .send_transport
                .transport(self.ibv.send()?, "--ibv", &self.dpdk)?,
            send_stop: self.send_stop,
            send_threads: self.send_threads,
            affinity: self.cores()?,
            dests,
            control: ControlConfig {
                host: self.katcp_host,
                katcp_port: self.katcp_port,
                prometheus_port: self.prometheus_port,
            },
        })
    }

    /// `--affinity` as core numbers: katgpucbf's -1 (alone) means not bound.
    fn cores(&self) -> Result<Vec<usize>, CliError> {
        if self.affinity == [-1] {
            return Ok(vec![]);
        }
        self.affinity
            .iter()
            .map(|&c| {
                usize::try_from(c)
                    .map_err(|_| CliError::flag("--affinity", format!("{c} is not a core number")))
            })
            .collect()
    }

    /// Check every flag; errors name the flag.
    pub fn plan(&self) -> Result<DsimPlan, CliError> {
        Ok(self.config()?.validate()?)
    }
}

pub fn run(args: DsimArgs) -> Result<(), CliError> {
    let dsim = Dsim::new(args.config()?, Shutdown::install())?;
    let report = dsim.run()?;
    let secs = report.elapsed.as_secs_f64().max(1e-9);
    println!(
        "dsim: sent {} heaps, {} packets, {} bytes in {:.3} s ({:.3} Gb/s, {:.0} packets/s)",
        report.heaps,
        report.packets,
        report.bytes,
        secs,
        report.bytes as f64 * 8.0 / secs / 1e9,
        report.packets as f64 / secs
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Wrap {
        #[command(flatten)]
        a: DsimArgs,
    }

    fn plan(args: &[&str]) -> Result<DsimPlan, CliError> {
        let mut v = vec!["dsim"];
        v.extend_from_slice(args);
        Wrap::try_parse_from(v).unwrap().a.plan()
    }

    fn flag_of<T: std::fmt::Debug>(r: Result<T, CliError>) -> &'static str {
        match r {
            Err(CliError::Flag { flag, .. }) => flag,
            other => panic!("expected a flag error, got {other:?}"),
        }
    }

    /// Every numeric class of flag at its extremes (NaN, negative, huge, tiny) is refused at
    /// start-up naming the flag; before, `--duration 1e300` panicked converting to `Duration`
    /// and `--adc-sample-rate 1e300` ran unpaced.
    #[test]
    fn extreme_numbers_are_refused_naming_the_flag() {
        let d = "127.0.0.1:7148";
        for (flag, value) in [
            ("--duration", "1e300"),
            ("--duration", "NaN"),
            ("--duration", "-1"),
            ("--adc-sample-rate", "1e300"),
            ("--adc-sample-rate", "1e-300"),
            ("--adc-sample-rate", "NaN"),
            ("--send-rate-factor", "1e300"),
            ("--send-rate-factor", "1e-300"),
            ("--send-rate-factor", "-1"),
        ] {
            let rate = if flag == "--adc-sample-rate" {
                value
            } else {
                "1e9"
            };
            let rate = format!("--adc-sample-rate={rate}");
            let other = format!("{flag}={value}");
            let mut args = vec![rate.as_str()];
            if flag != "--adc-sample-rate" {
                args.push(&other);
            }
            args.push(d);
            assert_eq!(flag_of(plan(&args)), flag, "{flag} {value}");
        }
    }

    #[test]
    fn bad_flags_are_named() {
        let d = "127.0.0.1:7148";
        assert_eq!(
            flag_of(plan(&["--adc-sample-rate", "0", d])),
            "--adc-sample-rate"
        );
        assert_eq!(
            flag_of(plan(&[
                "--adc-sample-rate",
                "1e9",
                "--sample-bits",
                "11",
                d
            ])),
            "--sample-bits"
        );
        assert_eq!(
            flag_of(plan(&[
                "--adc-sample-rate",
                "1e9",
                "--heap-samples",
                "12",
                d
            ])),
            "--heap-samples"
        );
        assert_eq!(
            flag_of(plan(&["--adc-sample-rate", "1e9", "--period", "5000", d])),
            "--period"
        );
        assert_eq!(
            flag_of(plan(&[
                "--adc-sample-rate",
                "1e9",
                "--signals",
                "cw(1);",
                d
            ])),
            "--signals"
        );
        assert_eq!(
            flag_of(plan(&["--adc-sample-rate", "1e9", "1.2.3:4"])),
            "dest"
        );
        // 4096 tones × 2^27 samples: hours of rendering, refused before any.
        assert_eq!(
            flag_of(plan(&[
                "--adc-sample-rate",
                "1e9",
                "--signals",
                "multicw(4096, 0.001, 0, 1e6, 1e3);",
                d
            ])),
            "--signals"
        );
        assert_eq!(
            flag_of(plan(&[
                "--adc-sample-rate",
                "1e9",
                "--sync-time",
                "9e12",
                d
            ])),
            "--sync-time"
        );
        assert_eq!(
            flag_of(plan(&[
                "--adc-sample-rate",
                "1e9",
                "--send-rate-factor=-1",
                d
            ])),
            "--send-rate-factor"
        );
    }

    /// katgpucbf dsim's flags that cbf cannot honour are refused by name.
    #[test]
    fn dsim_flags_cbf_cannot_honour_are_refused_by_name() {
        let d = "239.1.1.1:7148";
        for (flag, extra) in [
            // Without --ibv it would be ignored: refused.
            ("--comp-vector", Some("-1")),
            ("--main-affinity", Some("2")),
            ("--aiomonitor", None),
        ] {
            let f = extra.map_or(flag.to_string(), |v| format!("{flag}={v}"));
            assert_eq!(flag_of(plan(&["--adc-sample-rate", "1e9", &f, d])), flag);
        }
    }

    /// `--send-threads` and `--affinity` decide the send threads together; each thread gets an
    /// equal share of the rate and its own interleaved run of even heap counters.
    #[test]
    fn send_threads_and_their_cores() {
        let d = "239.1.1.1:7148";
        let cores = |args: &[&str]| {
            let mut v = vec!["--adc-sample-rate", "1712e6"];
            v.extend_from_slice(args);
            v.push(d);
            plan(&v).map(|p| p.send_cores)
        };
        let allowed = crate::engine::affinity::allowed_cores().unwrap();
        let (a, b) = (allowed[0], *allowed.last().unwrap());
        assert_eq!(cores(&[]).unwrap(), vec![None]);
        assert_eq!(cores(&["--affinity=-1"]).unwrap(), vec![None]);
        assert_eq!(
            cores(&["--affinity", &a.to_string()]).unwrap(),
            vec![Some(a)]
        );
        let list = format!("{a},{b},{a}");
        assert_eq!(
            cores(&["--affinity", &list]).unwrap(),
            vec![Some(a), Some(b), Some(a)]
        );
        let pair = format!("{b},{a}");
        assert_eq!(
            cores(&["--send-threads", "2", "--affinity", &pair]).unwrap(),
            vec![Some(b), Some(a)]
        );
        assert_eq!(cores(&["--send-threads", "3"]).unwrap(), vec![None; 3]);
        for (bad, flag) in [
            (&["--send-threads", "0"][..], "--send-threads"),
            (&["--send-threads", "65"], "--send-threads"),
            (&["--send-threads", "2", "--affinity", "0"], "--affinity"),
            (&["--affinity=-2"], "--affinity"),
            (&["--affinity=0,-1"], "--affinity"),
            // Beyond the kernel's core set, and (on any machine this runs on) not allowed.
            (&["--affinity", "1000000"], "--affinity"),
            (&["--affinity", "1023"], "--affinity"),
        ] {
            assert_eq!(flag_of(cores(bad)), flag, "{bad:?}");
        }
        let p = plan(&["--adc-sample-rate", "1712e6", "--send-threads", "4", d]).unwrap();
        let configs: Vec<_> = (0..4).map(|t| p.send_config(t)).collect();
        // The streams are unpaced: each thread paces its groups by the sample clock.
        assert!(configs.iter().all(|c| c.rate == 0.0));
        assert_eq!(p.step_seconds(), Some(4096.0 / 1712e6));
        let mut cnts: Vec<u64> = configs
            .iter()
            .flat_map(|c| (0..5).map(move |k| c.cnt_first + k * c.cnt_step))
            .collect();
        cnts.sort_unstable();
        assert_eq!(cnts, (1..=20).map(|k| 2 * k).collect::<Vec<_>>());
    }

    #[test]
    fn rate_matches_the_adc() {
        let p = plan(&[
            "--adc-sample-rate",
            "1712e6",
            "239.0.0.1+7:7148",
            "239.0.1.1+7:7148",
        ])
        .unwrap();
        // 1712e6/4096 heaps/s per pol × 2 pols × (5120 + 72) bytes.
        assert!((p.rate() - 1712e6 / 4096.0 * 2.0 * 5192.0).abs() < 1e-3);
        assert_eq!(p.dests[1].len(), 8);
    }
}
