//! The standard requests every katcp device answers (katcp v5, as aiokatcp servers do):
//! `?help`, `?watchdog`, `?version-list`, `?sensor-list`, `?sensor-value`,
//! `?sensor-sampling`, `?client-list`, `?log-level`, `?halt`; anything else goes to the
//! program's [`Handler`].

use std::sync::Mutex;

use super::sampling::{Sampler, Strategy};
use super::sensors::now;
use super::server::Server;
use super::session::Session;
use super::{Kind, Message};

/// A program's own requests.
pub trait Handler: Send + Sync {
    /// (name, one-line description) of each request the handler serves.
    fn requests(&self) -> Vec<(&'static str, &'static str)>;
    /// Serve `name`; `None` if it is not one of ours. `Err` becomes a `fail` reply.
    fn handle(&self, name: &str, args: &[String]) -> Option<Result<Vec<String>, String>>;
}

const STANDARD: [(&str, &str); 9] = [
    ("help", "List requests, or describe one: ?help [name]"),
    ("watchdog", "Check that the server is alive"),
    ("version-list", "List software versions"),
    ("sensor-list", "List sensors: ?sensor-list [name]"),
    ("sensor-value", "Read sensors: ?sensor-value [name]"),
    (
        "sensor-sampling",
        "Query or set how sensors are reported: ?sensor-sampling name[,name...] [strategy [params]]",
    ),
    ("client-list", "List the connected clients"),
    ("log-level", "Query or set the logging level: ?log-level [level]"),
    ("halt", "Stop the program cleanly"),
];

/// katcp's log levels, and the `tracing` directive each maps to.
const LOG_LEVELS: [(&str, &str); 8] = [
    ("all", "trace"),
    ("trace", "trace"),
    ("debug", "debug"),
    ("info", "info"),
    ("warn", "warn"),
    ("error", "error"),
    ("fatal", "error"),
    ("off", "off"),
];

type LogHook = Box<dyn Fn(&str) -> Result<(), String> + Send + Sync>;

/// The process's katcp log level and how to apply a new one (set by the program's logging
/// set-up; without it `?log-level` only records the level).
static LOG: Mutex<(&str, Option<LogHook>)> = Mutex::new(("info", None));

/// Let `?log-level` change the process's logging: `apply` receives a `tracing` filter
/// directive ("trace", "debug", "info", "warn", "error" or "off").
pub fn set_log_level_hook(apply: impl Fn(&str) -> Result<(), String> + Send + Sync + 'static) {
    LOG.lock().unwrap_or_else(|e| e.into_inner()).1 = Some(Box::new(apply));
}

/// The versions a client is told of on connecting (`#version-connect`) and by
/// `?version-list`, as aiokatcp servers tell them.
pub(super) fn versions(program: &str) -> Vec<Vec<String>> {
    let version = env!("CARGO_PKG_VERSION");
    vec![
        vec!["katcp-protocol".into(), "5.1-MIB".into()],
        vec!["katcp-library".into(), format!("cbf-{version}")],
        vec![
            "katcp-device".into(),
            format!("{program}-{version}"),
            format!("cbf-{version}"),
        ],
    ]
}

impl Server {
    /// Answer one message from `session`'s client; returns the lines to send.
    pub fn respond(&self, msg: &Message, session: &Session) -> Vec<Message> {
        let reply = |args: Vec<String>| Message::new(Kind::Reply, &msg.name, msg.mid, args);
        let inform = |args: Vec<String>| Message::new(Kind::Inform, &msg.name, msg.mid, args);
        let ok = |mut rest: Vec<String>| {
            rest.insert(0, "ok".into());
            reply(rest)
        };
        let fail = |why: String| reply(vec!["fail".into(), why]);
        if msg.kind != Kind::Request {
            return vec![];
        }
        let arg0 = msg.args.first().map(String::as_str);
        let with_count = |mut informs: Vec<Message>| {
            let n = informs.len().to_string();
            informs.push(ok(vec![n]));
            informs
        };
        match msg.name.as_str() {
            "help" => {
                let mut all: Vec<(&str, &str)> = STANDARD.to_vec();
                all.extend(self.handler.requests());
                let chosen: Vec<_> = all
                    .into_iter()
                    .filter(|(n, _)| arg0.is_none_or(|a| a == *n))
                    .collect();
                if chosen.is_empty() {
                    return vec![fail(format!(
                        "unknown request {:?}",
                        arg0.unwrap_or_default()
                    ))];
                }
                with_count(
                    chosen
                        .iter()
                        .map(|(n, d)| inform(vec![n.to_string(), d.to_string()]))
                        .collect(),
                )
            }
            "watchdog" => vec![ok(vec![])],
            "version-list" => with_count(versions(&self.program).into_iter().map(inform).collect()),
            "sensor-list" | "sensor-value" => {
                let found = self.sensors.matching(arg0);
                if found.is_empty() && arg0.is_some() {
                    return vec![fail(format!(
                        "unknown sensor {:?}",
                        arg0.unwrap_or_default()
                    ))];
                }
                with_count(
                    found
                        .iter()
                        .map(|(n, s)| {
                            if msg.name == "sensor-list" {
                                let mut args = vec![
                                    n.clone(),
                                    s.description.clone(),
                                    s.units.clone(),
                                    s.kind.into(),
                                ];
                                args.extend(s.params.iter().map(|p| p.to_string()));
                                inform(args)
                            } else {
                                inform(s.status_args(n))
                            }
                        })
                        .collect(),
                )
            }
            "sensor-sampling" => match self.sensor_sampling(&msg.args, session) {
                Ok((mut informs, args)) => {
                    informs.push(ok(args));
                    informs
                }
                Err(why) => vec![fail(why)],
            },
            "client-list" => with_count(
                self.clients()
                    .into_iter()
                    .map(|peer| inform(vec![peer]))
                    .collect(),
            ),
            "log-level" => match log_level(arg0) {
                Ok(level) => vec![ok(vec![level.into()])],
                Err(why) => vec![fail(why)],
            },
            "halt" => match &self.halt {
                Some(halt) => {
                    tracing::info!(client = %session.peer, "?halt: stopping");
                    halt();
                    vec![ok(vec![])]
                }
                None => vec![fail("this program cannot be halted over katcp".into())],
            },
            name => match self.handler.handle(name, &msg.args) {
                Some(Ok(args)) => vec![ok(args)],
                Some(Err(why)) => vec![fail(why)],
                None => vec![reply(vec![
                    "invalid".into(),
                    format!("Unknown request {name}."),
                ])],
            },
        }
    }

    /// `?sensor-sampling name` (the strategy in force) or `?sensor-sampling names strategy
    /// [params]` (set it for every comma-separated name, all or none; each sensor's reading
    /// is sent at once, before the reply). Returns the `#sensor-status` informs and the
    /// reply's arguments.
    fn sensor_sampling(
        &self,
        args: &[String],
        session: &Session,
    ) -> Result<(Vec<Message>, Vec<String>), String> {
        let [names, rest @ ..] = args else {
            return Err("usage: ?sensor-sampling name[,name...] [strategy [params]]".into());
        };
        let Some((strategy, params)) = rest.split_first() else {
            self.sensors
                .get(names)
                .ok_or_else(|| format!("Unknown sensor {names:?}"))?;
            let mut reply = vec![names.clone()];
            reply.extend(session.strategy(names).words());
            return Ok((vec![], reply));
        };
        let list: Vec<&str> = names.split(',').collect();
        let mut chosen = Vec::new();
        for (i, name) in list.iter().enumerate() {
            if list[..i].contains(name) {
                return Err("Duplicate sensor name".into());
            }
            let reading = self
                .sensors
                .get(name)
                .ok_or_else(|| format!("Unknown sensor {name:?}"))?;
            let numeric = matches!(reading.kind, "integer" | "float");
            chosen.push((name, Strategy::parse(strategy, params, numeric)?, reading));
        }
        let t = now();
        let mut informs = Vec::new();
        for (name, strategy, reading) in &chosen {
            let sampler =
                (*strategy != Strategy::None).then(|| Sampler::new(*strategy, t, reading));
            if sampler.is_some() {
                informs.push(sensor_status(name, reading));
            }
            session.set_sampler(name, sampler);
        }
        let mut reply = vec![names.clone()];
        reply.extend(chosen[0].1.words());
        Ok((informs, reply))
    }
}

/// The `#sensor-status` inform for one reading.
pub(super) fn sensor_status(name: &str, reading: &super::Sensor) -> Message {
    Message::new(
        Kind::Inform,
        "sensor-status",
        None,
        reading.status_args(name),
    )
}

/// `?log-level [level]`: the level after the request.
fn log_level(level: Option<&str>) -> Result<&'static str, String> {
    let mut log = LOG.lock().unwrap_or_else(|e| e.into_inner());
    let Some(level) = level else {
        return Ok(log.0);
    };
    let (name, directive) = LOG_LEVELS
        .iter()
        .find(|(n, _)| *n == level)
        .ok_or_else(|| format!("unknown log level {level:?}"))?;
    if let Some(apply) = &log.1 {
        apply(directive)?;
    }
    log.0 = name;
    Ok(name)
}
