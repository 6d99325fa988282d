//! dsim's katcp requests (katgpucbf dsim, facts §1.6: `?signals spec [period]`, `?time`) and
//! sensors (facts §1.7: saving them reproduces the output exactly). A new signal is rendered
//! on the katcp thread and handed to the send loop, which answers with the first timestamp
//! sent with it.

use std::sync::{Arc, Mutex, TryLockError};
use std::time::Duration;

use crossbeam_channel::Sender;

use super::dsim::{DigitiserConfig, DigitiserHeaps};
use super::dsim_config::{check_period, DsimPlan};
use super::signal;
use crate::control::katcp::{Handler, Sensors, Status};
use crate::engine::unix_now;

/// How long `?signals` waits for the send loop to take the new pattern.
const CHANGE_TIMEOUT: Duration = Duration::from_secs(30);

/// A new pattern from `?signals`, and where to report the timestamp it starts at.
pub struct SignalChange {
    pub heaps: Arc<DigitiserHeaps>,
    pub started: Sender<u64>,
    /// Sets the `signals`, `signals-orig` and `period` sensors; the send loop calls it while
    /// it holds the schedule it switched, so no heap with the new pattern is claimed before
    /// the sensors say so.
    pub announce: Box<dyn FnOnce() + Send>,
}

/// dsim's katcp handler.
pub struct DsimControl {
    plan: DsimPlan,
    sensors: Arc<Sensors>,
    changes: Sender<SignalChange>,
    /// Held while a `?signals` pattern renders and until the sender takes it: one render at a
    /// time (each may use every core and 2 × `--max-period` samples per pol of memory), so
    /// that 32 clients cannot render 32 patterns at once. A second request fails at once.
    pub(crate) render: Mutex<()>,
}

impl DsimControl {
    /// Register the sensors that describe the output.
    pub fn new(
        plan: &DsimPlan,
        signals_orig: &str,
        sensors: Arc<Sensors>,
        changes: Sender<SignalChange>,
    ) -> DsimControl {
        let c = &plan.config;
        let canonical: String = plan.signals.iter().map(ToString::to_string).collect();
        sensors.add(
            "signals",
            "Signal program, canonical (with every seed)",
            "",
            "string",
            canonical,
        );
        sensors.add(
            "signals-orig",
            "Signal program as given",
            "",
            "string",
            signals_orig,
        );
        sensors.add(
            "period",
            "Samples in the replayed pattern",
            "samples",
            "integer",
            c.period,
        );
        sensors.add(
            "max-period",
            "Largest period ?signals accepts",
            "samples",
            "integer",
            plan.max_period,
        );
        sensors.add(
            "dither-seed",
            "Seed of the LSB dither",
            "",
            "integer",
            c.dither_seed,
        );
        sensors.add(
            "adc-sample-rate",
            "ADC sample rate",
            "Hz",
            "float",
            c.adc_sample_rate,
        );
        sensors.add(
            "sample-bits",
            "Bits per sample",
            "",
            "integer",
            c.sample_bits,
        );
        sensors.add(
            "sync-time",
            "UNIX time of timestamp 0",
            "s",
            "float",
            plan.sync_time,
        );
        DsimControl {
            plan: plan.clone(),
            sensors,
            changes,
            render: Mutex::new(()),
        }
    }

    fn signals(&self, args: &[String]) -> Result<Vec<String>, String> {
        let (text, period) = match args {
            [t] => (t, self.plan.config.period),
            [t, p] => (
                t,
                p.parse::<usize>()
                    .map_err(|_| format!("period {p:?} is not an integer"))?,
            ),
            _ => return Err("usage: ?signals spec [period]".into()),
        };
        check_period(period, self.plan.config.heap_samples, self.plan.max_period)?;
        let signals = signal::parse(text, self.plan.dests.len(), &mut rand::random::<u64>)
            .map_err(|e| e.to_string())?;
        let config = DigitiserConfig {
            period,
            ..self.plan.config.clone()
        };
        let _rendering = match self.render.try_lock() {
            Ok(guard) => guard,
            Err(TryLockError::WouldBlock) => {
                return Err("another ?signals is being rendered; try again".into())
            }
            Err(TryLockError::Poisoned(e)) => e.into_inner(),
        };
        // try_new bounds the render cost (nodes × samples) before any work is done.
        let heaps = Arc::new(DigitiserHeaps::try_new(config, &signals).map_err(|e| e.to_string())?);
        let (tx, rx) = crossbeam_channel::bounded(1);
        let sensors = Arc::clone(&self.sensors);
        let values = [
            (
                "signals",
                signals.iter().map(ToString::to_string).collect::<String>(),
            ),
            ("signals-orig", text.clone()),
            ("period", period.to_string()),
        ];
        let announce = Box::new(move || sensors.set_many(&values, Status::Nominal));
        self.changes
            .send(SignalChange {
                heaps,
                started: tx,
                announce,
            })
            .map_err(|_| "dsim is shutting down".to_string())?;
        let ts = rx
            .recv_timeout(CHANGE_TIMEOUT)
            .map_err(|_| "the sender did not take the new signal".to_string())?;
        Ok(vec![ts.to_string()])
    }
}

impl Handler for DsimControl {
    fn requests(&self) -> Vec<(&'static str, &'static str)> {
        vec![
            ("signals", "Change the signals: ?signals spec [period]; replies with the first timestamp sent with them"),
            ("time", "The current UNIX time"),
        ]
    }

    fn handle(&self, name: &str, args: &[String]) -> Option<Result<Vec<String>, String>> {
        match name {
            "signals" => Some(self.signals(args)),
            "time" => Some(Ok(vec![format!("{:.6}", unix_now())])),
            _ => None,
        }
    }
}
