//! The XB-engine's outputs (katgpucbf xbgpu, facts §1.4): `--corrprod
//! name=…,dst=…,heap_accumulation_threshold=…` (baseline correlation products, one endpoint)
//! and `--beam name=…,dst=…,pol=…[,dither=uniform|none]` (a single-polarisation coherent
//! beam), parsed with errors that name the key.
#![deny(unsafe_code)]

use std::net::SocketAddrV4;

use crate::net::parse_endpoints;

/// A `--corrprod` output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CorrprodOutput {
    pub name: String,
    pub dst: SocketAddrV4,
    /// Batches per dump.
    pub heap_accumulation_threshold: u64,
}

/// A `--beam` output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BeamOutput {
    pub name: String,
    pub dst: SocketAddrV4,
    pub pol: usize,
    pub dither: bool,
}

/// `key=value` pairs of a sub-option string, each key at most once.
pub(super) fn pairs(text: &str) -> Result<Vec<(&str, &str)>, String> {
    let mut out: Vec<(&str, &str)> = Vec::new();
    for part in text.split(',').filter(|p| !p.is_empty()) {
        let (k, v) = part
            .split_once('=')
            .ok_or_else(|| format!("{part:?} is not key=value"))?;
        if out.iter().any(|(seen, _)| *seen == k) {
            return Err(format!("{k} given twice"));
        }
        out.push((k, v));
    }
    Ok(out)
}

/// One endpoint (`A.B.C.D:port`); a range or list is refused.
pub(super) fn one_endpoint(v: &str) -> Result<SocketAddrV4, String> {
    match parse_endpoints(v)
        .map_err(|e| format!("dst: {e}"))?
        .as_slice()
    {
        [one] => Ok(*one),
        many => Err(format!(
            "dst={v:?}: one endpoint expected, got {}",
            many.len()
        )),
    }
}

pub(super) fn valid_name(name: &str) -> Result<String, String> {
    // Names become sensor names (`{name}.xeng-clip-cnt`) and metric labels.
    if name.is_empty()
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
    {
        return Err(format!(
            "name={name:?}: letters, digits, '_', '-' and '.' only"
        ));
    }
    Ok(name.to_string())
}

impl CorrprodOutput {
    /// Parse the sub-option string; `Err` is a message for the `--corrprod` flag.
    pub fn parse(text: &str) -> Result<CorrprodOutput, String> {
        let (mut name, mut dst, mut threshold) = (None, None, None);
        for (k, v) in pairs(text)? {
            match k {
                "name" => name = Some(valid_name(v)?),
                "dst" => dst = Some(one_endpoint(v)?),
                "heap_accumulation_threshold" => {
                    let n: u64 = v
                        .parse()
                        .map_err(|_| format!("{k}={v:?}: not an integer"))?;
                    if n == 0 {
                        return Err(format!("{k} must be positive"));
                    }
                    threshold = Some(n);
                }
                _ => return Err(format!("unknown key {k:?}")),
            }
        }
        Ok(CorrprodOutput {
            name: name.ok_or("missing name=")?,
            dst: dst.ok_or("missing dst=")?,
            heap_accumulation_threshold: threshold.ok_or("missing heap_accumulation_threshold=")?,
        })
    }
}

impl BeamOutput {
    /// Parse the sub-option string; `Err` is a message for the `--beam` flag.
    pub fn parse(text: &str) -> Result<BeamOutput, String> {
        let (mut name, mut dst, mut pol) = (None, None, None);
        let mut dither = true;
        for (k, v) in pairs(text)? {
            match k {
                "name" => name = Some(valid_name(v)?),
                "dst" => dst = Some(one_endpoint(v)?),
                "pol" => {
                    pol = Some(match v {
                        "0" => 0,
                        "1" => 1,
                        _ => return Err(format!("pol={v:?}: must be 0 or 1")),
                    })
                }
                "dither" => {
                    dither = match v {
                        "uniform" => true,
                        "none" => false,
                        _ => return Err(format!("dither={v:?}: must be uniform or none")),
                    }
                }
                _ => return Err(format!("unknown key {k:?}")),
            }
        }
        Ok(BeamOutput {
            name: name.ok_or("missing name=")?,
            dst: dst.ok_or("missing dst=")?,
            pol: pol.ok_or("missing pol=")?,
            dither,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_katgpucbf_sub_options() {
        let c = CorrprodOutput::parse("name=bl,dst=239.1.2.3:7148,heap_accumulation_threshold=52")
            .unwrap();
        assert_eq!(c.name, "bl");
        assert_eq!(c.dst.to_string(), "239.1.2.3:7148");
        assert_eq!(c.heap_accumulation_threshold, 52);
        let b = BeamOutput::parse("name=tied0,dst=239.1.2.4:7148,pol=1,dither=none").unwrap();
        assert_eq!((b.pol, b.dither), (1, false));
        assert!(
            BeamOutput::parse("name=t,dst=239.1.2.4:7148,pol=0")
                .unwrap()
                .dither
        );
    }

    #[test]
    fn bad_sub_options_name_the_key() {
        let c = |t: &str| CorrprodOutput::parse(t).unwrap_err();
        assert!(c("dst=239.1.2.3:7148,heap_accumulation_threshold=5").contains("name"));
        assert!(c("name=a,heap_accumulation_threshold=5").contains("dst"));
        assert!(c("name=a,dst=239.1.2.3:7148").contains("heap_accumulation_threshold"));
        assert!(c("name=a,dst=239.1.2.3:7148,heap_accumulation_threshold=0").contains("positive"));
        assert!(
            c("name=a,dst=239.1.2.3+1:7148,heap_accumulation_threshold=1").contains("one endpoint")
        );
        assert!(c("name=a b,dst=239.1.2.3:7148,heap_accumulation_threshold=1").contains("name"));
        assert!(
            c("name=a,name=b,dst=239.1.2.3:7148,heap_accumulation_threshold=1").contains("twice")
        );
        let b = |t: &str| BeamOutput::parse(t).unwrap_err();
        assert!(b("name=t,dst=239.1.2.4:7148,pol=2").contains("pol"));
        assert!(b("name=t,dst=239.1.2.4:7148").contains("pol"));
        assert!(b("name=t,dst=239.1.2.4:7148,pol=0,dither=gauss").contains("dither"));
        assert!(b("name=t,dst=239.1.2.4:7148,pol=0,colour=red").contains("colour"));
    }
}
