//! `cbf array plan CONFIG [--local] [--json]` and `cbf array render --systemd DIR |
//! --kubernetes DIR CONFIG`: the description → [`crate::array::plan`] → a table, JSON, or
//! files; `run --local` and `status` are in [`super::array_run`]. Before anything is printed,
//! written or started, every generated command line goes through cbf's own parser and the
//! engine's validator, so a plan never holds a command line its engine refuses.

use std::path::PathBuf;

use clap::{ArgGroup, Args, Parser, Subcommand};

use super::{Cli, CliError, Command};
use crate::array::plan::LinkLoad;
use crate::array::{self, ArrayError, Plan};

#[derive(Debug, Args)]
pub struct ArrayArgs {
    #[command(subcommand)]
    pub command: ArrayCommand,
}

#[derive(Debug, Subcommand)]
pub enum ArrayCommand {
    /// Plan the array: every engine's node, GPU, NIC, cores, ports, streams and command line,
    /// checked against the NICs, PCIe links and cores.
    Plan {
        /// The array description (TOML, or YAML for a .yaml/.yml file; see examples/).
        config: PathBuf,
        /// Print the plan as JSON.
        #[arg(long)]
        json: bool,
        /// The plan of `cbf array run --local`: every engine on this host over loopback.
        #[arg(long)]
        local: bool,
    },
    /// Write the plan as systemd units and/or Kubernetes manifests, one directory per node.
    Render(RenderArgs),
    /// Run a small array (at most 16 engines) as processes on this host over loopback, from
    /// the plan of `plan --local`, with a dsim per antenna; a launcher for tests and demos.
    Run(super::array_run::RunArgs),
    /// Read every engine's sensors (katcp) and counters (Prometheus) and print one table.
    Status(super::array_run::StatusArgs),
}

#[derive(Debug, Args)]
#[command(group(ArgGroup::new("target").required(true).multiple(true).args(["systemd", "kubernetes"])))]
pub struct RenderArgs {
    /// Write DIR/<node>/cbf-<array>-<engine>.service and DIR/<node>/cbf-<array>.target.
    #[arg(long, value_name = "DIR")]
    pub systemd: Option<PathBuf>,
    /// Write DIR/<node>/<engine>.yaml (ConfigMap and StatefulSet) and DIR/service.yaml.
    #[arg(long, value_name = "DIR")]
    pub kubernetes: Option<PathBuf>,
    /// The array description (TOML, or YAML for a .yaml/.yml file; see examples/).
    pub config: PathBuf,
}

impl From<ArrayError> for CliError {
    fn from(e: ArrayError) -> Self {
        CliError::Run(e.to_string())
    }
}

pub fn run(args: ArrayArgs) -> Result<(), CliError> {
    match args.command {
        ArrayCommand::Plan {
            config,
            json,
            local,
        } => {
            let plan = if local {
                super::array_run::planned_local(&config)?
            } else {
                planned(&config)?
            };
            if json {
                let text = serde_json::to_string_pretty(&plan)
                    .map_err(|e| CliError::Run(e.to_string()))?;
                println!("{text}");
            } else {
                print!("{}", table(&plan));
            }
        }
        ArrayCommand::Render(r) => {
            let plan = planned(&r.config)?;
            if let Some(dir) = &r.systemd {
                let files = array::systemd::write(&plan, dir)?;
                println!("systemd: {} files under {}", files.len(), dir.display());
            }
            if let Some(dir) = &r.kubernetes {
                let files = array::kubernetes::write(&plan, dir)?;
                println!("kubernetes: {} files under {}", files.len(), dir.display());
            }
        }
        ArrayCommand::Run(r) => super::array_run::run(r)?,
        ArrayCommand::Status(s) => super::array_run::status(s)?,
    }
    Ok(())
}

/// The plan of the description at `path`, with every command line checked.
fn planned(path: &std::path::Path) -> Result<Plan, CliError> {
    let plan = array::plan_file(path)?;
    check_command_lines(&plan)?;
    Ok(plan)
}

/// Parse each engine's command line with cbf's parser and validate it as the engine would at
/// start-up (a dsim's `--affinity` cores are the planned node's, not this host's, so they are
/// not looked up here).
pub fn check_command_lines(plan: &Plan) -> Result<(), CliError> {
    for e in &plan.engines {
        let refused = |m: String| {
            CliError::Run(format!(
                "engine {}: cbf {} refuses the planned command line: {m}",
                e.name,
                e.kind.as_str()
            ))
        };
        let cli = Cli::try_parse_from(&e.argv).map_err(|err| refused(err.to_string()))?;
        let checked = match cli.command {
            Command::Fengine(a) => a.config().and_then(|c| Ok(c.validate().map(drop)?)),
            Command::Xbengine(a) => a.config().and_then(|c| Ok(c.validate().map(drop)?)),
            Command::Dsim(a) => a.config().and_then(|mut c| {
                c.affinity.clear();
                Ok(c.validate().map(drop)?)
            }),
            other => return Err(refused(format!("{other:?} is not an engine"))),
        };
        checked.map_err(|err| refused(err.to_string()))?;
    }
    Ok(())
}

/// Cores as a Linux CPU list (`0-3,8`).
fn cpu_list(cores: &[usize]) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut i = 0;
    while i < cores.len() {
        let mut j = i;
        while j + 1 < cores.len() && cores[j + 1] == cores[j] + 1 {
            j += 1;
        }
        parts.push(if j > i {
            format!("{}-{}", cores[i], cores[j])
        } else {
            cores[i].to_string()
        });
        i = j + 1;
    }
    parts.join(",")
}

/// Rows as left-aligned columns.
pub(super) fn columns(rows: &[Vec<String>]) -> String {
    let n = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..n)
        .map(|c| {
            rows.iter()
                .map(|r| r.get(c).map_or(0, |s| s.chars().count()))
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for r in rows {
        let cells: Vec<String> = r
            .iter()
            .enumerate()
            .map(|(c, s)| format!("{s:<w$}", w = widths[c]))
            .collect();
        out.push_str(cells.join("  ").trim_end());
        out.push('\n');
    }
    out
}

fn loads(title: &str, unit: &str, links: &[LinkLoad]) -> String {
    let mut rows = vec![vec![
        "NODE".to_string(),
        title.to_string(),
        format!("CAPACITY {unit}"),
        "IN".into(),
        "OUT".into(),
        "USE".into(),
    ]];
    for l in links {
        rows.push(vec![
            l.node.clone(),
            l.link.clone(),
            format!("{:.2}", l.capacity),
            format!("{:.2}", l.rx),
            format!("{:.2}", l.tx),
            format!("{:.0}%", 100.0 * l.rx.max(l.tx) / l.capacity),
        ]);
    }
    columns(&rows)
}

/// The plan for a person: bands, one row per engine, and the loads on NICs and PCIe links.
pub fn table(plan: &Plan) -> String {
    let mut nodes: Vec<&str> = plan.engines.iter().map(|e| e.node.as_str()).collect();
    nodes.sort_unstable();
    nodes.dedup();
    let mut out = format!(
        "array {}: {} engines on {} node{}, backend {}, sync time {}\n",
        plan.array,
        plan.engines.len(),
        nodes.len(),
        if nodes.len() == 1 { "" } else { "s" },
        plan.backend.as_str(),
        plan.sync_time
    );
    for b in &plan.bands {
        out.push_str(&format!(
            "band {}: {} MHz sampled, centre {} MHz, {} channels, {} XB-engines × {} channels, {} spectra per heap, dump {} batches = {:.4} s\n  F→X {}, correlation products {}{}\n",
            b.name,
            b.adc_sample_rate / 1e6,
            b.centre_frequency / 1e6,
            b.channels,
            b.x_engines,
            b.channels_per_xengine,
            b.spectra_per_heap,
            b.heap_accumulation_threshold,
            b.dump_seconds,
            b.fx_groups,
            b.corrprod_groups,
            b.beam_groups.iter().map(|g| format!(", beam {g}")).collect::<String>(),
        ));
    }
    let mut rows = vec![[
        "ENGINE", "NODE", "GPU", "NIC", "NUMA", "CORES", "KATCP", "PROM", "FENG", "CHANNELS",
        "IN Gb/s", "OUT Gb/s", "IN", "OUT",
    ]
    .map(String::from)
    .to_vec()];
    for e in &plan.engines {
        rows.push(vec![
            e.name.clone(),
            e.node.clone(),
            e.gpu.map_or("-".into(), |g| g.to_string()),
            e.nic.clone(),
            e.numa.to_string(),
            cpu_list(&e.cores),
            e.katcp_port.to_string(),
            e.prometheus_port.to_string(),
            e.feng_id.map_or("-".into(), |f| f.to_string()),
            e.channels
                .map_or("-".into(), |(a, b)| format!("{a}-{}", b - 1)),
            format!("{:.2}", e.rx_gbps),
            format!("{:.2}", e.tx_gbps),
            if e.inputs.is_empty() {
                "-".into()
            } else {
                e.inputs.join(" ")
            },
            e.outputs.join(" "),
        ]);
    }
    out.push('\n');
    out.push_str(&columns(&rows));
    if !plan.nics.is_empty() {
        out.push('\n');
        out.push_str(&loads("NIC", "Gb/s", &plan.nics));
    }
    if !plan.gpus.is_empty() {
        out.push('\n');
        out.push_str(&loads("GPU", "GB/s", &plan.gpus));
    }
    out.push_str("\nCommand lines: cbf array plan --json (each engine's argv and env).\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_are_compact() {
        assert_eq!(cpu_list(&[0, 1, 2, 3, 8, 10, 11]), "0-3,8,10-11");
        assert_eq!(cpu_list(&[5]), "5");
        assert_eq!(cpu_list(&[]), "");
    }
}
