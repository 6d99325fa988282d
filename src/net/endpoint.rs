//! Endpoint lists in katgpucbf's syntax: `A.B.C.D[+N]:port[,...]`, where `+N` means N more
//! consecutive addresses (MeerKAT sends each polarisation to `239.10.10.10+7:7148`).
#![deny(unsafe_code)]

use std::net::{Ipv4Addr, SocketAddrV4};

/// Most endpoints one list may expand to: `+N` is outside input, and `0.0.0.0+4294967295:1`
/// would otherwise ask for 4 billion addresses. Far above any real array's streams.
pub const MAX_ENDPOINTS: usize = 65536;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EndpointError {
    #[error("endpoint {0:?}: expected A.B.C.D[+N]:port")]
    Syntax(String),
    #[error("endpoint {0:?}: bad IPv4 address")]
    Address(String),
    #[error("endpoint {0:?}: bad port")]
    Port(String),
    #[error("endpoint {0:?}: bad count after '+'")]
    Count(String),
    #[error("endpoint {0:?}: address range runs past 255.255.255.255")]
    Overflow(String),
    #[error("empty endpoint list")]
    Empty,
    #[error("endpoint list expands to more than {MAX_ENDPOINTS} endpoints")]
    TooMany,
}

/// Parse a comma-separated endpoint list, expanding `+N` ranges.
///
/// ```
/// let eps = cbf::net::parse_endpoints("239.10.10.10+1:7148,10.0.0.1:7149").unwrap();
/// assert_eq!(eps.len(), 3);
/// assert_eq!(eps[1].to_string(), "239.10.10.11:7148");
/// ```
pub fn parse_endpoints(text: &str) -> Result<Vec<SocketAddrV4>, EndpointError> {
    let mut out = Vec::new();
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let err = |f: fn(String) -> EndpointError| f(part.to_string());
        let (host, port) = part
            .rsplit_once(':')
            .ok_or_else(|| err(EndpointError::Syntax))?;
        // Port 0 means "any" to bind and nothing to send to: never a stream's port.
        let port: u16 = port
            .parse()
            .ok()
            .filter(|&p| p != 0)
            .ok_or_else(|| err(EndpointError::Port))?;
        let (addr, extra) = match host.split_once('+') {
            Some((a, n)) => (a, n.parse::<u32>().map_err(|_| err(EndpointError::Count))?),
            None => (host, 0),
        };
        let addr: Ipv4Addr = addr.parse().map_err(|_| err(EndpointError::Address))?;
        let base = u32::from(addr);
        base.checked_add(extra)
            .ok_or_else(|| err(EndpointError::Overflow))?;
        if out.len() as u64 + u64::from(extra) + 1 > MAX_ENDPOINTS as u64 {
            return Err(EndpointError::TooMany);
        }
        out.extend((0..=extra).map(|i| SocketAddrV4::new(Ipv4Addr::from(base + i), port)));
    }
    if out.is_empty() {
        return Err(EndpointError::Empty);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expands_ranges() {
        let v = parse_endpoints("239.10.10.10+2:7148, 10.0.0.1:7149").unwrap();
        let want: Vec<SocketAddrV4> = [
            "239.10.10.10:7148",
            "239.10.10.11:7148",
            "239.10.10.12:7148",
            "10.0.0.1:7149",
        ]
        .iter()
        .map(|s| s.parse().unwrap())
        .collect();
        assert_eq!(v, want);
    }

    #[test]
    fn errors_name_the_problem() {
        assert!(matches!(
            parse_endpoints("1.2.3.4"),
            Err(EndpointError::Syntax(_))
        ));
        assert!(matches!(
            parse_endpoints("1.2.3:5"),
            Err(EndpointError::Address(_))
        ));
        assert!(matches!(
            parse_endpoints("1.2.3.4:70000"),
            Err(EndpointError::Port(_))
        ));
        assert!(matches!(
            parse_endpoints("1.2.3.4:0"),
            Err(EndpointError::Port(_))
        ));
        assert!(matches!(
            parse_endpoints("1.2.3.4+x:5"),
            Err(EndpointError::Count(_))
        ));
        assert!(matches!(
            parse_endpoints("255.255.255.255+1:5"),
            Err(EndpointError::Overflow(_))
        ));
        assert!(matches!(parse_endpoints(" , "), Err(EndpointError::Empty)));
    }

    #[test]
    fn expansion_is_bounded() {
        // This asked for 2^32 addresses (tens of GB) before the bound.
        assert_eq!(
            parse_endpoints("0.0.0.0+4294967294:1"),
            Err(EndpointError::TooMany)
        );
        let n = MAX_ENDPOINTS - 1;
        assert_eq!(
            parse_endpoints(&format!("10.0.0.0+{n}:1")).map(|v| v.len()),
            Ok(MAX_ENDPOINTS)
        );
        assert_eq!(
            parse_endpoints(&format!("10.0.0.0+{n}:1,10.1.0.0:2")),
            Err(EndpointError::TooMany)
        );
    }
}
