//! `cbf fsim`: the F-engine simulator (katgpucbf fsim, facts §1.5): F heaps from
//! `--array-size` simulated F-engines to one destination per X-engine, paced at the real rate.
//! Flags → [`FsimConfig`] → [`Fsim`]; prints the final counters.

use clap::{Args, ValueEnum};

use super::CliError;
use crate::engine::control::ControlConfig;
use crate::engine::{unix_now, Shutdown};
use crate::net::parse_endpoints;
use crate::sim::fsim::Payload;
use crate::sim::{Fsim, FsimConfig};

/// `--payload`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PayloadKind {
    /// katgpucbf fsim's pattern: amplitude (t + 10c) mod 127, phase 2π(2·feng+pol)/(2·ants).
    Katgpucbf,
    /// Uniform random values in [−127, 127] (or [−7, 7]) from `--seed`.
    Random,
}

#[derive(Debug, Clone, Args)]
pub struct FsimArgs {
    /// F-engines (antennas) simulated.
    #[arg(long, default_value_t = 80)]
    pub array_size: usize,
    /// Channels of the whole band.
    #[arg(long, default_value_t = 32768)]
    pub channels: usize,
    /// Channels sent to each destination (X-engine).
    #[arg(long, default_value_t = 512)]
    pub channels_per_substream: usize,
    /// ADC samples between spectra [default: 2 × --channels].
    #[arg(long)]
    pub samples_between_spectra: Option<usize>,
    /// Jones vectors per F-engine batch; spectra per heap = this / --channels.
    #[arg(long, default_value_t = 1 << 20)]
    pub jones_per_batch: usize,
    /// ADC sample rate in Hz.
    #[arg(long, default_value_t = 1712e6)]
    pub adc_sample_rate: f64,
    /// UNIX time of timestamp 0 [default: now].
    #[arg(long)]
    pub sync_time: Option<f64>,
    /// Send at this multiple of the real rate (0 = as fast as possible).
    #[arg(long, default_value_t = 1.1)]
    pub send_rate_factor: f64,
    /// Payload bytes per packet.
    #[arg(long, default_value_t = 8192)]
    pub send_packet_payload: usize,
    /// Sending interfaces (names or addresses, comma-separated; DPDK ports with
    /// --send-transport dpdk).
    #[arg(long, value_delimiter = ',')]
    pub send_interface: Vec<String>,
    /// Multicast TTL.
    #[arg(long, default_value_t = 4)]
    pub send_ttl: u32,
    /// Stop after this many heaps from each F-engine to each destination (batches).
    #[arg(long)]
    pub max_heaps: Option<u64>,
    /// Stop after this many seconds.
    #[arg(long)]
    pub duration: Option<f64>,
    /// Send one batch and stop.
    #[arg(long)]
    pub run_once: bool,
    /// What the heaps carry.
    #[arg(long, value_enum, default_value_t = PayloadKind::Katgpucbf)]
    pub payload: PayloadKind,
    /// Seed of `--payload random` [default: random].
    #[arg(long)]
    pub seed: Option<u64>,
    /// Bits per real value: 8, or 4 (packed, real in the high nibble).
    #[arg(long, default_value_t = 8)]
    pub sample_bits: u32,
    /// F-engines whose heaps are left out (comma-separated feng_ids).
    #[arg(long, value_delimiter = ',')]
    pub missing_fengines: Vec<usize>,
    /// Leave them out only for timestamps in [START, END) (ADC samples), as START:END.
    #[arg(long)]
    pub missing_timestamps: Option<String>,
    /// katcp port (standard requests, settings as sensors); 0 picks a free one.
    #[arg(long, default_value_t = 7147)]
    pub katcp_port: u16,
    /// Address the katcp and Prometheus servers listen on.
    #[arg(long, default_value = "0.0.0.0")]
    pub katcp_host: std::net::IpAddr,
    /// Serve Prometheus metrics (`fsim_output_heaps`, `fsim_output_bytes`,
    /// `fsim_time_error_s`) at http://HOST:PORT/metrics.
    #[arg(long)]
    pub prometheus_port: Option<u16>,
    /// One destination per X-engine, in channel order: A.B.C.D[+N]:port[,...].
    #[arg(required = true)]
    pub dest: Vec<String>,
    #[command(flatten)]
    pub send_transport: super::dpdk::SendTransportArgs,
    #[command(flatten)]
    pub dpdk: super::dpdk::DpdkArgs,
}

impl FsimArgs {
    /// The library configuration; endpoint lists and the timestamp range are parsed here.
    pub fn config(&self) -> Result<FsimConfig, CliError> {
        let mut dests = Vec::new();
        for d in &self.dest {
            dests.extend(parse_endpoints(d).map_err(|e| CliError::flag("dest", e))?);
        }
        if self.seed.is_some() && self.payload != PayloadKind::Random {
            return Err(CliError::flag(
                "--seed",
                "is only used with --payload random",
            ));
        }
        let missing_timestamps = match &self.missing_timestamps {
            None => None,
            Some(text) => Some(parse_range(text).ok_or_else(|| {
                CliError::flag(
                    "--missing-timestamps",
                    format!("{text:?} is not START:END (ADC sample counts)"),
                )
            })?),
        };
        Ok(FsimConfig {
            array_size: self.array_size,
            channels: self.channels,
            channels_per_substream: self.channels_per_substream,
            samples_between_spectra: self.samples_between_spectra,
            jones_per_batch: self.jones_per_batch,
            adc_sample_rate: self.adc_sample_rate,
            sync_time: self.sync_time.unwrap_or_else(unix_now),
            send_rate_factor: self.send_rate_factor,
            send_packet_payload: self.send_packet_payload,
            send_interfaces: self.send_interface.clone(),
            send_transport: self.send_transport.transport(
                crate::engine::send::SendTransport::Udp,
                "--send-transport",
                &self.dpdk,
            )?,
            send_ttl: self.send_ttl,
            max_heaps: self.max_heaps,
            duration: self.duration,
            run_once: self.run_once,
            payload: match self.payload {
                PayloadKind::Katgpucbf => Payload::Katgpucbf,
                PayloadKind::Random => Payload::Random {
                    seed: self.seed.unwrap_or_else(rand::random),
                },
            },
            sample_bits: self.sample_bits,
            missing_fengines: self.missing_fengines.clone(),
            missing_timestamps,
            dests,
            control: ControlConfig {
                host: self.katcp_host,
                katcp_port: self.katcp_port,
                prometheus_port: self.prometheus_port,
            },
        })
    }
}

fn parse_range(text: &str) -> Option<(u64, u64)> {
    let (a, b) = text.split_once(':')?;
    Some((a.trim().parse().ok()?, b.trim().parse().ok()?))
}

pub fn run(args: FsimArgs) -> Result<(), CliError> {
    let fsim = Fsim::new(args.config()?, Shutdown::install())?;
    let report = fsim.run()?;
    let secs = report.elapsed.as_secs_f64().max(1e-9);
    println!(
        "fsim: sent {} batches, {} heaps, {} packets, {} bytes in {:.3} s ({:.3} Gb/s, {:.0} packets/s)",
        report.batches,
        report.heaps,
        report.packets,
        report.wire_bytes,
        secs,
        report.wire_bytes as f64 * 8.0 / secs / 1e9,
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
        a: FsimArgs,
    }

    fn config(args: &[&str]) -> Result<FsimConfig, CliError> {
        let mut v = vec!["fsim"];
        v.extend_from_slice(args);
        Wrap::try_parse_from(v).unwrap().a.config()
    }

    fn flag_of(r: Result<FsimConfig, CliError>) -> &'static str {
        match r {
            Err(CliError::Flag { flag, .. }) => flag,
            other => panic!("expected a flag error, got {other:?}"),
        }
    }

    #[test]
    fn a_bad_endpoint_names_dest() {
        assert_eq!(flag_of(config(&["1.2.3:4"])), "dest");
    }

    #[test]
    fn a_seed_without_random_payload_is_refused() {
        assert_eq!(
            flag_of(config(&["--seed", "3", "127.0.0.1:7148"])),
            "--seed"
        );
    }

    #[test]
    fn a_bad_range_names_its_flag() {
        assert_eq!(
            flag_of(config(&["--missing-timestamps", "5-9", "127.0.0.1:7148"])),
            "--missing-timestamps"
        );
    }

    #[test]
    fn destination_lists_concatenate_and_flags_carry_over() {
        let c = config(&[
            "--missing-fengines",
            "3,7",
            "--missing-timestamps",
            "100:200",
            "--payload",
            "random",
            "--seed",
            "5",
            "239.1.0.1+1:7148",
            "239.1.0.9:7148",
        ])
        .unwrap();
        assert_eq!(c.dests.len(), 3);
        assert_eq!(c.missing_fengines, [3, 7]);
        assert_eq!(c.missing_timestamps, Some((100, 200)));
        assert_eq!(c.payload, Payload::Random { seed: 5 });
        c.validate().unwrap();
    }
}
