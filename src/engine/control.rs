//! The control plane every engine starts: a katcp server for its requests and sensors and,
//! when asked, a Prometheus endpoint for its metrics, both on `host`.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use prometheus::Registry;

use super::health::{self, Timeout};
use super::{ConfigError, Shutdown};
use crate::control::katcp::{self, Handler, Sensors};

/// Where the control servers listen.
#[derive(Debug, Clone, Copy)]
pub struct ControlConfig {
    pub host: IpAddr,
    /// katcp port; 0 picks a free one.
    pub katcp_port: u16,
    pub prometheus_port: Option<u16>,
}

/// The bound addresses.
#[derive(Debug, Clone, Copy)]
pub struct ControlAddrs {
    pub katcp: SocketAddr,
    pub prometheus: Option<SocketAddr>,
}

/// Start the health sensors (with the engine's receive-sensor `timeouts`), the katcp server
/// (answering `handler`'s requests and the standard ones; `?halt` raises `shutdown`) and the
/// Prometheus endpoint. A port that cannot be bound is a start-up error naming its flag.
pub fn serve(
    cfg: ControlConfig,
    program: &str,
    sensors: Arc<Sensors>,
    handler: Arc<dyn Handler>,
    registry: Registry,
    shutdown: &Shutdown,
    timeouts: Vec<Timeout>,
) -> Result<ControlAddrs, ConfigError> {
    health::start(&sensors, timeouts).map_err(|e| ConfigError::new("--katcp-port", e))?;
    let halt = shutdown.clone();
    let katcp = katcp::Server::new(sensors, handler, program)
        .with_halt(move || halt.request())
        .serve(SocketAddr::new(cfg.host, cfg.katcp_port))
        .map_err(|e| ConfigError::new("--katcp-port", e))?;
    tracing::info!(%katcp, "katcp server listening");
    let prometheus = match cfg.prometheus_port {
        Some(port) => {
            let addr = crate::control::metrics::serve(SocketAddr::new(cfg.host, port), registry)
                .map_err(|e| ConfigError::new("--prometheus-port", e))?;
            tracing::info!(%addr, "Prometheus metrics at /metrics");
            Some(addr)
        }
        None => None,
    };
    Ok(ControlAddrs { katcp, prometheus })
}
