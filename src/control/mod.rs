//! The control plane: katcp requests and sensors ([`katcp`]) and Prometheus metrics
//! ([`metrics`]).

pub mod katcp;
pub mod metrics;
