//! The DDC kernel's mapping tuned per device and kept in a cache file (issue 16; seed 002
//! §Performance tuning: work-group, subgroup and coarsening parameters). The fastest mapping
//! depends on the device, the compiler and the filter's shape: on the H100 the fixed default
//! ([`DdcTuning::default_for`]) ran at 226 GS/s where the grid's best ran at 262 (10-bit, S = 8,
//! bench/ddc-bench-2026-11-26-v1.txt). So the first start on a device times a few candidates
//! from the grid `cbf-ddc-bench` sweeps and keeps the winner in a cache file keyed by device
//! name, compute capability, driver (CUDA version and kernel-module release), NVRTC version,
//! kernel source and DDC shape ([`TuningKey`]); later starts read it back.
//!
//! Bounds: at most [`MAX_CANDIDATES`] candidates, each compiled once and timed over
//! [`TUNE_SAMPLES`] samples per polarisation for a few launches (tens of µs each on an H100);
//! the cache file is read up to [`MAX_CACHE_BYTES`] and holds at most [`MAX_ENTRIES`] entries;
//! an entry that is not a valid plan for its shape is ignored. A cache that cannot be read is
//! ignored and one that cannot be written is warned about, never a failure: the engine then
//! tunes again at its next start.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

use cudarc::driver::sys::CUevent_flags;

use super::compile::{nvrtc_version, Kernel};
use super::ddc::{Ddc, DdcPlan, DdcRun, DdcShape, DdcTuning};
use super::{Gpu, GpuError};

/// Most mappings timed at start-up (each costs an NVRTC compile).
pub const MAX_CANDIDATES: usize = 8;
/// Digitiser samples per polarisation each candidate filters per launch.
pub const TUNE_SAMPLES: usize = 1 << 22;
/// Timed launches per candidate (after one warm-up); the median counts.
const TUNE_REPS: usize = 5;
/// Largest cache file read.
pub const MAX_CACHE_BYTES: u64 = 1 << 20;
/// Most entries kept (devices × drivers × shapes).
pub const MAX_ENTRIES: usize = 1024;
/// Shared memory a candidate may use: what every device gives a block without opting in.
const CANDIDATE_SHARED: usize = 48 * 1024;

/// The mappings timed for `shape`: the default first, then the grid's with 4 and then 2 outputs
/// per thread (8 never won on the H100 and costs registers), blocks of at most 256 threads, no
/// more phases in parallel than the filter has, and shared memory within
/// [`CANDIDATE_SHARED`]; [`MAX_CANDIDATES`] in all.
pub fn candidates(shape: DdcShape) -> Vec<DdcTuning> {
    let mut v = vec![DdcTuning::default_for(shape)];
    let mut grid = DdcTuning::grid();
    grid.retain(|t| t.coarsen <= 4);
    grid.sort_by_key(|t| std::cmp::Reverse(t.coarsen));
    for t in grid {
        if v.len() == MAX_CANDIDATES {
            break;
        }
        let fits = t.groups * t.subgroup <= 256
            && t.subgroup <= shape.subsampling
            && DdcPlan::new(shape, t).is_ok_and(|p| p.shared_bytes() <= CANDIDATE_SHARED);
        if fits && !v.contains(&t) {
            v.push(t);
        }
    }
    v
}

/// Where the NVIDIA kernel module states its release.
pub const MODULE_VERSION_FILE: &str = "/proc/driver/nvidia/version";

/// The kernel module's release from the text of [`MODULE_VERSION_FILE`], whose first line
/// reads `NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.159.04  <build date>` (or `… Open
/// Kernel Module for x86_64  580.159.04  …` for the open modules): the first word after
/// "Module" (and "for <arch>") that starts with a digit.
pub fn module_version(text: &str) -> Option<String> {
    let line = text.lines().find(|l| l.starts_with("NVRM version:"))?;
    let (_, rest) = line.split_once("Module")?;
    rest.split_whitespace()
        .find(|w| w.starts_with(|c: char| c.is_ascii_digit()))
        .map(str::to_string)
}

/// What a tuning was measured on and for: the cache's key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TuningKey {
    pub device: String,
    /// Compute capability (`sm_XY`).
    pub arch: String,
    /// `cuDriverGetVersion`: the CUDA API the driver offers (13000), the same across its
    /// releases.
    pub driver: i32,
    /// The kernel module's release (`580.159.04`, from [`MODULE_VERSION_FILE`]), which a driver
    /// update changes while `driver` stays; "unknown" where the file cannot be read.
    pub module: String,
    pub nvrtc: (i32, i32),
    /// [`Kernel::fingerprint`] of the DDC kernel's source.
    pub kernel: u32,
    pub shape: DdcShape,
}

impl TuningKey {
    pub fn new(gpu: &Gpu, shape: DdcShape) -> Result<TuningKey, GpuError> {
        Ok(TuningKey {
            device: gpu.name.clone(),
            arch: gpu.arch.clone(),
            driver: gpu.driver_version()?,
            module: std::fs::read_to_string(MODULE_VERSION_FILE)
                .ok()
                .and_then(|t| module_version(&t))
                .unwrap_or_else(|| "unknown".into()),
            nvrtc: nvrtc_version().unwrap_or((0, 0)),
            kernel: Kernel::Ddc.fingerprint(),
            shape,
        })
    }

    /// The key as the cache file spells it.
    pub fn text(&self) -> String {
        let s = self.shape;
        format!(
            "{}; {}; driver {} module {}; nvrtc {}.{}; ddc.cu {:08x}; {}-bit S {} taps {}",
            self.device,
            self.arch,
            self.driver,
            self.module,
            self.nvrtc.0,
            self.nvrtc.1,
            self.kernel,
            s.sample_bits,
            s.subsampling,
            s.taps
        )
    }
}

/// A timed search: each candidate's median seconds per launch (`None`: it did not compile
/// without spills, or did not launch), and the fastest.
#[derive(Debug, Clone)]
pub struct Search {
    pub timings: Vec<(DdcTuning, Option<f64>)>,
    pub best: Option<DdcTuning>,
}

/// Time every candidate for `shape` on the compute stream ([`time_mapping`] over
/// [`TUNE_SAMPLES`] samples).
pub fn search(gpu: &Gpu, shape: DdcShape) -> Result<Search, GpuError> {
    let n_in = TUNE_SAMPLES.max(4 * shape.taps);
    let mut timings = Vec::new();
    for t in candidates(shape) {
        match time_mapping(gpu, shape, t, n_in, TUNE_REPS) {
            Ok(seconds) => timings.push((t, Some(seconds))),
            Err(e) => {
                tracing::debug!(?t, error = %e, "DDC mapping left out of the search");
                timings.push((t, None));
            }
        }
    }
    let best = timings
        .iter()
        .filter_map(|&(t, s)| s.map(|s| (t, s)))
        .min_by(|a, b| a.1.total_cmp(&b.1))
        .map(|(t, _)| t);
    Ok(Search { timings, best })
}

/// The median seconds of one launch of the DDC with mapping `tuning` over `n_in` samples of
/// each polarisation, after one unmeasured launch: arbitrary samples and taps, as the kernel's
/// speed depends on neither. An error if the mapping does not compile without spills or does
/// not launch. (The start-up search and `cbf-ddc-bench` both time through this.)
pub fn time_mapping(
    gpu: &Gpu,
    shape: DdcShape,
    tuning: DdcTuning,
    n_in: usize,
    reps: usize,
) -> Result<f64, GpuError> {
    let plan = DdcPlan::new(shape, tuning)?;
    let op = Ddc::new(gpu, plan)?;
    let pol_stride = (n_in * shape.sample_bits as usize).div_ceil(8) + 16;
    let bytes: Vec<u8> = (0..2 * pol_stride)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[3])
        .collect();
    let st = &gpu.compute;
    let input = st.clone_htod(&bytes)?;
    let n_out = (n_in - shape.taps) / shape.subsampling + 1;
    let mut out = st.alloc_zeros::<f32>(4 * n_out)?;
    let h: Vec<f32> = (0..shape.taps)
        .map(|k| ((k * 7919) % 1000) as f32 * 1e-4 - 0.05)
        .collect();
    let run = DdcRun {
        pols: 2,
        n_in,
        pol_stride,
        n_out,
        out_stride: n_out,
        t_first: [1 << 40, 1 << 40],
        step: 0x1234_5678,
    };
    let z = st.clone_htod(&plan.mixed_weights(&h, run.step))?;
    let timing = Some(CUevent_flags::CU_EVENT_DEFAULT);
    let mut v = Vec::with_capacity(reps);
    for rep in 0..=reps {
        let (a, b) = (gpu.ctx.new_event(timing)?, gpu.ctx.new_event(timing)?);
        a.record(st)?;
        op.launch(st, &mut out, &input, &z, run)?;
        b.record(st)?;
        b.synchronize()?;
        if rep > 0 {
            v.push(f64::from(a.elapsed_ms(&b)?) * 1e-3);
        }
    }
    v.sort_by(f64::total_cmp);
    Ok(v[v.len() / 2])
}

/// The cache file's contents: key text → mapping.
type Entries = BTreeMap<String, DdcTuning>;

/// Parse a cache file (JSON: an object of key text → mapping); entries that are not a valid
/// plan are dropped later, by [`TuningCache::get`].
fn parse(text: &str) -> Result<Entries, String> {
    let entries: Entries = serde_json::from_str(text).map_err(|e| e.to_string())?;
    if entries.len() > MAX_ENTRIES {
        return Err(format!("{} entries (at most {MAX_ENTRIES})", entries.len()));
    }
    Ok(entries)
}

/// Tuned mappings by [`TuningKey`], backed by a file (or only by memory).
#[derive(Debug, Default)]
pub struct TuningCache {
    /// Where the cache is stored (`None`: memory only, or not writable).
    path: Option<PathBuf>,
    entries: Entries,
}

impl TuningCache {
    /// A cache in memory only: each shape is tuned once per process.
    pub fn in_memory() -> TuningCache {
        TuningCache::default()
    }

    /// `$XDG_CACHE_HOME/cbf/ddc-tuning.json`, or `$HOME/.cache/cbf/ddc-tuning.json`.
    pub fn default_path() -> Option<PathBuf> {
        let non_empty = |v: &str| std::env::var_os(v).filter(|s| !s.is_empty());
        let base = non_empty("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .or_else(|| non_empty("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
        Some(base.join("cbf").join("ddc-tuning.json"))
    }

    /// The cache stored at `path`, read now if it exists. A file that cannot be read, is
    /// larger than [`MAX_CACHE_BYTES`] or does not parse is ignored (and replaced at the next
    /// store); a place that cannot be written is warned about and the cache kept in memory.
    pub fn open(path: &Path) -> TuningCache {
        let entries = match read(path) {
            Ok(Some(text)) => parse(&text).unwrap_or_else(|e| {
                tracing::warn!(path = %path.display(), error = %e, "DDC tuning cache ignored");
                Entries::new()
            }),
            Ok(None) => Entries::new(),
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "DDC tuning cache ignored");
                Entries::new()
            }
        };
        let path = match writable(path) {
            Ok(()) => Some(path.to_path_buf()),
            Err(e) => {
                tracing::warn!(
                    path = %path.display(),
                    error = %e,
                    "DDC tuning cache not writable: mappings are tuned again at each start"
                );
                None
            }
        };
        TuningCache { path, entries }
    }

    /// Where tunings are stored, if anywhere.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// The cached mapping for `key`, if it is a valid plan for the key's shape.
    pub fn get(&self, key: &TuningKey) -> Option<DdcTuning> {
        let t = *self.entries.get(&key.text())?;
        DdcPlan::new(key.shape, t).ok().map(|_| t)
    }

    /// Remember `tuning` for `key` and store the cache (a failure to store is warned about).
    /// Past [`MAX_ENTRIES`] nothing new is kept.
    pub fn insert(&mut self, key: &TuningKey, tuning: DdcTuning) {
        if self.entries.len() >= MAX_ENTRIES && !self.entries.contains_key(&key.text()) {
            tracing::warn!("DDC tuning cache full ({MAX_ENTRIES} entries): not stored");
            return;
        }
        self.entries.insert(key.text(), tuning);
        if let Some(path) = &self.path {
            if let Err(e) = store(path, &self.entries) {
                tracing::warn!(path = %path.display(), error = %e, "DDC tuning cache not stored");
            }
        }
    }

    /// The mapping for `shape` on `gpu`: cached, or found by a timed [`search`] now and
    /// cached; the default where the search fails (not cached, so it is tried again).
    pub fn tuning(&mut self, gpu: &Gpu, shape: DdcShape) -> DdcTuning {
        let key = match TuningKey::new(gpu, shape) {
            Ok(k) => k,
            Err(e) => {
                tracing::warn!(error = %e, "DDC tuning skipped");
                return DdcTuning::default_for(shape);
            }
        };
        if let Some(t) = self.get(&key) {
            tracing::info!(?shape, tuning = ?t, "DDC mapping from the tuning cache");
            return t;
        }
        match search(gpu, shape) {
            Ok(Search {
                best: Some(t),
                timings,
            }) => {
                tracing::info!(?shape, tuning = ?t, ?timings, "DDC mapping tuned");
                self.insert(&key, t);
                t
            }
            Ok(Search { best: None, .. }) => {
                tracing::warn!(
                    ?shape,
                    "no DDC mapping ran in the search: the default is used"
                );
                DdcTuning::default_for(shape)
            }
            Err(e) => {
                tracing::warn!(?shape, error = %e, "DDC tuning failed: the default is used");
                DdcTuning::default_for(shape)
            }
        }
    }
}

/// The file's text (`None`: there is none), refused past [`MAX_CACHE_BYTES`].
fn read(path: &Path) -> Result<Option<String>, String> {
    let file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e.to_string()),
    };
    let mut text = String::new();
    file.take(MAX_CACHE_BYTES + 1)
        .read_to_string(&mut text)
        .map_err(|e| e.to_string())?;
    if text.len() as u64 > MAX_CACHE_BYTES {
        return Err(format!("larger than {MAX_CACHE_BYTES} bytes"));
    }
    Ok(Some(text))
}

/// Whether the cache can be stored at `path`: its folder exists or can be made, and a file
/// can be created beside it (the store writes a temporary file and renames it).
fn writable(path: &Path) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let probe = temporary(path);
    std::fs::write(&probe, b"")?;
    std::fs::remove_file(&probe)
}

fn temporary(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".{}.tmp", std::process::id()));
    path.with_file_name(name)
}

/// Write the entries to a temporary file and rename it over `path`, so that a reader never
/// sees half a file.
fn store(path: &Path, entries: &Entries) -> std::io::Result<()> {
    let text = serde_json::to_string_pretty(entries).map_err(std::io::Error::other)?;
    let tmp = temporary(path);
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(subsampling: usize) -> DdcShape {
        DdcShape {
            sample_bits: 10,
            subsampling,
            taps: 16 * subsampling,
        }
    }

    fn key(subsampling: usize) -> TuningKey {
        TuningKey {
            device: "NVIDIA H100 80GB HBM3".into(),
            arch: "sm_90".into(),
            driver: 13000,
            module: "580.159.04".into(),
            nvrtc: (13, 0),
            kernel: 0x1234_abcd,
            shape: shape(subsampling),
        }
    }

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("cbf-ddc-tune-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    /// Every candidate is a valid plan, the default comes first, none repeats, and the
    /// bound holds, over the subsampling factors `--narrowband` accepts.
    #[test]
    fn candidates_are_few_valid_and_distinct() {
        for s in [2, 3, 4, 8, 16, 32, 64, 128, 512] {
            let sh = shape(s);
            let c = candidates(sh);
            assert_eq!(c[0], DdcTuning::default_for(sh), "S {s}");
            assert!(c.len() <= MAX_CANDIDATES, "S {s}");
            for (i, t) in c.iter().enumerate() {
                assert!(DdcPlan::new(sh, *t).is_ok(), "S {s}: {t:?}");
                assert!(!c[..i].contains(t), "S {s}: {t:?} twice");
            }
        }
        // At S = 8 the search has a choice to make.
        assert!(candidates(shape(8)).len() > 4);
    }

    /// The module's release is read from both forms of the file's first line, and nothing is
    /// made up from a file without one.
    #[test]
    fn the_module_release_is_read_from_the_version_file() {
        let closed = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.159.04  Tue Jul 22 \
                      18:06:57 UTC 2025\nGCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n";
        assert_eq!(module_version(closed).as_deref(), Some("580.159.04"));
        let open = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.86.15  Release \
                    Build  (dvs-builder@U16-I3-B03-4-3)  Thu Jan 23 22:00:00 UTC 2025\n";
        assert_eq!(module_version(open).as_deref(), Some("570.86.15"));
        assert_eq!(module_version("GCC version: gcc 12\n"), None);
        assert_eq!(
            module_version("NVRM version: NVIDIA UNIX Kernel Module\n"),
            None
        );
    }

    /// Every part of the key tells keys apart.
    #[test]
    fn keys_differ_in_every_part() {
        let a = key(8);
        let variants = [
            TuningKey {
                device: "NVIDIA H200".into(),
                ..a.clone()
            },
            TuningKey {
                arch: "sm_89".into(),
                ..a.clone()
            },
            TuningKey {
                driver: 12080,
                ..a.clone()
            },
            TuningKey {
                module: "580.65.06".into(),
                ..a.clone()
            },
            TuningKey {
                nvrtc: (13, 1),
                ..a.clone()
            },
            TuningKey {
                kernel: 1,
                ..a.clone()
            },
            key(16),
            TuningKey {
                shape: DdcShape {
                    sample_bits: 8,
                    ..a.shape
                },
                ..a.clone()
            },
            TuningKey {
                shape: DdcShape {
                    taps: 127,
                    ..a.shape
                },
                ..a.clone()
            },
        ];
        for v in &variants {
            assert_ne!(v.text(), a.text(), "{v:?}");
        }
    }

    /// A tuning stored by one cache is read back by the next one opened on the same path, and
    /// only for its own key.
    #[test]
    fn a_stored_tuning_is_read_back() {
        let dir = scratch("roundtrip");
        let path = dir.join("nested").join("ddc-tuning.json");
        let t = DdcTuning {
            coarsen: 4,
            groups: 128,
            subgroup: 1,
        };
        let mut c = TuningCache::open(&path);
        assert_eq!(c.path(), Some(path.as_path()));
        assert_eq!(c.get(&key(8)), None);
        c.insert(&key(8), t);
        let again = TuningCache::open(&path);
        assert_eq!(again.get(&key(8)), Some(t));
        assert_eq!(again.get(&key(16)), None);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A malformed, oversized or hostile file is ignored (and replaced on the next store); an
    /// entry that is not a valid plan for its shape is not used.
    #[test]
    fn bad_files_and_entries_are_ignored() {
        let dir = scratch("bad");
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("ddc-tuning.json");
        for text in [
            "not json".to_string(),
            "[1, 2, 3]".to_string(),
            format!("{{\"{}\": {{\"coarsen\": 4}}}}", key(8).text()),
            " ".repeat(MAX_CACHE_BYTES as usize + 1),
        ] {
            std::fs::write(&path, &text).unwrap();
            let c = TuningCache::open(&path);
            assert_eq!(c.get(&key(8)), None);
            assert!(c.entries.is_empty(), "{}", &text[..text.len().min(40)]);
        }
        // Coarsening 3 is no plan; 8 groups × 256 phases is not a block.
        for (c, g, sg) in [(3, 32, 1), (4, 256, 8)] {
            let text = format!(
                "{{\"{}\": {{\"coarsen\": {c}, \"groups\": {g}, \"subgroup\": {sg}}}}}",
                key(8).text()
            );
            std::fs::write(&path, text).unwrap();
            assert_eq!(TuningCache::open(&path).get(&key(8)), None);
        }
        let mut c = TuningCache::open(&path);
        let t = DdcTuning::default_for(shape(8));
        c.insert(&key(8), t);
        assert_eq!(TuningCache::open(&path).get(&key(8)), Some(t));
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A path under a file (so no folder can be made there) leaves the cache in memory,
    /// without a failure.
    #[test]
    fn an_unwritable_path_keeps_the_cache_in_memory() {
        let dir = scratch("unwritable");
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("plain-file");
        std::fs::write(&file, b"x").unwrap();
        let path = file.join("ddc-tuning.json");
        let mut c = TuningCache::open(&path);
        assert_eq!(c.path(), None);
        let t = DdcTuning::default_for(shape(16));
        c.insert(&key(16), t);
        assert_eq!(c.get(&key(16)), Some(t));
        assert!(!path.exists());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
