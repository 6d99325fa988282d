//! `cbf array render` on the example arrays, checked by the tools operators' orchestrators
//! trust: every systemd unit and target passes `systemd-analyze verify` with no complaint, and
//! the command line systemd will run is the plan's (read back with Python's `shlex`, an
//! independent reading of the quoting); every Kubernetes manifest passes `kubernetes-validate
//! --strict` (the API's schemas), and the command in the YAML, read back by PyYAML, is the
//! plan's. Both tools are required: a missing one fails the test, saying how to install it.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use cbf::array::{self, Plan};

fn example(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("examples")
        .join(name)
}

/// The example's plan, with the units' binary this test's `cbf` (verify checks it exists).
fn plan(name: &str) -> Plan {
    let mut cfg = array::parse(&std::fs::read_to_string(example(name)).unwrap()).unwrap();
    cfg.array.binary = env!("CARGO_BIN_EXE_cbf").into();
    array::plan::plan(&cfg).unwrap()
}

/// A fresh directory for this test's files.
fn scratch(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("cbf-array-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn systemd_analyze() -> &'static str {
    let found = Command::new("systemd-analyze")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        found,
        "systemd-analyze not found: apt-get install systemd (.ci/run installs it)"
    );
    "systemd-analyze"
}

fn files(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    v.sort();
    v
}

/// Run the venv's Python on `script` with `input` on stdin; its stdout.
fn python(script: &str, args: &[PathBuf], input: &str) -> String {
    use std::io::Write;
    let mut child = Command::new(common::python())
        .arg("-c")
        .arg(script)
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Split `ExecStart=` lines as a POSIX shell would (systemd's double quotes and backslash
/// escapes are the shell's for the words the plans hold), then undo `%%` and `$$`.
const UNQUOTE: &str = r#"
import json, shlex, sys
lines = json.load(sys.stdin)
words = [[w.replace('%%', '%').replace('$$', '$') for w in shlex.split(l)] for l in lines]
print(json.dumps(words))
"#;

fn check_systemd(name: &str) {
    let tool = systemd_analyze();
    let plan = plan(name);
    let dir = scratch(&format!("systemd-{}", plan.array));
    let written = array::systemd::write(&plan, &dir).unwrap();
    let nodes: std::collections::BTreeSet<&str> =
        plan.engines.iter().map(|e| e.node.as_str()).collect();
    assert_eq!(written.len(), plan.engines.len() + nodes.len());
    for node in &nodes {
        let out = Command::new(tool)
            .arg("verify")
            .args(files(&dir.join(node)))
            .output()
            .unwrap();
        let complaints = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() && complaints.trim().is_empty(),
            "{node}: {complaints}"
        );
    }
    let mut lines = Vec::new();
    for e in &plan.engines {
        let unit =
            std::fs::read_to_string(dir.join(&e.node).join(array::systemd::unit_name(&plan, e)))
                .unwrap();
        let field = |k: &str| {
            unit.lines()
                .find_map(|l| l.strip_prefix(k))
                .unwrap_or_else(|| panic!("{k} missing from\n{unit}"))
                .to_string()
        };
        let cores: Vec<String> = e.cores.iter().map(usize::to_string).collect();
        assert_eq!(field("CPUAffinity="), cores.join(" "));
        assert_eq!(field("NUMAMask="), e.numa.to_string());
        assert_eq!(field("NUMAPolicy="), "bind");
        assert_eq!(field("Restart="), "on-failure");
        assert_eq!(field("LimitMEMLOCK="), "infinity");
        if let Some(g) = e.gpu {
            assert!(field("Environment=").contains(&format!("CUDA_VISIBLE_DEVICES={g}")));
        }
        lines.push(field("ExecStart="));
    }
    let words: Vec<Vec<String>> = serde_json::from_str(&python(
        UNQUOTE,
        &[],
        &serde_json::to_string(&lines).unwrap(),
    ))
    .unwrap();
    for (w, e) in words.iter().zip(&plan.engines) {
        assert_eq!(w, &e.argv, "{}", e.name);
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_4_antenna_units_verify() {
    check_systemd("array-4ant.toml");
}

#[test]
fn the_meerkat_units_verify() {
    check_systemd("array-meerkat.toml");
}

/// Read every manifest back with PyYAML: each StatefulSet's container command, by file.
const COMMANDS: &str = r#"
import json, sys, yaml
out = {}
for path in sys.argv[1:]:
    for doc in yaml.safe_load_all(open(path)):
        if doc["kind"] == "StatefulSet":
            out[doc["metadata"]["name"]] = doc["spec"]["template"]["spec"]["containers"][0]["command"]
print(json.dumps(out))
"#;

fn check_kubernetes(name: &str) {
    let plan = plan(name);
    let dir = scratch(&format!("k8s-{}", plan.array));
    let written = array::kubernetes::write(&plan, &dir).unwrap();
    assert_eq!(written.len(), plan.engines.len() + 1);
    let out = Command::new(common::python())
        .args(["-m", "kubernetes_validate", "--strict"])
        .args(&written)
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "kubernetes-validate (tools/setup-python installs it) failed:\n{text}"
    );
    // One "passed" line per document: the Service, and a ConfigMap and a StatefulSet per engine.
    assert_eq!(
        text.matches("passed").count(),
        1 + 2 * plan.engines.len(),
        "{text}"
    );
    let commands: std::collections::BTreeMap<String, Vec<String>> =
        serde_json::from_str(&python(COMMANDS, &written, "")).unwrap();
    assert_eq!(commands.len(), plan.engines.len());
    for e in &plan.engines {
        let name = array::kubernetes::object_name(&plan, e);
        assert_eq!(commands[&name], e.argv, "{name}");
        assert!(name.len() <= 52, "{name}: too long for a StatefulSet");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_4_antenna_manifests_validate() {
    check_kubernetes("array-4ant.toml");
}

#[test]
fn the_meerkat_manifests_validate() {
    check_kubernetes("array-meerkat.toml");
}

/// The CLI writes what the library renders, one directory per node.
#[test]
fn the_cli_renders_both() {
    let dir = scratch("cli");
    let out = Command::new(env!("CARGO_BIN_EXE_cbf"))
        .args(["array", "render", "--systemd"])
        .arg(dir.join("units"))
        .arg("--kubernetes")
        .arg(dir.join("k8s"))
        .arg(example("array-4ant.toml"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let cfg = array::parse(&std::fs::read_to_string(example("array-4ant.toml")).unwrap()).unwrap();
    let plan = array::plan::plan(&cfg).unwrap();
    for e in &plan.engines {
        let unit = dir
            .join("units/localhost")
            .join(array::systemd::unit_name(&plan, e));
        assert_eq!(
            std::fs::read_to_string(unit).unwrap(),
            array::systemd::unit(&plan, e)
        );
        assert!(dir.join(format!("k8s/localhost/{}.yaml", e.name)).exists());
    }
    assert!(dir.join("units/localhost/cbf-test4.target").exists());
    let none = Command::new(env!("CARGO_BIN_EXE_cbf"))
        .args(["array", "render"])
        .arg(example("array-4ant.toml"))
        .output()
        .unwrap();
    assert!(!none.status.success(), "render with no target must fail");
    std::fs::remove_dir_all(&dir).unwrap();
}
