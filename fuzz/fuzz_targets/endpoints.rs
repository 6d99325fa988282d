//! Fuzz endpoint lists (`A.B.C.D[+N]:port[,...]`): no panic, no more than MAX_ENDPOINTS
//! results, and every accepted list is reproduced by formatting its endpoints back one by one.
//! Seeds: fuzz/seeds/endpoints.
#![no_main]

use cbf::net::endpoint::MAX_ENDPOINTS;
use cbf::net::parse_endpoints;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(eps) = parse_endpoints(text) {
        assert!(!eps.is_empty() && eps.len() <= MAX_ENDPOINTS);
        let flat: Vec<String> = eps.iter().map(ToString::to_string).collect();
        assert_eq!(parse_endpoints(&flat.join(",")).as_ref(), Ok(&eps));
    }
});
