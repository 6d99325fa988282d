//! The control plane: katcp requests and sensors ([`katcp`]) and Prometheus metrics
//! ([`metrics`]), and the client side of both for reading other engines ([`katcp::client`],
//! [`scrape`]).

pub mod katcp;
pub mod metrics;
pub mod scrape;
