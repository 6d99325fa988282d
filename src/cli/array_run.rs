//! `cbf array run --local CONFIG [--duration S]` and `cbf array status (CONFIG [--local] |
//! --endpoints LIST)`: flags → a local plan ([`crate::array::plan::plan_local`]) → the launcher
//! ([`crate::array::launch`]), or a plan's engines or a list of endpoints →
//! [`crate::array::status`] → a table or JSON.

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Args;

use super::array::{check_command_lines, columns};
use super::CliError;
use crate::array::launch::{self, Ending};
use crate::array::local::LocalRun;
use crate::array::{self, Plan};
use crate::engine::{check_seconds, unix_now, Shutdown};

/// Longest `--interval` and `--timeout` of `cbf array status`.
const MAX_STATUS_SECONDS: f64 = 60.0;

#[derive(Debug, Args)]
pub struct RunArgs {
    /// Run on this host over loopback (the only kind of run: cbf schedules nothing).
    #[arg(long, required = true)]
    pub local: bool,
    /// Stop every engine after this many seconds [default: run until Ctrl-C].
    #[arg(long)]
    pub duration: Option<f64>,
    /// The array description (TOML, or YAML for a .yaml/.yml file; see examples/).
    pub config: PathBuf,
}

#[derive(Debug, Args)]
pub struct StatusArgs {
    /// Read the engines of `cbf array run --local` (on 127.0.0.1) rather than the nodes'.
    #[arg(long)]
    pub local: bool,
    /// Seconds between the two readings of the counters that give the rates.
    #[arg(long, default_value_t = 1.0)]
    pub interval: f64,
    /// Seconds each connection (katcp, Prometheus) may take.
    #[arg(long, default_value_t = 2.0)]
    pub timeout: f64,
    /// Print every engine's sensors, counters and rates as JSON.
    #[arg(long)]
    pub json: bool,
    /// Read these engines instead of a description's: katcp endpoints
    /// `host:port[:prometheus-port],...` (Prometheus at the katcp port + 2000 when not given);
    /// each engine's kind comes from its katcp server.
    #[arg(long, value_name = "HOST:PORT,...", conflicts_with_all = ["config", "local"])]
    pub endpoints: Option<String>,
    /// The array description (TOML, or YAML for a .yaml/.yml file; see examples/).
    #[arg(required_unless_present = "endpoints")]
    pub config: Option<PathBuf>,
}

/// The local plan of the description at `path`, for this binary and a sync time of now, with
/// every command line checked.
pub fn planned_local(path: &Path) -> Result<Plan, CliError> {
    let cfg = array::read(path)?;
    let binary = std::env::current_exe()
        .map_err(|e| CliError::Run(format!("cannot find this cbf binary: {e}")))?;
    let run = LocalRun {
        binary: binary.display().to_string(),
        sync_time: unix_now().floor(),
    };
    let plan = array::plan::plan_local(&cfg, &run)?;
    check_command_lines(&plan)?;
    Ok(plan)
}

pub fn run(args: RunArgs) -> Result<(), CliError> {
    let duration = args
        .duration
        .map(|d| check_seconds("--duration", d, false))
        .transpose()?;
    let plan = planned_local(&args.config)?;
    let stop = Shutdown::install();
    let first = plan.engines.first().map_or(0, |e| e.katcp_port);
    eprintln!(
        "cbf array run: {} engines of array {} on this host over loopback (katcp 127.0.0.1:{first}–{}; `cbf array status --local {}` reads them)",
        plan.engines.len(),
        plan.array,
        first + plan.engines.len().saturating_sub(1) as u16,
        args.config.display()
    );
    let report = launch::run(&plan, duration, &stop, std::io::stdout(), std::io::stderr())
        .map_err(|e| CliError::Run(e.to_string()))?;
    for (name, status) in &report.engines {
        let s = status.map_or("killed after the grace period".to_string(), |s| {
            s.to_string()
        });
        eprintln!("cbf array run: {name}: {s}");
    }
    match &report.ending {
        Ending::Died { engine, status } => Err(CliError::Run(format!(
            "engine {engine} stopped by itself ({status}); the others were stopped"
        ))),
        _ if !report.success() => Err(CliError::Run(
            "not every engine stopped cleanly".to_string(),
        )),
        ending => {
            eprintln!("cbf array run: stopped ({ending:?})");
            Ok(())
        }
    }
}

pub fn status(args: StatusArgs) -> Result<(), CliError> {
    let seconds = |flag, v: f64, zero_ok| {
        if v > MAX_STATUS_SECONDS {
            return Err(CliError::flag(
                flag,
                format!("{v} is over {MAX_STATUS_SECONDS} s"),
            ));
        }
        Ok(check_seconds(flag, v, zero_ok)?)
    };
    let interval: Duration = seconds("--interval", args.interval, true)?;
    let timeout: Duration = seconds("--timeout", args.timeout, false)?;
    let targets = match (&args.endpoints, &args.config) {
        (Some(list), _) => {
            array::status::parse_endpoints(list).map_err(|e| CliError::flag("--endpoints", e))?
        }
        (None, Some(config)) if args.local => array::status::targets(&planned_local(config)?),
        (None, Some(config)) => array::status::targets(&array::plan_file(config)?),
        (None, None) => return Err(CliError::Run("give CONFIG or --endpoints".into())),
    };
    let rows = array::status::status(&targets, interval, timeout);
    if args.json {
        let text = serde_json::to_string_pretty(&rows).map_err(|e| CliError::Run(e.to_string()))?;
        println!("{text}");
    } else {
        print!("{}", columns(&array::status::table(&rows)));
    }
    let unreachable: Vec<&str> = rows
        .iter()
        .filter(|r| r.katcp_error.is_some() && r.metrics_error.is_some())
        .map(|r| r.name.as_str())
        .collect();
    if unreachable.is_empty() {
        Ok(())
    } else {
        Err(CliError::Run(format!(
            "{} of {} engines unreachable: {}",
            unreachable.len(),
            rows.len(),
            unreachable.join(", ")
        )))
    }
}
