//! `cbf affinity`: this host's (or an `lstopo --of xml` export's) NUMA nodes, cores, GPUs and
//! NICs, and where each engine should run with the exact flags for it.

use std::path::PathBuf;

use clap::Args;

use super::CliError;
use crate::affinity::plan::{place, EngineKind, Request};
use crate::affinity::report;

/// Most engines of one kind `--engines` may ask for (each needs at least three cores).
pub const MAX_ENGINES: usize = 1024;
/// Most receive threads per engine.
pub const MAX_RECV_THREADS: usize = 64;

#[derive(Debug, Clone, Args)]
pub struct AffinityArgs {
    /// Read the topology from an hwloc XML export (`lstopo --of xml FILE`) instead of this
    /// host.
    #[arg(long, value_name = "FILE.xml")]
    pub topology: Option<PathBuf>,
    /// Engines to place: `fengine=N,xbengine=M` [default: one F-engine per GPU, or one].
    #[arg(long)]
    pub engines: Option<String>,
    /// Receive threads (so receive cores) per engine.
    #[arg(long, default_value_t = 1)]
    pub recv_threads: usize,
    /// Print JSON (the host model, each engine's place and flags, the warnings).
    #[arg(long)]
    pub json: bool,
}

/// `fengine=N,xbengine=M` (either may be left out; each at most [`MAX_ENGINES`]).
fn parse_engines(text: &str) -> Result<Vec<(EngineKind, usize)>, String> {
    let mut out: Vec<(EngineKind, usize)> = Vec::new();
    for part in text.split(',') {
        let (k, n) = part
            .split_once('=')
            .ok_or_else(|| format!("{part:?} is not KIND=COUNT"))?;
        let kind = match k.trim() {
            "fengine" => EngineKind::Fengine,
            "xbengine" => EngineKind::Xbengine,
            other => return Err(format!("{other:?} is not fengine or xbengine")),
        };
        let n: usize = n
            .trim()
            .parse()
            .ok()
            .filter(|&n| n <= MAX_ENGINES)
            .ok_or_else(|| format!("{n:?} is not a count from 0 to {MAX_ENGINES}"))?;
        if out.iter().any(|(seen, _)| *seen == kind) {
            return Err(format!("{} given twice", kind.as_str()));
        }
        out.push((kind, n));
    }
    Ok(out)
}

pub fn run(args: AffinityArgs) -> Result<(), CliError> {
    if args.recv_threads == 0 || args.recv_threads > MAX_RECV_THREADS {
        return Err(CliError::flag(
            "--recv-threads",
            format!("must be 1 to {MAX_RECV_THREADS}"),
        ));
    }
    let engines = args
        .engines
        .as_deref()
        .map(parse_engines)
        .transpose()
        .map_err(|e| CliError::flag("--engines", e))?;
    let host = load(args.topology.as_deref())?;
    let engines = engines.unwrap_or_else(|| vec![(EngineKind::Fengine, host.gpus.len().max(1))]);
    let placement = place(
        &host,
        &Request {
            engines,
            recv_threads: args.recv_threads,
        },
    );
    if args.json {
        println!("{}", report::json(&host, &placement));
    } else {
        print!("{}", report::text(&host, &placement));
    }
    Ok(())
}

#[cfg(feature = "hwloc")]
fn load(xml: Option<&std::path::Path>) -> Result<crate::affinity::host::Host, CliError> {
    crate::affinity::hwloc::load(xml).map_err(|e| CliError::flag("--topology", e))
}

#[cfg(not(feature = "hwloc"))]
fn load(_: Option<&std::path::Path>) -> Result<crate::affinity::host::Host, CliError> {
    Err(CliError::Run(
        "cbf was built without the `hwloc` feature (--no-default-features): it cannot read \
         a topology"
            .into(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engine_lists() {
        assert_eq!(
            parse_engines("fengine=2, xbengine=4"),
            Ok(vec![(EngineKind::Fengine, 2), (EngineKind::Xbengine, 4)])
        );
        for bad in [
            "fengine",
            "dsim=1",
            "fengine=x",
            "fengine=1,fengine=2",
            "fengine=1025",
        ] {
            assert!(parse_engines(bad).is_err(), "{bad}");
        }
    }
}
