//! `cbf affinity` as a library (DESIGN "cbf affinity"): a model of the host's topology
//! ([`host`]) read with hwloc (`hwloc`, feature `hwloc`: this machine or an `lstopo --of xml`
//! export), the planner that places engines on it as a pure function ([`plan`]) with its
//! warnings ([`warning`]), and the report ([`report`]).

pub mod host;
#[cfg(feature = "hwloc")]
pub mod hwloc;
pub mod plan;
pub mod report;
pub mod warning;
