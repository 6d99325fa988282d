//! The plan: every engine of the array with its placement, streams, identity and full command
//! line, and the load on every NIC and GPU link, checked against their capacities.
//!
//! Per band, in this order: multicast groups are allocated (digitiser streams not given in the
//! description, `network.digitiser_groups_per_pol` per polarisation per antenna; the F→X
//! groups, one per XB-engine; the correlation-product groups, one per XB-engine; each beam's
//! groups, one per XB-engine), then the engines are placed: a dsim per antenna when
//! `dsim.enabled`, an F-engine per antenna (feng-id = the antenna's index), and an XB-engine
//! per channel range (XB-engine i takes channels `i·cps ..`, the i-th F→X group). Every
//! F-engine sends the whole F→X range, so each XB-engine hears every F-engine by
//! construction; [`check_fx`] verifies it on the finished plan. [`plan_local`] plans the same
//! description for a run on this host ([`super::local`]).
#![deny(unsafe_code)]

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddrV4;

use serde::Serialize;

use super::check::{check_array, check_band, check_node, BandShape, NodeShape};
use super::config::{ArrayConfig, Backend, Role};
use super::engines::BandEngines;
use super::groups::{Allocator, Groups};
use super::local::{loopback_groups, LocalRun};
use super::place::Placer;
use super::ArrayError;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum EngineKind {
    Dsim,
    Fengine,
    Xbengine,
}

impl EngineKind {
    pub fn as_str(self) -> &'static str {
        match self {
            EngineKind::Dsim => "dsim",
            EngineKind::Fengine => "fengine",
            EngineKind::Xbengine => "xbengine",
        }
    }
}

/// One engine: where it runs, what it receives and sends, and how it is started.
#[derive(Debug, Clone, Serialize)]
pub struct EnginePlan {
    /// `<band>-dsim-<antenna>`, `<band>-f-<antenna>`, `<band>-xb-<nn>`.
    pub name: String,
    pub kind: EngineKind,
    pub band: String,
    pub node: String,
    pub numa: usize,
    pub nic: String,
    pub nic_address: String,
    /// CUDA device index on the node (PCI bus order).
    pub gpu: Option<usize>,
    pub cores: Vec<usize>,
    pub katcp_port: u16,
    pub prometheus_port: u16,
    /// Endpoints received and sent, in the engines' syntax.
    pub inputs: Vec<String>,
    pub outputs: Vec<String>,
    pub feng_id: Option<usize>,
    /// First channel and one past the last.
    pub channels: Option<(usize, usize)>,
    /// Wire rates (Gb/s) and PCIe payload rates (GB/s).
    pub rx_gbps: f64,
    pub tx_gbps: f64,
    pub h2d_gbytes_per_s: f64,
    pub d2h_gbytes_per_s: f64,
    pub memory_gib: u32,
    pub rdma_resource: Option<String>,
    /// Environment the engine needs besides its arguments (which GPU it sees).
    pub env: BTreeMap<String, String>,
    /// The whole command line, `argv[0]` the binary.
    pub argv: Vec<String>,
}

/// A band's derived figures and groups.
#[derive(Debug, Clone, Serialize)]
pub struct BandPlan {
    pub name: String,
    pub adc_sample_rate: f64,
    pub centre_frequency: f64,
    pub channels: usize,
    pub x_engines: usize,
    pub channels_per_xengine: usize,
    pub spectra_per_heap: usize,
    pub heap_accumulation_threshold: u64,
    pub dump_seconds: f64,
    pub fx_groups: String,
    /// Name of the XB-engines' correlation-product output (its sensors' prefix).
    pub corrprod: String,
    pub corrprod_groups: String,
    pub beam_groups: Vec<String>,
}

/// The load on one NIC (Gb/s on the wire) or GPU link (GB/s of payload), against its capacity.
#[derive(Debug, Clone, Serialize)]
pub struct LinkLoad {
    pub node: String,
    pub link: String,
    pub capacity: f64,
    pub rx: f64,
    pub tx: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Plan {
    pub array: String,
    pub sync_time: f64,
    pub backend: Backend,
    /// Container image (`array.image`).
    pub image: String,
    pub bands: Vec<BandPlan>,
    pub engines: Vec<EnginePlan>,
    pub nics: Vec<LinkLoad>,
    pub gpus: Vec<LinkLoad>,
}

fn err(key: impl Into<String>, m: impl std::fmt::Display) -> ArrayError {
    ArrayError::config(key, m)
}

/// A band's groups: each antenna's digitiser stream (one endpoint list per polarisation) and
/// the F→X, correlation-product and beam ranges.
pub(super) struct BandGroups {
    pub digitiser: Vec<[String; 2]>,
    pub fx: Groups,
    pub corrprod: Groups,
    pub beams: Vec<Groups>,
}

/// Allocate a band's groups, and refuse explicit ones that collide with any other. For a
/// local run (`local`), explicit streams are not used, each antenna's digitiser stream is one
/// group for both polarisations, and every group is replaced by its loopback twin
/// ([`super::local`]).
fn band_groups(
    cfg: &ArrayConfig,
    i: usize,
    alloc: &mut Allocator,
    owners: &mut HashMap<SocketAddrV4, String>,
    local: bool,
) -> Result<BandGroups, ArrayError> {
    let band = &cfg.bands[i];
    let full = || {
        err(
            "network.multicast",
            format!("the prefix has too few groups for band {:?}", band.name),
        )
    };
    let x = band.x_engines as u32;
    let mut explicit: Vec<(String, Vec<SocketAddrV4>)> = Vec::new();
    let mut digitiser = Vec::new();
    for (a, ant) in cfg.antennas.iter().enumerate() {
        match ant.digitiser.get(&band.name).filter(|_| !local) {
            Some(lists) => {
                let key = format!("antennas[{a}].digitiser.{}", band.name);
                for l in lists {
                    explicit.push((
                        key.clone(),
                        crate::net::parse_endpoints(l).unwrap_or_default(),
                    ));
                }
                digitiser.push([lists[0].clone(), lists[1].clone()]);
            }
            None if local => {
                let g = alloc.take(1).ok_or_else(full)?;
                claim(owners, &g, &format!("antennas[{a}] digitiser"))?;
                let both = loopback_groups(g)?.endpoint();
                digitiser.push([both.clone(), both]);
            }
            None => {
                let per_pol = cfg.network.digitiser_groups_per_pol;
                let g = per_pol
                    .checked_mul(2)
                    .and_then(|n| alloc.take(n))
                    .ok_or_else(full)?;
                let half = |p: u32| Groups {
                    first: g.nth(p * per_pol).first,
                    count: per_pol,
                    port: g.port,
                };
                claim(owners, &half(0), &format!("antennas[{a}] digitiser"))?;
                claim(owners, &half(1), &format!("antennas[{a}] digitiser"))?;
                digitiser.push([half(0).endpoint(), half(1).endpoint()]);
            }
        }
    }
    let fx = match band.fx_dst.as_ref().filter(|_| !local) {
        Some(text) => {
            let key = format!("bands[{i}].fx_dst");
            let addrs = crate::net::parse_endpoints(text).map_err(|e| err(key.clone(), e))?;
            let consecutive = addrs.windows(2).all(|w| {
                u32::from(*w[0].ip()).checked_add(1) == Some(u32::from(*w[1].ip()))
                    && w[1].port() == w[0].port()
            });
            if !consecutive || !addrs[0].ip().is_multicast() {
                return Err(err(key, "must be one multicast range A.B.C.D+N:port (the F-engine's --wideband dst= takes one)"));
            }
            if addrs.len() != band.x_engines {
                return Err(err(
                    key,
                    format!(
                        "{} groups for {} XB-engines: every F-engine output must reach every XB-engine, one group per XB-engine's channel range",
                        addrs.len(),
                        band.x_engines
                    ),
                ));
            }
            explicit.push((key, addrs.clone()));
            Groups {
                first: *addrs[0].ip(),
                count: x,
                port: addrs[0].port(),
            }
        }
        None => {
            let g = alloc.take(x).ok_or_else(full)?;
            claim(owners, &g, &format!("bands[{i}] F-engine outputs"))?;
            g
        }
    };
    let corrprod = alloc.take(x).ok_or_else(full)?;
    claim(
        owners,
        &corrprod,
        &format!("bands[{i}] correlation products"),
    )?;
    let mut beams = Vec::new();
    for j in 0..band.beams.len() {
        let g = alloc.take(x).ok_or_else(full)?;
        claim(owners, &g, &format!("bands[{i}].beams[{j}]"))?;
        beams.push(g);
    }
    for (key, addrs) in explicit {
        for a in addrs {
            if let Some(other) = owners.insert(a, key.clone()) {
                if other != key {
                    return Err(err(key, format!("{a} is also used by {other}")));
                }
            }
        }
    }
    let (fx, corrprod, beams) = if local {
        (
            loopback_groups(fx)?,
            loopback_groups(corrprod)?,
            beams
                .into_iter()
                .map(loopback_groups)
                .collect::<Result<_, _>>()?,
        )
    } else {
        (fx, corrprod, beams)
    };
    Ok(BandGroups {
        digitiser,
        fx,
        corrprod,
        beams,
    })
}

/// Record allocated groups; one already held (an explicit stream given in the description)
/// is refused naming that stream's key.
fn claim(
    owners: &mut HashMap<SocketAddrV4, String>,
    g: &Groups,
    what: &str,
) -> Result<(), ArrayError> {
    for a in g.addrs() {
        if let Some(other) = owners.insert(a, what.to_string()) {
            return Err(err(other, format!("{a} is also allocated to {what}")));
        }
    }
    Ok(())
}

/// Plan the array: check the description, allocate groups, place and describe every engine,
/// and check the NIC and PCIe loads.
pub fn plan(cfg: &ArrayConfig) -> Result<Plan, ArrayError> {
    plan_for(cfg, None)
}

/// Plan a local run of the array: every engine a process on this host, over loopback
/// ([`super::local`] says what changes). At most [`super::local::MAX_LOCAL_ENGINES`].
pub fn plan_local(cfg: &ArrayConfig, run: &LocalRun) -> Result<Plan, ArrayError> {
    plan_for(cfg, Some(run))
}

fn plan_for(cfg: &ArrayConfig, local: Option<&LocalRun>) -> Result<Plan, ArrayError> {
    check_array(cfg)?;
    if cfg.bands.is_empty() {
        return Err(err("bands", "an array needs at least one band"));
    }
    let shapes: Vec<BandShape> = (0..cfg.bands.len())
        .map(|i| check_band(i, &cfg.bands[i], &cfg.bands))
        .collect::<Result<_, _>>()?;
    if cfg.nodes.is_empty() {
        return Err(err("nodes", "an array needs at least one node"));
    }
    let nodes: Vec<NodeShape> = (0..cfg.nodes.len())
        .map(|i| check_node(i, &cfg.nodes[i], &cfg.nodes))
        .collect::<Result<_, _>>()?;
    if local.is_some() {
        super::local::check_size(cfg)?;
    }
    let mut alloc = Allocator::new(&cfg.network.multicast, cfg.network.port)
        .map_err(|e| err("network.multicast", e))?;
    let mut owners = HashMap::new();
    let mut placer = Placer::new(cfg, &nodes);
    let mut bands = Vec::new();
    let mut engines = Vec::new();
    for (i, band) in cfg.bands.iter().enumerate() {
        let groups = band_groups(cfg, i, &mut alloc, &mut owners, local.is_some())?;
        let shape = &shapes[i];
        let b = BandEngines {
            cfg,
            band,
            shape,
            groups: &groups,
            local,
        };
        // The k-th engine of a local run gets the k-th ports of this host.
        let mut place = |name: &str, role, gpu, cores, k| {
            let at = placer.place(name, role, gpu, cores)?;
            Ok::<_, ArrayError>(match local {
                Some(_) => super::local::relocate(cfg, at, k),
                None => at,
            })
        };
        if cfg.dsim.enabled || local.is_some() {
            for a in 0..cfg.antennas.len() {
                let name = format!("{}-dsim-{}", band.name, cfg.antennas[a].name);
                let at = place(&name, Role::Dsim, false, cfg.dsim.cores, engines.len())?;
                engines.push(b.dsim(name, a, &at));
            }
        }
        let cuda = cfg.array.backend == Backend::Cuda;
        for a in 0..cfg.antennas.len() {
            let name = format!("{}-f-{}", band.name, cfg.antennas[a].name);
            let at = place(
                &name,
                Role::Fengine,
                cuda,
                band.fengine_cores,
                engines.len(),
            )?;
            engines.push(b.fengine(name, a, &at));
        }
        let width = (band.x_engines - 1).to_string().len().max(2);
        for x in 0..band.x_engines {
            let name = format!("{}-xb-{x:0width$}", band.name);
            let at = place(
                &name,
                Role::Xbengine,
                cuda,
                band.xengine_cores,
                engines.len(),
            )?;
            engines.push(b.xbengine(name, x, &at));
        }
        bands.push(BandPlan {
            name: band.name.clone(),
            adc_sample_rate: band.adc_sample_rate,
            centre_frequency: band.centre_frequency,
            channels: band.channels,
            x_engines: band.x_engines,
            channels_per_xengine: shape.cps,
            spectra_per_heap: shape.spectra_per_heap,
            heap_accumulation_threshold: shape.heap_accumulation_threshold,
            dump_seconds: shape.dump_seconds,
            fx_groups: groups.fx.endpoint(),
            corrprod: band.corrprod.clone(),
            corrprod_groups: groups.corrprod.endpoint(),
            beam_groups: groups.beams.iter().map(Groups::endpoint).collect(),
        });
    }
    // A local run uses none of the described NICs and links.
    let (nics, gpus) = match local {
        Some(_) => (vec![], vec![]),
        None => (nic_loads(cfg, &engines)?, gpu_loads(cfg, &nodes, &engines)?),
    };
    let plan = Plan {
        array: cfg.array.name.clone(),
        sync_time: local.map_or(cfg.array.sync_time, |r| r.sync_time),
        backend: cfg.array.backend,
        image: cfg.array.image.clone(),
        nics,
        gpus,
        bands,
        engines,
    };
    check_fx(&plan)?;
    Ok(plan)
}

/// Each NIC's receive and send rates, which must fit its speed.
fn nic_loads(cfg: &ArrayConfig, engines: &[EnginePlan]) -> Result<Vec<LinkLoad>, ArrayError> {
    let mut out = Vec::new();
    for (i, node) in cfg.nodes.iter().enumerate() {
        for (j, nic) in node.nics.iter().enumerate() {
            let on: Vec<&EnginePlan> = engines
                .iter()
                .filter(|e| e.node == node.hostname && e.nic == nic.name)
                .collect();
            // Folded from +0.0: an empty f64 `sum()` is -0.0, which prints as "-0.00".
            let rx: f64 = on.iter().fold(0.0, |a, e| a + e.rx_gbps);
            let tx: f64 = on.iter().fold(0.0, |a, e| a + e.tx_gbps);
            if rx.max(tx) > nic.speed_gbps {
                let names: Vec<&str> = on.iter().map(|e| e.name.as_str()).collect();
                return Err(err(
                    format!("nodes[{i}].nics[{j}].speed_gbps"),
                    format!(
                        "{} {} carries {rx:.2} Gb/s in and {tx:.2} Gb/s out on the wire for {}, over its {} Gb/s",
                        node.hostname,
                        nic.name,
                        names.join(", "),
                        nic.speed_gbps
                    ),
                ));
            }
            out.push(LinkLoad {
                node: node.hostname.clone(),
                link: nic.name.clone(),
                capacity: nic.speed_gbps,
                rx,
                tx,
            });
        }
    }
    Ok(out)
}

/// Each GPU's host-to-device and device-to-host payload, which must fit its PCIe link.
fn gpu_loads(
    cfg: &ArrayConfig,
    nodes: &[NodeShape],
    engines: &[EnginePlan],
) -> Result<Vec<LinkLoad>, ArrayError> {
    let mut out = Vec::new();
    for (i, node) in cfg.nodes.iter().enumerate() {
        for (j, gpu) in node.gpus.iter().enumerate() {
            let on: Vec<&EnginePlan> = engines
                .iter()
                .filter(|e| e.node == node.hostname && e.gpu == Some(gpu.index))
                .collect();
            let h2d: f64 = on.iter().fold(0.0, |a, e| a + e.h2d_gbytes_per_s);
            let d2h: f64 = on.iter().fold(0.0, |a, e| a + e.d2h_gbytes_per_s);
            let capacity = nodes[i].pcie_bytes_per_s[j] / 1e9;
            if h2d.max(d2h) > capacity {
                let key = if gpu.pcie_gbytes_per_s.is_some() {
                    "pcie_gbytes_per_s"
                } else {
                    "pcie_width"
                };
                return Err(err(
                    format!("nodes[{i}].gpus[{j}].{key}"),
                    format!(
                        "GPU {} of {} moves {h2d:.2} GB/s to and {d2h:.2} GB/s from the device for {} engines, over its {capacity:.2} GB/s PCIe link",
                        gpu.index, node.hostname, on.len()
                    ),
                ));
            }
            out.push(LinkLoad {
                node: node.hostname.clone(),
                link: format!("gpu{}", gpu.index),
                capacity,
                rx: h2d,
                tx: d2h,
            });
        }
    }
    Ok(out)
}

/// Every F-engine's output reaches every XB-engine of its band: XB-engine i receives the i-th
/// group of each F-engine's output range, and the XB-engines' channel ranges tile the band.
pub fn check_fx(plan: &Plan) -> Result<(), ArrayError> {
    for (i, band) in plan.bands.iter().enumerate() {
        let of = |k: EngineKind| {
            plan.engines
                .iter()
                .filter(move |e| e.band == band.name && e.kind == k)
        };
        let xs: Vec<&EnginePlan> = of(EngineKind::Xbengine).collect();
        let mut next = 0;
        for (x, xe) in xs.iter().enumerate() {
            let (lo, hi) = xe.channels.unwrap_or_default();
            let input = &xe.inputs[0];
            let heard = of(EngineKind::Fengine).all(|f| {
                crate::net::parse_endpoints(&f.outputs[0])
                    .ok()
                    .and_then(|g| g.get(x).map(|a| a.to_string()))
                    .as_ref()
                    == Some(input)
            });
            if lo != next || !heard {
                return Err(err(
                    format!("bands[{i}].x_engines"),
                    format!(
                        "XB-engine {} does not receive channels {next}.. from every F-engine",
                        xe.name
                    ),
                ));
            }
            next = hi;
        }
        if next != band.channels {
            return Err(err(
                format!("bands[{i}].x_engines"),
                format!(
                    "the XB-engines cover channels 0..{next} of {}",
                    band.channels
                ),
            ));
        }
    }
    Ok(())
}
