//! YAML array descriptions: `examples/array-4ant.yaml`, written by hand from
//! `examples/array-4ant.toml`, must give the same plan as the TOML file through a different
//! parser (serde_norway against toml), compared as the plans' JSON — the deployed plan through
//! the binary (`cbf array plan --json`), the local plan through the library with one sync time.
//! Errors in YAML name the key as TOML's do; an oversized file is refused before parsing.

use std::path::{Path, PathBuf};
use std::process::Command;

use cbf::array::{self, ArrayError, Format};

fn example(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("examples")
        .join(name)
}

fn cbf(args: &[&str], path: &Path) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_cbf"))
        .args(args)
        .arg(path)
        .output()
        .unwrap()
}

fn plan_json(args: &[&str], path: &Path) -> serde_json::Value {
    let out = cbf(args, path);
    assert!(
        out.status.success(),
        "{}: {}",
        path.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn the_yaml_example_plans_as_the_toml_one() {
    let (toml, yaml) = (example("array-4ant.toml"), example("array-4ant.yaml"));
    assert_eq!(Format::of(&toml), Format::Toml);
    assert_eq!(Format::of(&yaml), Format::Yaml);
    assert_eq!(Format::of(Path::new("a.YML")), Format::Yaml);
    let from_toml = plan_json(&["array", "plan", "--json"], &toml);
    assert_eq!(from_toml["engines"].as_array().unwrap().len(), 10);
    assert_eq!(from_toml, plan_json(&["array", "plan", "--json"], &yaml));

    let run = array::local::LocalRun {
        binary: "/opt/cbf".into(),
        sync_time: 1.75e9,
    };
    let local = |p: &Path| {
        let plan = array::plan::plan_local(&array::read(p).unwrap(), &run).unwrap();
        serde_json::to_value(plan).unwrap()
    };
    assert_eq!(local(&toml), local(&yaml));
    // The CLI's local plan reads YAML too (run --local and status --local share it).
    let out = plan_json(&["array", "plan", "--local", "--json"], &yaml);
    assert_eq!(out["engines"].as_array().unwrap().len(), 10);
}

/// The same mistake in both syntaxes: an error naming the key in each.
#[test]
fn yaml_errors_name_the_key() {
    let toml = std::fs::read_to_string(example("array-4ant.toml")).unwrap();
    let yaml = std::fs::read_to_string(example("array-4ant.yaml")).unwrap();
    let parse_err = |r: Result<(), ArrayError>| match r {
        Err(ArrayError::Parse(m)) => m,
        other => panic!("{other:?}"),
    };

    // A misspelt key.
    let m = parse_err(array::parse_yaml(&yaml.replace("x_engines: 2", "x_engine: 2")).map(drop));
    assert!(m.contains("bands[0]") && m.contains("x_engine"), "{m}");
    let m = parse_err(array::parse(&toml.replace("x_engines = 2", "x_engine = 2")).map(drop));
    assert!(m.contains("x_engine"), "{m}");

    // A value of the wrong type.
    let m =
        parse_err(array::parse_yaml(&yaml.replace("channels: 1024", "channels: many")).map(drop));
    assert!(m.contains("bands[0].channels"), "{m}");

    // A value the planner refuses: the same key from either syntax.
    for cfg in [
        array::parse_yaml(&yaml.replace("x_engines: 2", "x_engines: 3")).unwrap(),
        array::parse(&toml.replace("x_engines = 2", "x_engines = 3")).unwrap(),
    ] {
        let e = array::plan::plan(&cfg).unwrap_err();
        assert_eq!(e.key(), Some("bands[0].x_engines"), "{e}");
    }

    // Through the binary: the file's name and the key.
    let dir = std::env::temp_dir().join(format!("cbf-array-yaml-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bad = dir.join("bad.yml");
    std::fs::write(&bad, yaml.replace("speed_gbps: 10.0", "speed_gbps: fast")).unwrap();
    let out = cbf(&["array", "plan"], &bad);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("bad.yml") && err.contains("nodes[0].nics[0].speed_gbps"),
        "{err}"
    );

    // A file over the bound is refused without being parsed.
    let big = dir.join("big.yaml");
    let f = std::fs::File::create(&big).unwrap();
    f.set_len(array::MAX_DESCRIPTION_BYTES + 1).unwrap();
    let m = parse_err(array::read(&big).map(drop));
    assert!(m.contains("larger than"), "{m}");
    std::fs::remove_dir_all(&dir).unwrap();
}
