//! Fuzz the array description (`cbf array plan`/`render` input): text through the TOML parser
//! (or, when TOML refuses it, the YAML parser), the planner and both renderings, with no
//! panic; an accepted plan gives every engine a command line and distinct katcp and
//! Prometheus ports on its node.
//! Seeds: fuzz/seeds/array_config (the examples).
#![no_main]

use std::collections::HashSet;

use cbf::array::{self, kubernetes, systemd};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(cfg) = array::parse(text).or_else(|_| array::parse_yaml(text)) else {
        return;
    };
    let Ok(plan) = array::plan::plan(&cfg) else {
        return;
    };
    let mut ports = HashSet::new();
    for e in &plan.engines {
        assert!(e.argv.len() > 2);
        assert!(ports.insert((e.node.clone(), e.katcp_port)));
        assert!(ports.insert((e.node.clone(), e.prometheus_port)));
        let _ = systemd::unit(&plan, e);
        let _ = kubernetes::manifests(&plan, e);
    }
});
