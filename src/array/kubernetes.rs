//! A plan as Kubernetes manifests: for each engine, `DIR/<node>/<engine>.yaml` holding a
//! ConfigMap (the engine's plan: argv, placement, streams, rates, as JSON) and a StatefulSet
//! of one pod; and `DIR/service.yaml`, the headless Service the StatefulSets name, which gives
//! every engine a DNS name (`cbf-<array>-<engine>-0.cbf-<array>`) for katcp clients.
//! `kubectl apply -R -f DIR` deploys the array.
//!
//! Why a one-replica StatefulSet per engine: each engine is unique (its own feng-id or channel
//! range, flags, node and ports), so it is not a replica of anything; a bare Pod is not
//! recreated when deleted or evicted; a Deployment may run an old and a new pod side by side
//! during a rollout or a node failure, which for a host-networked engine means two processes
//! on one katcp port sending the same heaps. A StatefulSet runs at most one pod per identity.
//!
//! Each pod is pinned to its node (`nodeSelector` on `kubernetes.io/hostname`), uses the
//! host's network (`hostNetwork`, so multicast joins and the NIC addresses in its flags are
//! the host's; `dnsPolicy: ClusterFirstWithHostNet` keeps cluster DNS), asks for its GPU
//! (`nvidia.com/gpu`) and, where the NIC names one, its RDMA device (`nics[].rdma_resource`)
//! through device plugins, and requests whole CPUs and memory equal to its limits: Guaranteed
//! QoS, which the kubelet's static CPU manager policy pins to exclusive cores. The kubelet,
//! not the plan, chooses which cores and which GPU: run it with `--cpu-manager-policy=static`
//! and `--topology-manager-policy=single-numa-node` so they share a NUMA node, as the plan
//! has it; engines that share a GPU (`gpus[].engines` > 1) need the device plugin's GPU
//! time-slicing. The pods' `CUDA_VISIBLE_DEVICES` is the device plugin's, so the plan's is
//! left out. cbf's engines use UDP sockets (no DPDK), so no hugepages are requested.
#![deny(unsafe_code)]

use std::path::{Path, PathBuf};

use serde_json::{json, Map, Value};

use super::plan::{EnginePlan, Plan};
use super::yaml::to_yaml;
use super::{write_file, ArrayError};

/// The StatefulSet (and ConfigMap) name of an engine: `cbf-<array>-<engine>`.
pub fn object_name(plan: &Plan, e: &EnginePlan) -> String {
    format!("cbf-{}-{}", plan.array, e.name)
}

fn labels(plan: &Plan, e: &EnginePlan) -> Value {
    json!({
        "app.kubernetes.io/name": "cbf",
        "app.kubernetes.io/instance": object_name(plan, e),
        "app.kubernetes.io/component": e.kind.as_str(),
        "app.kubernetes.io/part-of": format!("cbf-{}", plan.array),
    })
}

/// The ConfigMap holding the engine's plan.
pub fn config_map(plan: &Plan, e: &EnginePlan) -> Value {
    let engine = serde_json::to_string_pretty(e).expect("a plan serialises");
    let argv = serde_json::to_string(&e.argv).expect("strings serialise");
    json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": { "name": object_name(plan, e), "labels": labels(plan, e) },
        "data": { "argv.json": argv, "engine.json": engine },
    })
}

/// The one-pod StatefulSet running the engine.
pub fn stateful_set(plan: &Plan, e: &EnginePlan) -> Value {
    let name = object_name(plan, e);
    let mut resources = Map::new();
    resources.insert("cpu".into(), json!(e.cores.len().to_string()));
    resources.insert("memory".into(), json!(format!("{}Gi", e.memory_gib)));
    if e.gpu.is_some() {
        resources.insert("nvidia.com/gpu".into(), json!("1"));
    }
    if let Some(r) = &e.rdma_resource {
        resources.insert(r.clone(), json!("1"));
    }
    let env: Vec<Value> = e
        .env
        .iter()
        .filter(|(k, _)| k.as_str() != "CUDA_VISIBLE_DEVICES")
        .map(|(k, v)| json!({ "name": k, "value": v }))
        .collect();
    let container = json!({
        "name": e.kind.as_str(),
        "image": plan.image,
        "command": e.argv,
        "env": env,
        "ports": [
            { "name": "katcp", "containerPort": e.katcp_port, "protocol": "TCP" },
            { "name": "metrics", "containerPort": e.prometheus_port, "protocol": "TCP" },
        ],
        "resources": { "requests": resources.clone(), "limits": resources },
        // Lock pinned host buffers beyond the container's default memlock limit.
        "securityContext": { "capabilities": { "add": ["IPC_LOCK"] } },
        "volumeMounts": [{ "name": "plan", "mountPath": "/etc/cbf", "readOnly": true }],
    });
    json!({
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": { "name": name, "labels": labels(plan, e) },
        "spec": {
            "replicas": 1,
            "serviceName": format!("cbf-{}", plan.array),
            "selector": { "matchLabels": { "app.kubernetes.io/instance": name } },
            "template": {
                "metadata": {
                    "labels": labels(plan, e),
                    "annotations": {
                        "prometheus.io/scrape": "true",
                        "prometheus.io/port": e.prometheus_port.to_string(),
                        "prometheus.io/path": "/metrics",
                    },
                },
                "spec": {
                    "nodeSelector": { "kubernetes.io/hostname": e.node },
                    "hostNetwork": true,
                    "dnsPolicy": "ClusterFirstWithHostNet",
                    // The engines stop cleanly on SIGTERM and print their final counters.
                    "terminationGracePeriodSeconds": 30,
                    "containers": [container],
                    "volumes": [{ "name": "plan", "configMap": { "name": name } }],
                },
            },
        },
    })
}

/// The headless Service giving the engines DNS names.
pub fn service(plan: &Plan) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": format!("cbf-{}", plan.array),
            "labels": { "app.kubernetes.io/name": "cbf", "app.kubernetes.io/part-of": format!("cbf-{}", plan.array) },
        },
        "spec": {
            "clusterIP": "None",
            "selector": { "app.kubernetes.io/part-of": format!("cbf-{}", plan.array) },
        },
    })
}

/// One engine's file: its ConfigMap and StatefulSet as two YAML documents.
pub fn manifests(plan: &Plan, e: &EnginePlan) -> String {
    format!(
        "# Generated by `cbf array render --kubernetes` for array {}: re-render, do not edit.\n---\n{}---\n{}",
        plan.array,
        to_yaml(&config_map(plan, e)),
        to_yaml(&stateful_set(plan, e))
    )
}

/// Write the Service and every engine's manifests under `dir`; the paths written.
pub fn write(plan: &Plan, dir: &Path) -> Result<Vec<PathBuf>, ArrayError> {
    let path = dir.join("service.yaml");
    write_file(&path, &to_yaml(&service(plan)))?;
    let mut written = vec![path];
    for e in &plan.engines {
        let text = manifests(plan, e);
        let path = dir.join(&e.node).join(format!("{}.yaml", e.name));
        write_file(&path, &text)?;
        written.push(path);
    }
    Ok(written)
}
