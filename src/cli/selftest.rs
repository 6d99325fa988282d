//! `cbf selftest --gpu`: run every CUDA kernel against its CPU oracle on this machine's GPU
//! and print a table; the exit status is non-zero if any check failed (or there is no GPU).
//! Families the device cannot run at all (vkgdr without a BAR window) are listed as such,
//! neither passed nor failed.

use clap::Args;

use super::CliError;
use crate::gpu::Gpu;
use crate::selftest;

#[derive(Debug, Clone, Args)]
pub struct SelftestArgs {
    /// Check the CUDA backend (the only self-test there is: the CPU oracle is checked by the
    /// test suite against independent references).
    #[arg(long)]
    pub gpu: bool,
    /// CUDA device ordinal.
    #[arg(long, default_value_t = 0)]
    pub device: usize,
    /// Seed of the random inputs (default: drawn from the clock, and printed).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Run only these families (comma-separated, e.g. `vkgdr,peerdirect`), to look into one
    /// quickly; the report then says it is partial.
    #[arg(long, value_delimiter = ',')]
    pub family: Vec<String>,
}

pub fn run(args: SelftestArgs) -> Result<(), CliError> {
    if !args.gpu {
        return Err(CliError::flag(
            "--gpu",
            "say which backend to test: --gpu is the only self-test",
        ));
    }
    let known = selftest::family_names();
    if let Some(bad) = args.family.iter().find(|f| !known.contains(&f.as_str())) {
        return Err(CliError::flag(
            "--family",
            format!("no family {bad:?}; the families are {}", known.join(", ")),
        ));
    }
    let gpu = Gpu::open(args.device).map_err(|e| CliError::Run(format!("selftest --gpu: {e}")))?;
    let seed = args.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64)
    });
    println!("selftest on {} ({}), seed {seed}", gpu.name, gpu.arch);
    let selftest::Report {
        checks,
        unavailable,
    } = selftest::run(&gpu, seed, &args.family);
    println!(
        "{:<48} {:>10} {:>8}  {:<4}  note",
        "check", "error", "limit", ""
    );
    let mut failed = 0;
    for c in &checks {
        println!(
            "{:<48} {:>10.3e} {:>8.1e}  {:<4}  {}",
            c.name,
            c.measured,
            c.limit,
            if c.pass { "ok" } else { "FAIL" },
            c.note
        );
        failed += usize::from(!c.pass);
    }
    for (family, why) in &unavailable {
        println!("{family}: not available on this device, not run: {why}");
    }
    let not_run = if unavailable.is_empty() {
        String::new()
    } else {
        let names: Vec<&str> = unavailable.iter().map(|(f, _)| *f).collect();
        format!("; not available on this device: {}", names.join(", "))
    };
    if failed > 0 {
        return Err(CliError::Run(format!(
            "selftest: {failed} of {} checks failed{not_run}",
            checks.len()
        )));
    }
    let partial = if args.family.is_empty() {
        String::new()
    } else {
        format!(" (partial: only {})", args.family.join(", "))
    };
    println!(
        "selftest: all {} checks passed{not_run}{partial}",
        checks.len()
    );
    Ok(())
}
