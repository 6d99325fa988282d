//! The engines' thread-pinning flags, with katgpucbf's names and meanings (its `main.py`
//! `add_recv_arguments`/`add_send_arguments`): `--recv-affinity` a comma list with one core per
//! receive thread (its length is the thread count, -1 leaves a thread unbound),
//! `--send-affinity` the core of the output-handling threads, and `--main-affinity` (dsim's and
//! fsim's name: katgpucbf runs fgpu/xbgpu under `taskset` instead) the processing thread's.
//! cbf also takes lists where katgpucbf takes one core: `--send-affinity` cores are dealt to the
//! send threads (cbf has one per output), `--main-affinity` is a set.

use clap::Args;

use super::CliError;
use crate::engine::affinity::{parse_core_list, EngineAffinity};

#[derive(Debug, Clone, Default, Args)]
pub struct Pinning {
    /// Core(s) for the receive threads, one per thread, -1 for one left unbound [not bound].
    /// The list's length is the number of receive threads (katgpucbf's meaning).
    #[arg(long, value_name = "CORE,...", allow_hyphen_values = true)]
    pub recv_affinity: Option<String>,
    /// Core for the output-handling (send) threads; a list is dealt to them in output order
    /// [not bound].
    #[arg(long, value_name = "CORE[,...]", allow_hyphen_values = true)]
    pub send_affinity: Option<String>,
    /// Core(s) for the processing thread that drives the GPU (with --backend cpu, also for the
    /// workers it starts) [not bound].
    #[arg(long, value_name = "CORE[,...]", allow_hyphen_values = true)]
    pub main_affinity: Option<String>,
}

impl Pinning {
    /// The engine's thread cores and its receive thread count: `--recv-affinity`'s length, or
    /// `--recv-threads` (1 when neither is given). Both given and different is refused.
    pub fn affinity(
        &self,
        recv_threads: Option<usize>,
    ) -> Result<(EngineAffinity, usize), CliError> {
        let parse = |flag: &'static str, text: &Option<String>| {
            text.as_deref()
                .map_or(Ok(Vec::new()), parse_core_list)
                .map_err(|e| CliError::flag(flag, e))
        };
        let recv = parse("--recv-affinity", &self.recv_affinity)?;
        // -1 alone is katgpucbf's default: not bound.
        let bound =
            |cores: Vec<Option<usize>>| -> Vec<usize> { cores.into_iter().flatten().collect() };
        let send = parse("--send-affinity", &self.send_affinity)?;
        let main = parse("--main-affinity", &self.main_affinity)?;
        for (flag, cores) in [("--send-affinity", &send), ("--main-affinity", &main)] {
            if cores.len() > 1 && cores.contains(&None) {
                return Err(CliError::flag(flag, "-1 (not bound) stands alone"));
            }
        }
        let threads = match (recv_threads, recv.len()) {
            (Some(t), n) if n > 0 && t != n => {
                return Err(CliError::flag(
                    "--recv-affinity",
                    format!(
                        "{n} entries for --recv-threads {t}: katgpucbf starts one receive \
                         thread per entry (give -1 for a thread left unbound, or leave out \
                         --recv-threads)"
                    ),
                ))
            }
            (_, n) if n > 0 => n,
            (t, _) => t.unwrap_or(1),
        };
        let recv = if recv.iter().all(Option::is_none) {
            Vec::new()
        } else {
            recv
        };
        Ok((
            EngineAffinity {
                recv,
                send: bound(send),
                main: bound(main),
            },
            threads,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pinning(recv: Option<&str>, send: Option<&str>, main: Option<&str>) -> Pinning {
        Pinning {
            recv_affinity: recv.map(String::from),
            send_affinity: send.map(String::from),
            main_affinity: main.map(String::from),
        }
    }

    #[test]
    fn katgpucbf_meanings() {
        // The list's length is the thread count; -1 leaves a thread unbound.
        let (a, t) = pinning(Some("0,-1,5"), Some("3"), Some("4"))
            .affinity(None)
            .unwrap();
        assert_eq!(t, 3);
        assert_eq!(a.recv, [Some(0), None, Some(5)]);
        assert_eq!((a.recv_core(1), a.recv_core(2)), (None, Some(5)));
        // One send core binds every send thread.
        assert_eq!((a.send_core(0), a.send_core(7)), (Some(3), Some(3)));
        assert_eq!(a.main, [4]);
        // Defaults (-1 everywhere) bind nothing.
        let (a, t) = pinning(Some("-1"), Some("-1"), Some("-1"))
            .affinity(None)
            .unwrap();
        assert_eq!((a, t), (EngineAffinity::default(), 1));
        let (a, t) = pinning(None, Some("1,2"), None).affinity(Some(4)).unwrap();
        assert_eq!(t, 4);
        assert_eq!(
            (a.send_core(0), a.send_core(1), a.send_core(2)),
            (Some(1), Some(2), Some(1))
        );
        assert_eq!(
            pinning(Some("2,3"), None, None)
                .affinity(Some(2))
                .unwrap()
                .1,
            2
        );
    }

    #[test]
    fn bad_lists_are_refused_by_flag() {
        let flag = |p: Pinning, threads| match p.affinity(threads) {
            Err(CliError::Flag { flag, .. }) => flag,
            other => panic!("{other:?}"),
        };
        assert_eq!(
            flag(pinning(Some("0,1"), None, None), Some(3)),
            "--recv-affinity"
        );
        assert_eq!(
            flag(pinning(Some("0,x"), None, None), None),
            "--recv-affinity"
        );
        assert_eq!(
            flag(pinning(Some("-2"), None, None), None),
            "--recv-affinity"
        );
        assert_eq!(flag(pinning(Some(""), None, None), None), "--recv-affinity");
        assert_eq!(
            flag(pinning(None, Some("1024"), None), None),
            "--send-affinity"
        );
        assert_eq!(
            flag(pinning(None, Some("1,-1"), None), None),
            "--send-affinity"
        );
        assert_eq!(
            flag(pinning(None, None, Some("0,,1")), None),
            "--main-affinity"
        );
        let long = vec!["0"; 1025].join(",");
        assert_eq!(
            flag(pinning(Some(&long), None, None), None),
            "--recv-affinity"
        );
    }
}
