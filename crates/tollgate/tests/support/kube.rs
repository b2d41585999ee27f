//! The Kubernetes manifests of `deploy/kubernetes/`, read as data so that the tests run what
//! they say (the ConfigMap's rules, the container's environment, user, mount path and probes)
//! rather than a copy that could drift; and the kubelet's ConfigMap volume layout (files that
//! are symlinks through `..data`, swapped atomically on an update) written on disk.

use std::path::Path;
use yaml_rust2::{Yaml, YamlLoader};

/// One manifest file: its YAML documents.
pub struct Manifest {
    pub path: String,
    docs: Vec<Yaml>,
}

impl Manifest {
    /// `deploy/kubernetes/NAME`.
    pub fn load(name: &str) -> Manifest {
        let path = super::repo().join("deploy/kubernetes").join(name);
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
        let docs = YamlLoader::load_from_str(&text).unwrap_or_else(|e| panic!("{path:?}: {e}"));
        Manifest {
            path: path.display().to_string(),
            docs,
        }
    }

    /// The document of this `kind` (the first one).
    pub fn doc(&self, kind: &str) -> &Yaml {
        self.docs
            .iter()
            .find(|d| d["kind"].as_str() == Some(kind))
            .unwrap_or_else(|| panic!("{}: no {kind}", self.path))
    }

    /// The files of the ConfigMap: `(key, contents)`.
    pub fn configmap_files(&self) -> Vec<(String, String)> {
        let data = self.doc("ConfigMap")["data"]
            .as_hash()
            .unwrap_or_else(|| panic!("{}: ConfigMap without data", self.path));
        data.iter()
            .map(|(k, v)| {
                (
                    k.as_str().unwrap().to_string(),
                    v.as_str().unwrap().to_string(),
                )
            })
            .collect()
    }

    fn pod(&self) -> &Yaml {
        &self.doc("Deployment")["spec"]["template"]["spec"]
    }

    /// The Deployment's (first) container.
    pub fn container(&self) -> &Yaml {
        &self.pod()["containers"][0]
    }

    /// The container's environment in order; a `secretKeyRef` is read from this file's Secret.
    pub fn env(&self) -> Vec<(String, String)> {
        let list = self.container()["env"]
            .as_vec()
            .cloned()
            .unwrap_or_default();
        list.iter()
            .map(|e| {
                let name = e["name"].as_str().unwrap().to_string();
                let value = match e["value"].as_str() {
                    Some(v) => v.to_string(),
                    None => self.secret_value(&e["valueFrom"]["secretKeyRef"]),
                };
                (name, value)
            })
            .collect()
    }

    /// Whether the variable `name` is taken from a Secret.
    pub fn env_from_secret(&self, name: &str) -> bool {
        let list = self.container()["env"]
            .as_vec()
            .cloned()
            .unwrap_or_default();
        list.iter().any(|e| {
            e["name"].as_str() == Some(name) && !e["valueFrom"]["secretKeyRef"].is_badvalue()
        })
    }

    fn secret_value(&self, reference: &Yaml) -> String {
        let secret = self.doc("Secret");
        assert_eq!(
            secret["metadata"]["name"].as_str(),
            reference["name"].as_str(),
            "{}: secretKeyRef names another Secret",
            self.path
        );
        let key = reference["key"].as_str().unwrap();
        secret["stringData"][key]
            .as_str()
            .unwrap_or_else(|| panic!("{}: Secret has no stringData.{key}", self.path))
            .to_string()
    }

    /// `uid:gid` the pod runs as (pod security context, the container's overriding it).
    pub fn run_as(&self) -> String {
        let pick = |field: &str| {
            let c = &self.container()["securityContext"][field];
            let p = &self.pod()["securityContext"][field];
            c.as_i64()
                .or_else(|| p.as_i64())
                .unwrap_or_else(|| panic!("{}: no {field}", self.path))
        };
        format!("{}:{}", pick("runAsUser"), pick("runAsGroup"))
    }

    /// The container's `readOnlyRootFilesystem`.
    pub fn read_only_root(&self) -> bool {
        self.container()["securityContext"]["readOnlyRootFilesystem"].as_bool() == Some(true)
    }

    /// Where the ConfigMap volume is mounted in the container.
    pub fn configmap_mount(&self) -> String {
        let cm = self.doc("ConfigMap")["metadata"]["name"].as_str().unwrap();
        let volumes = self.pod()["volumes"].as_vec().unwrap();
        let volume = volumes
            .iter()
            .find(|v| v["configMap"]["name"].as_str() == Some(cm))
            .unwrap_or_else(|| panic!("{}: no volume of ConfigMap {cm}", self.path));
        let name = volume["name"].as_str().unwrap();
        let mounts = self.container()["volumeMounts"].as_vec().unwrap();
        let mount = mounts
            .iter()
            .find(|m| m["name"].as_str() == Some(name))
            .unwrap_or_else(|| panic!("{}: volume {name} is not mounted", self.path));
        assert!(
            mount["subPath"].is_badvalue(),
            "{}: a subPath mount is never updated by the kubelet",
            self.path
        );
        mount["mountPath"].as_str().unwrap().to_string()
    }

    /// The HTTP path of a probe (`readinessProbe`, `livenessProbe`).
    pub fn probe_path(&self, probe: &str) -> String {
        self.container()[probe]["httpGet"]["path"]
            .as_str()
            .unwrap_or_else(|| panic!("{}: no {probe}.httpGet.path", self.path))
            .to_string()
    }

    /// The container port called `name`.
    pub fn container_port(&self, name: &str) -> i64 {
        let ports = self.container()["ports"].as_vec().unwrap();
        ports
            .iter()
            .find(|p| p["name"].as_str() == Some(name))
            .and_then(|p| p["containerPort"].as_i64())
            .unwrap_or_else(|| panic!("{}: no container port {name}", self.path))
    }
}

/// Write `files` into `dir` as the kubelet writes a ConfigMap volume, version `version`: the
/// files go to a new hidden directory `..VERSION`, a `..data_tmp` symlink to it is renamed over
/// `..data` (one atomic step), each visible name is a symlink `NAME -> ..data/NAME`, and the
/// previous version's directory is removed.
pub fn write_configmap(dir: &Path, version: &str, files: &[(String, String)]) {
    use std::os::unix::fs::symlink;
    let versioned = format!("..{version}");
    let previous = std::fs::read_link(dir.join("..data")).ok();
    std::fs::create_dir_all(dir.join(&versioned)).unwrap();
    for (name, contents) in files {
        std::fs::write(dir.join(&versioned).join(name), contents).unwrap();
    }
    let _ = std::fs::remove_file(dir.join("..data_tmp"));
    symlink(&versioned, dir.join("..data_tmp")).unwrap();
    std::fs::rename(dir.join("..data_tmp"), dir.join("..data")).unwrap();
    for (name, _) in files {
        if std::fs::symlink_metadata(dir.join(name)).is_err() {
            symlink(format!("..data/{name}"), dir.join(name)).unwrap();
        }
    }
    if let Some(old) = previous.filter(|p| p.as_os_str() != versioned.as_str()) {
        std::fs::remove_dir_all(dir.join(old)).unwrap();
    }
}
