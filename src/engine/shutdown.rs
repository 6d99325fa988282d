//! Clean shutdown on SIGINT/SIGTERM: engines and long-running commands poll a flag and print their final
//! counters before exiting.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// A flag raised by SIGINT or SIGTERM (or by the program itself).
#[derive(Debug, Clone)]
pub struct Shutdown(Arc<AtomicBool>);

impl Shutdown {
    /// Install the handlers. Failure to install is reported, not fatal: the process then
    /// simply dies on the signal as it would by default.
    pub fn install() -> Shutdown {
        let flag = Arc::new(AtomicBool::new(false));
        for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
            if let Err(e) = signal_hook::flag::register(sig, Arc::clone(&flag)) {
                tracing::warn!("cannot install handler for signal {sig}: {e}");
            }
        }
        Shutdown(flag)
    }

    /// A flag not tied to signals (for in-process use such as `cbf demo` and tests).
    pub fn manual() -> Shutdown {
        Shutdown(Arc::new(AtomicBool::new(false)))
    }

    pub fn requested(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }

    pub fn request(&self) {
        self.0.store(true, Ordering::Relaxed);
    }

    /// The flag itself, for layers that know nothing of engines (a send stream's
    /// `set_hurry`).
    pub fn flag(&self) -> Arc<AtomicBool> {
        Arc::clone(&self.0)
    }
}

/// Ask a child process to stop cleanly (SIGTERM), as an operator's `kill` or systemd would;
/// nothing when it has already exited.
pub fn terminate(child: &mut std::process::Child) -> std::io::Result<()> {
    if child.try_wait()?.is_some() {
        return Ok(());
    }
    let pid = libc::pid_t::try_from(child.id()).map_err(std::io::Error::other)?;
    // SAFETY: kill(2) takes a plain pid and signal number and touches no memory of ours. The
    // child has not been reaped (try_wait just said so, and only wait/try_wait reap it), so
    // its pid is still ours, at worst a zombie, never a recycled process's.
    let rc = unsafe { libc::kill(pid, libc::SIGTERM) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}
