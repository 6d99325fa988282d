//! The control plane: katcp requests and sensors ([`katcp`]).

pub mod katcp;
