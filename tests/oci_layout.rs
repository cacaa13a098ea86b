//! Bundles as OCI artifacts in an OCI image layout (issue 27 item 5; FORMAT.md §12):
//! `bundle export` → `bundle import` gives the store entry `bundle install` gives; several tags in
//! one layout; hostile layouts (a flipped or truncated layer, lying sizes, missing blobs, digests
//! that are paths or not hex, a huge index.json, wrong media types, parts that disagree, unsigned
//! or wrongly signed bundles, a downgrade) are refused with their exit code and one error line,
//! and leave the store byte for byte as it was; and, when `skopeo` is installed, a layout copied
//! by `skopeo copy` imports.
//!
//! Tiny generated bundles (three small members, packed with `pack_dir`) keep it fast.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use applianced::bundle::build::{pack_dir, BundleMeta};
use applianced::bundle::manifest::FORMAT_V1;
use applianced::bundle::writer::write_bundle;
use applianced::bundle::{Manifest, Member};
use applianced::trust::{generate, SecretKey};
use serde_json::{json, Value};
use sha2::Digest as _;

mod common;
use common::{expect_fail, expect_ok, json_ok, snapshot, stderr, stdout, BIN};

const ARTIFACT: &str = "application/vnd.applianced.bundle.v1";
const CONFIG: &str = "application/vnd.applianced.bundle.config.v1+json";
const LAYER: &str = "application/vnd.applianced.bundle.v1.tar+zstd";
const MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";

fn sha(b: &[u8]) -> String {
    hex::encode(sha2::Sha256::digest(b))
}

fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        if e.file_type().unwrap().is_dir() {
            copy_tree(&e.path(), &to.join(e.file_name()));
        } else {
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    }
}

/// A scratch box: two keys (`dev`, trusted; `other`, not), tiny bundles, a store and state.
struct Env {
    _dir: tempfile::TempDir,
    root: PathBuf,
    dev: SecretKey,
    other: SecretKey,
}

impl Env {
    fn new() -> Env {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().to_path_buf();
        std::fs::write(root.join("config.toml"), "").unwrap();
        let dev = generate("dev");
        dev.write_pair(&root.join("keys/dev"), false).unwrap();
        let other = generate("other");
        other.write_pair(&root.join("keys/other"), false).unwrap();
        Env { _dir: dir, root, dev, other }
    }

    fn p(&self, rel: &str) -> String {
        self.root.join(rel).to_string_lossy().into_owned()
    }

    fn src(&self, name: &str, version: u64) -> PathBuf {
        let src = self.root.join(format!("src-{name}-{version}"));
        std::fs::create_dir_all(src.join("model")).unwrap();
        std::fs::create_dir_all(src.join("tokenizer")).unwrap();
        std::fs::write(src.join("model/config.json"), format!("{{\"v\":{version}}}")).unwrap();
        let weights: Vec<u8> = (0..150_000u32).map(|i| (i.wrapping_mul(2654435761).wrapping_add(version as u32) >> 13) as u8).collect();
        std::fs::write(src.join("model/weights.safetensors"), weights).unwrap();
        std::fs::write(src.join("tokenizer/tokenizer.json"), b"{}").unwrap();
        src
    }

    /// `NAME-VERSION.zlb`, signed by `key`.
    fn bundle_by(&self, name: &str, version: u64, key: &SecretKey) -> PathBuf {
        let meta = BundleMeta {
            name: name.into(),
            version,
            created: "2026-01-01T00:00:00Z".into(),
            expires: "2099-01-01T00:00:00Z".into(),
            min_runtime: "0.1.0".into(),
            model: json!({"architecture": "test"}),
            kernels: None,
        };
        let out = self.root.join(format!("{name}-{version}.zlb"));
        pack_dir(&self.src(name, version), &meta, std::slice::from_ref(key), &out, &mut |_| {}).unwrap();
        out
    }

    fn bundle(&self, version: u64) -> PathBuf {
        self.bundle_by("tiny", version, &self.dev)
    }

    /// A bundle whose signature document holds no record (FORMAT.md §5 requires 1 to 64).
    fn unsigned_bundle(&self, version: u64) -> PathBuf {
        let src = self.src("tiny", version);
        let mut files = Vec::new();
        for rel in ["model/config.json", "model/weights.safetensors", "tokenizer/tokenizer.json"] {
            let b = std::fs::read(src.join(rel)).unwrap();
            files.push((Member { path: rel.into(), size: b.len() as u64, sha256: sha(&b) }, src.join(rel)));
        }
        let m = Manifest {
            format: FORMAT_V1.into(),
            name: "tiny".into(),
            version,
            created: "2026-01-01T00:00:00Z".into(),
            expires: "2099-01-01T00:00:00Z".into(),
            min_runtime: "0.1.0".into(),
            model: json!({"architecture": "test"}),
            members: files.iter().map(|(m, _)| m.clone()).collect(),
            extra: Default::default(),
        };
        let out = self.root.join(format!("unsigned-{version}.zlb"));
        let refs: Vec<(Member, &Path)> = files.iter().map(|(m, p)| (m.clone(), p.as_path())).collect();
        write_bundle(&out, &m.to_bytes().unwrap(), br#"{"signatures":[]}"#, &refs, &mut |_, _| {}).unwrap();
        out
    }

    fn run(&self, args: &[&str]) -> Output {
        Command::new(BIN).args(args).output().unwrap()
    }

    /// `bundle export BUNDLE DIR ARGS --trust dev.pub --config config.toml`.
    fn export(&self, bundle: &Path, dir: &str, args: &[&str]) -> Output {
        let mut a = vec!["bundle", "export", bundle.to_str().unwrap(), dir];
        a.extend_from_slice(args);
        let (t, c) = (self.p("keys/dev.pub"), self.p("config.toml"));
        a.extend_from_slice(&["--trust", &t, "--config", &c]);
        self.run(&a)
    }

    /// The lifecycle flags of install and import, with the store `store`.
    fn lifecycle(&self, sub: &[&str], store: &str) -> Output {
        let mut a: Vec<String> = vec!["bundle".into()];
        a.extend(sub.iter().map(|s| s.to_string()));
        for (k, v) in [("--trust", "keys/dev.pub"), ("--store", store), ("--state", "state"), ("--config", "config.toml")] {
            a.push(k.into());
            a.push(self.p(v));
        }
        Command::new(BIN).args(&a).output().unwrap()
    }

    fn import(&self, dir: &str, args: &[&str]) -> Output {
        let mut sub = vec!["import", dir];
        sub.extend_from_slice(args);
        self.lifecycle(&sub, "store")
    }
}

/// A layout read as a second implementation would (FORMAT.md §12).
struct Lay(PathBuf);

impl Lay {
    fn index(&self) -> Value {
        serde_json::from_slice(&std::fs::read(self.0.join("index.json")).unwrap()).unwrap()
    }
    fn blob_path(&self, digest: &str) -> PathBuf {
        self.0.join("blobs/sha256").join(digest.strip_prefix("sha256:").unwrap())
    }
    fn blob(&self, digest: &str) -> Vec<u8> {
        std::fs::read(self.blob_path(digest)).unwrap()
    }
    fn entry(&self, tag: &str) -> Value {
        self.index()["manifests"].as_array().unwrap().iter().find(|d| d["annotations"]["org.opencontainers.image.ref.name"] == tag).unwrap().clone()
    }
    fn manifest(&self, tag: &str) -> Value {
        serde_json::from_slice(&self.blob(self.entry(tag)["digest"].as_str().unwrap())).unwrap()
    }
    fn put(&self, bytes: &[u8]) -> String {
        std::fs::create_dir_all(self.0.join("blobs/sha256")).unwrap();
        let d = format!("sha256:{}", sha(bytes));
        std::fs::write(self.blob_path(&d), bytes).unwrap();
        d
    }
    /// Rewrite the manifest tagged `tag` consistently: the edited manifest becomes a new blob and
    /// the index entry points at it (so only the edit is wrong).
    fn edit_manifest(&self, tag: &str, edit: impl FnOnce(&mut Value)) {
        let mut m = self.manifest(tag);
        edit(&mut m);
        let bytes = serde_json::to_vec(&m).unwrap();
        let d = self.put(&bytes);
        self.edit_index(|idx| {
            for e in idx["manifests"].as_array_mut().unwrap() {
                if e["annotations"]["org.opencontainers.image.ref.name"] == tag {
                    e["digest"] = d.clone().into();
                    e["size"] = bytes.len().into();
                }
            }
        });
    }
    fn edit_index(&self, edit: impl FnOnce(&mut Value)) {
        let mut idx = self.index();
        edit(&mut idx);
        std::fs::write(self.0.join("index.json"), serde_json::to_vec(&idx).unwrap()).unwrap();
    }
}

/// Build a layout by hand from FORMAT.md §12 alone: `layer` is a `.zlb`, `config` the config
/// blob; tag `t`.
fn craft(dir: &Path, layer: &[u8], config: &[u8], annotations: Value) {
    let l = Lay(dir.to_path_buf());
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("oci-layout"), br#"{"imageLayoutVersion":"1.0.0"}"#).unwrap();
    let (ld, cd) = (l.put(layer), l.put(config));
    let m = json!({"schemaVersion": 2, "mediaType": MANIFEST, "artifactType": ARTIFACT,
        "config": {"mediaType": CONFIG, "digest": cd, "size": config.len()},
        "layers": [{"mediaType": LAYER, "digest": ld, "size": layer.len()}],
        "annotations": annotations});
    let mb = serde_json::to_vec(&m).unwrap();
    let md = l.put(&mb);
    let idx = json!({"schemaVersion": 2, "manifests": [{"mediaType": MANIFEST, "digest": md, "size": mb.len(),
        "annotations": {"org.opencontainers.image.ref.name": "t"}}]});
    std::fs::write(dir.join("index.json"), serde_json::to_vec(&idx).unwrap()).unwrap();
}

/// The config blob FORMAT.md §12.2 specifies, made from a bundle's control members by reading
/// the archive directly.
fn config_of(zlb: &Path) -> Vec<u8> {
    let dec = zstd::stream::read::Decoder::new(std::fs::File::open(zlb).unwrap()).unwrap();
    let mut ar = tar::Archive::new(dec);
    let mut got = Vec::new();
    for e in ar.entries().unwrap().take(2) {
        let mut e = e.unwrap();
        let mut s = String::new();
        std::io::Read::read_to_string(&mut e, &mut s).unwrap();
        got.push(s);
    }
    applianced::bundle::canonical::to_canonical(&json!({"manifest": got[0], "signatures": got[1]})).unwrap()
}

#[test]
fn export_then_import_installs_what_install_installs() {
    let e = Env::new();
    let zlb = e.bundle(1);
    let layout = e.p("usb/tiny");
    let j = json_ok(&e.export(&zlb, &layout, &["--json"]));
    assert_eq!(j["tag"], "1", "the default tag is the bundle's version");
    let l = Lay(PathBuf::from(&layout));

    // The layout, read as FORMAT.md §12 says.
    assert_eq!(std::fs::read(l.0.join("oci-layout")).unwrap(), br#"{"imageLayoutVersion":"1.0.0"}"#);
    let idx = l.index();
    assert_eq!(idx["schemaVersion"], 2);
    assert_eq!(idx["mediaType"], "application/vnd.oci.image.index.v1+json");
    assert_eq!(idx["manifests"].as_array().unwrap().len(), 1);
    let entry = l.entry("1");
    assert_eq!(entry["mediaType"], MANIFEST);
    assert_eq!(entry["artifactType"], ARTIFACT);
    assert_eq!(entry["digest"], j["manifest_digest"]);
    let mb = l.blob(entry["digest"].as_str().unwrap());
    assert_eq!(entry["size"], mb.len());
    let m: Value = serde_json::from_slice(&mb).unwrap();
    assert_eq!(m["schemaVersion"], 2);
    assert_eq!(m["mediaType"], MANIFEST);
    assert_eq!(m["artifactType"], ARTIFACT);
    assert_eq!(m["config"]["mediaType"], CONFIG);
    assert_eq!(l.blob(m["config"]["digest"].as_str().unwrap()), config_of(&zlb), "config = the signed manifest and signatures");
    let layers = m["layers"].as_array().unwrap();
    assert_eq!(layers.len(), 1);
    let zb = std::fs::read(&zlb).unwrap();
    assert_eq!(layers[0]["mediaType"], LAYER);
    assert_eq!(layers[0]["digest"], format!("sha256:{}", sha(&zb)), "the layer is the .zlb byte for byte");
    assert_eq!(layers[0]["size"], zb.len());
    assert_eq!(layers[0]["annotations"]["org.opencontainers.image.title"], "tiny-1.zlb");
    let a = &m["annotations"];
    assert_eq!(a["org.opencontainers.image.title"], "tiny-1.zlb");
    assert_eq!(a["org.opencontainers.image.version"], "1");
    assert_eq!(a["org.opencontainers.image.created"], "2026-01-01T00:00:00Z");
    assert_eq!(a["dev.applianced.bundle.name"], "tiny");
    assert_eq!(a["dev.applianced.bundle.version"], "1");
    assert_eq!(a["dev.applianced.bundle.identity"], j["identity"]);
    assert_eq!(a["dev.applianced.bundle.signers"], e.dev.public().id.as_str());
    // Every blob is named by its digest; nothing else was left in the layout.
    for f in std::fs::read_dir(l.0.join("blobs/sha256")).unwrap() {
        let f = f.unwrap();
        assert_eq!(f.file_name().to_str().unwrap(), sha(&std::fs::read(f.path()).unwrap()));
    }
    let top: Vec<String> = std::fs::read_dir(&l.0).unwrap().map(|f| f.unwrap().file_name().into_string().unwrap()).collect();
    assert_eq!(top.len(), 3, "{top:?}");

    // Export is deterministic: the same bundle gives the same layout.
    let again = e.p("usb/again");
    expect_ok(&e.export(&zlb, &again, &[]));
    assert_eq!(snapshot(Path::new(&again)), snapshot(&l.0));

    // Import equals install: the same entry, byte for byte, and the same report.
    let layout_before = snapshot(&l.0);
    let imp = json_ok(&e.import(&layout, &["--json"]));
    assert_eq!(snapshot(&l.0), layout_before, "import never writes to the layout");
    let ins = json_ok(&e.lifecycle(&["install", zlb.to_str().unwrap(), "--json"], "store-install"));
    for k in ["name", "version", "identity", "signers", "expires", "reused", "active", "content_bytes"] {
        assert_eq!(imp[k], ins[k], "{k}");
    }
    assert_eq!(imp["reused"], false);
    assert_eq!(imp["active"], false, "import installs inactive, like install");
    assert_eq!(imp["tag"], "1");
    assert_eq!(imp["manifest_digest"], entry["digest"]);
    let hex = imp["identity"].as_str().unwrap().strip_prefix("sha256:").unwrap().to_string();
    assert_eq!(snapshot(&e.root.join("store").join(&hex)), snapshot(&e.root.join("store-install").join(&hex)));
    let store_names: Vec<String> = std::fs::read_dir(e.root.join("store")).unwrap().map(|f| f.unwrap().file_name().into_string().unwrap()).collect();
    assert!(store_names.iter().all(|n| !n.starts_with(".tmp")), "no temporary copy is left: {store_names:?}");
    assert!(!e.root.join("state/accepted/tiny.json").exists(), "import, like install, accepts nothing until activation");
    // Importing again re-checks the existing entry; activation is install's: `bundle activate`.
    let out = expect_ok(&e.import(&layout, &[]));
    assert!(out.contains("imported from") && out.contains("existing entry re-checked") && out.contains("applianced bundle activate tiny@1"), "{out}");
    assert!(expect_ok(&e.lifecycle(&["activate", "tiny@1"], "store")).contains("activated tiny@1"));
}

#[test]
fn two_tags_in_one_layout() {
    let e = Env::new();
    let (b1, b2) = (e.bundle(1), e.bundle(2));
    let layout = e.p("layout");
    let j1 = json_ok(&e.export(&b1, &layout, &["--json"]));
    let j2 = json_ok(&e.export(&b2, &layout, &["--tag", "stable", "--json"]));
    let l = Lay(PathBuf::from(&layout));
    let tags: Vec<Value> = l.index()["manifests"].as_array().unwrap().iter().map(|d| d["annotations"]["org.opencontainers.image.ref.name"].clone()).collect();
    assert_eq!(tags, [json!("1"), json!("stable")]);

    // Without --tag or --digest: two bundles, a clear error naming the tags (exit 15).
    expect_fail(&e.import(&layout, &[]), 15, "2 applianced bundles in the layout (tags: 1, stable); choose one with --tag or --digest");
    expect_fail(&e.import(&layout, &["--tag", "nope"]), 15, "no manifest is tagged \"nope\" (tags: 1, stable)");
    expect_fail(&e.import(&layout, &["--digest", &format!("sha256:{}", "0".repeat(64))]), 15, "no manifest sha256:0000");
    assert_eq!(e.import(&layout, &["--tag", "1", "--digest", "sha256:00"]).status.code(), Some(2), "--tag and --digest exclude each other");
    let i2 = json_ok(&e.import(&layout, &["--tag", "stable", "--json"]));
    assert_eq!((i2["version"].as_u64(), &i2["identity"]), (Some(2), &j2["identity"]));
    let i1 = json_ok(&e.import(&layout, &["--digest", j1["manifest_digest"].as_str().unwrap(), "--json"]));
    assert_eq!((i1["version"].as_u64(), &i1["identity"]), (Some(1), &j1["identity"]));

    // The same tag again moves it: the entry that had it is replaced, other entries stay.
    let out = expect_ok(&e.export(&b1, &layout, &["--tag", "stable"]));
    assert!(out.contains(&format!("tag stable moved from {}", j2["manifest_digest"].as_str().unwrap())), "{out}");
    let idx = l.index();
    let entries = idx["manifests"].as_array().unwrap();
    assert_eq!(entries.len(), 2);
    assert!(entries.iter().all(|d| d["digest"] == j1["manifest_digest"]), "both tags now name version 1: {idx}");
    assert_eq!(json_ok(&e.import(&layout, &["--tag", "stable", "--json"]))["version"], 1);
    // Only one bundle left (under two tags): no tag needed.
    assert_eq!(json_ok(&e.import(&layout, &["--json"]))["version"], 1);
    // Another tool's entries in the same layout are kept as they were.
    l.edit_index(|idx| {
        idx["manifests"].as_array_mut().unwrap().push(json!({"mediaType": "application/vnd.oci.image.index.v1+json",
            "digest": format!("sha256:{}", "1".repeat(64)), "size": 10, "platform": {"os": "linux"},
            "annotations": {"org.opencontainers.image.ref.name": "someone-elses"}}))
    });
    expect_ok(&e.export(&b2, &layout, &["--tag", "2"]));
    let idx = l.index();
    assert_eq!(idx["manifests"][2]["platform"]["os"], "linux", "{idx}");
    assert_eq!(idx["manifests"].as_array().unwrap().len(), 4);
    expect_fail(&e.import(&layout, &["--tag", "someone-elses"]), 4, "not an image manifest");

    // Export refuses a bad tag (usage) and a directory that is not a layout.
    assert_eq!(e.export(&b1, &layout, &["--tag", "a/b"]).status.code(), Some(2));
    std::fs::create_dir_all(e.root.join("home")).unwrap();
    std::fs::write(e.root.join("home/notes.txt"), b"mine").unwrap();
    expect_fail(&e.export(&b1, &e.p("home"), &[]), 4, "not empty and has no oci-layout file");
    assert_eq!(std::fs::read_dir(e.root.join("home")).unwrap().count(), 1, "nothing written");
}

/// One hostile layout: what it changes and the refusal it must produce.
struct Case {
    name: &'static str,
    code: i32,
    needle: String,
    tag: &'static str,
}

#[test]
fn hostile_layouts_are_refused_and_leave_the_store_unchanged() {
    let e = Env::new();
    let (b1, b2) = (e.bundle(1), e.bundle(2));
    // The store already holds a bundle (and its lock file): what must not change.
    expect_ok(&e.lifecycle(&["install", b1.to_str().unwrap()], "store"));
    let pristine = e.p("pristine");
    expect_ok(&e.export(&b1, &pristine, &[]));
    expect_ok(&e.export(&b2, &pristine, &[]));
    let p = Lay(PathBuf::from(&pristine));
    let m2 = p.manifest("2");
    let layer = m2["layers"][0]["digest"].as_str().unwrap().to_string();
    let layer_size = m2["layers"][0]["size"].as_u64().unwrap();
    let entry2 = p.entry("2");
    let man_digest = entry2["digest"].as_str().unwrap().to_string();
    let man_size = entry2["size"].as_u64().unwrap();
    let config1 = p.manifest("1")["config"].clone();
    let ghost = format!("sha256:{}", sha(b"not in the layout"));

    let mut n = 0;
    let mut check = |c: Case, mutate: &dyn Fn(&Lay)| {
        n += 1;
        let dir = e.root.join(format!("case-{n}"));
        copy_tree(Path::new(&pristine), &dir);
        let l = Lay(dir.clone());
        mutate(&l);
        let store = snapshot(&e.root.join("store"));
        let before = snapshot(&dir);
        let args: Vec<&str> = if c.tag.is_empty() { vec![] } else { vec!["--tag", c.tag] };
        let o = e.import(dir.to_str().unwrap(), &args);
        let line = stderr(&o);
        assert_eq!(o.status.code(), Some(c.code), "{}: {line}", c.name);
        assert!(line.starts_with("error: ") && line.contains(&c.needle), "{}: expected {:?}: {line}", c.name, c.needle);
        assert_eq!(line.trim_end().lines().count(), 1, "{}: one line: {line}", c.name);
        assert!(snapshot(&e.root.join("store")) == store, "{}: the store changed", c.name);
        assert!(snapshot(&dir) == before, "{}: import wrote to the layout", c.name);
    };
    let case = |name, code, needle: &str| Case { name, code, needle: needle.to_string(), tag: "2" };

    check(case("flipped layer byte", 7, &format!("layer blob {layer}: digest mismatch")), &|l| {
        let mut b = l.blob(&layer);
        let i = b.len() / 2;
        b[i] ^= 0x40;
        std::fs::write(l.blob_path(&layer), b).unwrap();
    });
    check(case("truncated layer", 7, &format!("layer blob {layer}: size mismatch (descriptor says {layer_size} bytes, blob has 1000)")), &|l| {
        let b = l.blob(&layer);
        std::fs::write(l.blob_path(&layer), &b[..1000]).unwrap();
    });
    check(case("layer descriptor claims a byte more", 7, &format!("layer blob {layer}: size mismatch (descriptor says {} bytes, blob has {layer_size})", layer_size + 1)), &|l| {
        l.edit_manifest("2", |m| m["layers"][0]["size"] = (layer_size + 1).into())
    });
    check(case("layer descriptor claims less", 7, "size mismatch (descriptor says 512 bytes"), &|l| l.edit_manifest("2", |m| m["layers"][0]["size"] = 512.into()));
    check(case("index lies about the manifest's size", 7, &format!("manifest blob {man_digest}: size mismatch (descriptor says {} bytes, blob has {man_size})", man_size + 5)), &|l| {
        l.edit_index(|idx| {
            for x in idx["manifests"].as_array_mut().unwrap() {
                if x["digest"] == man_digest {
                    x["size"] = (man_size + 5).into();
                }
            }
        })
    });
    check(case("edited manifest, index not updated", 7, &format!("manifest blob {man_digest}: digest mismatch")), &|l| {
        let b = l.blob(&man_digest);
        let s = String::from_utf8(b).unwrap().replace("tiny-2.zlb", "tiny-9.zlb");
        std::fs::write(l.blob_path(&man_digest), s).unwrap();
    });
    check(case("manifest points at a missing layer", 7, &format!("layer blob {ghost} is missing")), &|l| l.edit_manifest("2", |m| m["layers"][0]["digest"] = ghost.clone().into()));
    check(case("config blob deleted", 7, "config blob sha256:"), &|l| std::fs::remove_file(l.blob_path(l.manifest("2")["config"]["digest"].as_str().unwrap())).unwrap());
    check(case("manifest blob deleted", 7, &format!("manifest blob {man_digest} is missing")), &|l| std::fs::remove_file(l.blob_path(&man_digest)).unwrap());
    check(case("path-traversal digest in the index", 4, "manifest descriptor: invalid digest \"sha256:../../x\""), &|l| {
        l.edit_index(|idx| idx["manifests"][1]["digest"] = "sha256:../../x".into())
    });
    check(case("path-traversal digest of the layer", 4, "layer descriptor: invalid digest \"sha256:../../../etc/passwd\""), &|l| {
        l.edit_manifest("2", |m| m["layers"][0]["digest"] = "sha256:../../../etc/passwd".into())
    });
    let nonhex = format!("sha256:{}", "g".repeat(64));
    check(case("non-hex digest", 4, &format!("invalid digest {nonhex:?}: sha256 needs exactly 64 lowercase hex digits")), &|l| {
        l.edit_index(|idx| idx["manifests"][1]["digest"] = nonhex.clone().into())
    });
    check(case("uppercase hex digest", 4, "invalid digest"), &|l| l.edit_index(|idx| idx["manifests"][1]["digest"] = man_digest.to_uppercase().replace("SHA256", "sha256").into()));
    check(case("another digest algorithm", 4, "algorithm \"sha512\" is not supported"), &|l| {
        l.edit_index(|idx| idx["manifests"][1]["digest"] = format!("sha512:{}", "a".repeat(128)).into())
    });
    check(case("huge index.json", 4, "index.json exceeds the 4194304-byte cap"), &|l| {
        let mut b = vec![b' '; 5 << 20];
        b.extend_from_slice(&std::fs::read(l.0.join("index.json")).unwrap());
        std::fs::write(l.0.join("index.json"), b).unwrap();
    });
    check(case("index.json not JSON", 4, "index.json: not an OCI image index"), &|l| std::fs::write(l.0.join("index.json"), b"{\"schemaVersion\":2,").unwrap());
    check(case("no oci-layout", 4, "no oci-layout file"), &|l| std::fs::remove_file(l.0.join("oci-layout")).unwrap());
    check(case("negative size", 4, "negative size"), &|l| l.edit_index(|idx| idx["manifests"][1]["size"] = (-1).into()));
    check(case("huge config", 4, "exceeds the 16777216-byte cap"), &|l| l.edit_manifest("2", |m| m["config"]["size"] = (1u64 << 40).into()));
    check(case("not a bundle artifact", 4, "not an applianced bundle: artifactType \"application/vnd.example.other\""), &|l| {
        l.edit_manifest("2", |m| m["artifactType"] = "application/vnd.example.other".into())
    });
    check(case("layer media type", 4, "layer mediaType \"application/vnd.oci.image.layer.v1.tar+zstd\""), &|l| {
        l.edit_manifest("2", |m| m["layers"][0]["mediaType"] = "application/vnd.oci.image.layer.v1.tar+zstd".into())
    });
    check(case("two layers", 4, "2 layers (a bundle artifact has exactly one)"), &|l| {
        l.edit_manifest("2", |m| {
            let x = m["layers"][0].clone();
            m["layers"].as_array_mut().unwrap().push(x);
        })
    });
    check(case("config is not a bundle config", 4, "not a bundle config"), &|l| {
        let d = l.put(b"{}");
        l.edit_manifest("2", |m| m["config"] = json!({"mediaType": CONFIG, "digest": d, "size": 2}))
    });
    check(case("annotation names another version", 7, "annotation dev.applianced.bundle.version is \"99\" but the signed bundle manifest says \"2\""), &|l| {
        l.edit_manifest("2", |m| m["annotations"]["dev.applianced.bundle.version"] = "99".into())
    });
    check(case("config of version 1, layer of version 2", 7, "the layer holds bundle"), &|l| {
        l.edit_manifest("2", |m| {
            m["config"] = config1.clone();
            m["annotations"] = json!({});
        })
    });
    check(case("symlinked layer", 4, &format!("layer blob {layer} is not a regular file")), &|l| {
        let real = l.0.join("elsewhere.zlb");
        std::fs::rename(l.blob_path(&layer), &real).unwrap();
        std::os::unix::fs::symlink(&real, l.blob_path(&layer)).unwrap();
    });
    check(case("a FIFO as the layer", 4, "is not a regular file"), &|l| {
        std::fs::remove_file(l.blob_path(&layer)).unwrap();
        assert!(Command::new("mkfifo").arg(l.blob_path(&layer)).status().unwrap().success());
    });
    check(Case { name: "no tag, two bundles", code: 15, needle: "2 applianced bundles".into(), tag: "" }, &|_| {});
    assert_eq!(n, 28);

    // The same layout, untouched, imports (so each refusal above was the edit's).
    let o = e.import(&pristine, &["--tag", "2"]);
    assert!(expect_ok(&o).contains("tiny version 2: imported"));
}

#[test]
fn untrusted_bundles_are_refused_at_export_and_at_import() {
    let e = Env::new();
    expect_ok(&e.lifecycle(&["install", e.bundle(1).to_str().unwrap()], "store"));
    let store = snapshot(&e.root.join("store"));

    // Export: a bundle by an untrusted key, and one without signatures, create nothing.
    let wrong = e.bundle_by("tiny", 3, &e.other);
    let line = expect_fail(&e.export(&wrong, &e.p("out-wrong"), &[]), 5, "signature threshold not met: 0 of 1 required trusted signatures");
    assert!(line.contains(&format!("{} (untrusted)", e.other.public().id)), "{line}");
    assert!(!e.root.join("out-wrong").exists());
    let unsigned = e.unsigned_bundle(4);
    expect_fail(&e.export(&unsigned, &e.p("out-unsigned"), &[]), 4, "signatures: 0 signature records (1-64 allowed)");
    assert!(!e.root.join("out-unsigned").exists());
    // An existing layout is left as it was.
    expect_ok(&e.export(&e.bundle(1), &e.p("existing"), &[]));
    let existing = snapshot(&e.root.join("existing"));
    expect_fail(&e.export(&wrong, &e.p("existing"), &[]), 5, "signature threshold not met");
    assert!(snapshot(&e.root.join("existing")) == existing);

    // A bundle whose signed head is fine but whose data is damaged fails the full verification of
    // the copy: nothing is exported, a new directory is removed again, a layout keeps its files.
    let mut b = std::fs::read(e.bundle(6)).unwrap();
    let i = b.len() - 40;
    b[i] ^= 0x20;
    let damaged = e.root.join("damaged-6.zlb");
    std::fs::write(&damaged, b).unwrap();
    for dir in ["out-damaged", "existing"] {
        let o = e.export(&damaged, &e.p(dir), &[]);
        assert!(matches!(o.status.code(), Some(4 | 7)), "{}", stderr(&o));
        assert_eq!(stderr(&o).lines().count(), 1, "{}", stderr(&o));
    }
    assert!(!e.root.join("out-damaged").exists());
    assert!(snapshot(&e.root.join("existing")) == existing, "no temporary file is left in the layout");

    // Import: the same bundles in layouts made by hand (FORMAT.md §12 alone), refused with the
    // same line `bundle install` prints, before the layer is read, and the store is unchanged.
    let annotations = json!({"dev.applianced.bundle.name": "tiny"});
    for (name, zlb) in [("wrong", &wrong), ("unsigned", &unsigned)] {
        let dir = e.root.join(format!("crafted-{name}"));
        craft(&dir, &std::fs::read(zlb).unwrap(), &config_of(zlb), annotations.clone());
        let want = stderr(&e.lifecycle(&["install", zlb.to_str().unwrap()], "store"));
        let o = e.import(dir.to_str().unwrap(), &[]);
        assert_eq!(stderr(&o), want, "{name}: import refuses as install does");
        expect_fail(&o, if name == "wrong" { 5 } else { 4 }, if name == "wrong" { "signature threshold not met" } else { "0 signature records" });
        assert!(snapshot(&e.root.join("store")) == store, "{name}: the store changed");
        // The config alone decides: with the layer gone, the refusal is the same.
        let layer = Lay(dir.clone()).manifest("t")["layers"][0]["digest"].as_str().unwrap().to_string();
        std::fs::remove_file(Lay(dir.clone()).blob_path(&layer)).unwrap();
        assert_eq!(stderr(&e.import(dir.to_str().unwrap(), &[])), want, "{name}: refused before the layer is read");
    }
    // A trusted config with an untrusted layer: the parts disagree (exit 7).
    let dir = e.root.join("crafted-swap");
    let good = e.bundle(5);
    craft(&dir, &std::fs::read(&wrong).unwrap(), &config_of(&good), json!({}));
    expect_fail(&e.import(dir.to_str().unwrap(), &[]), 7, "the layer holds bundle");
    assert!(snapshot(&e.root.join("store")) == store);
    // A hand-made layout of a good bundle imports (the spec is enough to write one).
    let dir = e.root.join("crafted-good");
    craft(&dir, &std::fs::read(&good).unwrap(), &config_of(&good), json!({"dev.applianced.bundle.version": "5"}));
    assert_eq!(json_ok(&e.import(dir.to_str().unwrap(), &["--json"]))["version"], 5);
}

#[test]
fn downgrade_is_refused_with_the_rollback_code() {
    let e = Env::new();
    let (b1, b2) = (e.bundle(1), e.bundle(2));
    expect_ok(&e.lifecycle(&["install", b2.to_str().unwrap()], "store"));
    expect_ok(&e.lifecycle(&["activate", "tiny@2"], "store"));
    // Export has no rollback state here (no --state): version 1 exports.
    let layout = e.p("layout");
    expect_ok(&e.export(&b1, &layout, &[]));
    let store = snapshot(&e.root.join("store"));
    let state = snapshot(&e.root.join("state"));
    let line = expect_fail(&e.import(&layout, &[]), 9, "rollback refused: bundle tiny version 1 is older than accepted version 2");
    assert_eq!(line, stderr(&e.lifecycle(&["install", b1.to_str().unwrap()], "store")), "the same line as install");
    assert!(snapshot(&e.root.join("store")) == store);
    assert!(snapshot(&e.root.join("state")) == state);
    // With the rollback state, export refuses it too.
    let st = e.p("state");
    let o = e.export(&b1, &e.p("layout-2"), &["--state", &st]);
    expect_fail(&o, 9, "rollback refused");
}

#[test]
fn skopeo_copy_keeps_the_artifact_importable() {
    let have = Command::new("sh").args(["-c", "command -v skopeo"]).output().is_ok_and(|o| o.status.success());
    if !have {
        assert!(std::env::var_os("APPLIANCED_SLOW_TESTS").is_none(), "APPLIANCED_SLOW_TESTS is set but skopeo is not installed (scripts/setup-test-env.sh installs it)");
        println!("skipped: skopeo is not installed");
        return;
    }
    let e = Env::new();
    let zlb = e.bundle(1);
    let (a, b) = (e.p("a"), e.p("b"));
    let j = json_ok(&e.export(&zlb, &a, &["--tag", "ring0", "--json"]));
    let o = Command::new("skopeo").args(["--insecure-policy", "copy", "--quiet", &format!("oci:{a}:ring0"), &format!("oci:{b}:ring0")]).output().unwrap();
    assert!(o.status.success(), "skopeo copy: {}{}", stdout(&o), stderr(&o));
    // skopeo keeps the manifest byte for byte (so its digest) and every blob.
    let lb = Lay(PathBuf::from(&b));
    assert_eq!(lb.entry("ring0")["digest"], j["manifest_digest"]);
    let imp = json_ok(&e.import(&b, &["--tag", "ring0", "--json"]));
    assert_eq!(imp["identity"], j["identity"]);
    assert_eq!(imp["manifest_digest"], j["manifest_digest"]);
    // And without a tag: skopeo's index entry may lack artifactType; the manifest says it.
    let imp = json_ok(&e.import(&b, &["--json"]));
    assert_eq!(imp["reused"], true);
}
