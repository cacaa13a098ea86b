//! `bundle export` and `bundle import` (FORMAT.md §12.4, §12.5): a verified bundle into an OCI
//! image layout, and the bundle artifact of a layout into the store, through the same checks as
//! `bundle install`.

use std::collections::BTreeMap;
use std::path::Path;

use super::layout::Layout;
use super::{
    BundleConfig, Descriptor, Digest, ImageManifest, Index, OciError, Origin, ANNOTATION_BUNDLE_IDENTITY, ANNOTATION_BUNDLE_NAME, ANNOTATION_BUNDLE_SIGNERS, ANNOTATION_BUNDLE_VERSION,
    ANNOTATION_CREATED, ANNOTATION_TITLE, ANNOTATION_VERSION, ARTIFACT_TYPE_BUNDLE, MAX_CONFIG_BYTES, MAX_UNTYPED_CANDIDATES, MEDIA_TYPE_BUNDLE_CONFIG, MEDIA_TYPE_BUNDLE_LAYER,
    MEDIA_TYPE_IMAGE_MANIFEST,
};
use crate::bundle::manifest::{MAX_MANIFEST_BYTES as MAX_BUNDLE_MANIFEST_BYTES, MAX_SIGNATURES_BYTES};
use crate::bundle::reader::{self, Head};
use crate::bundle::{identity_of, verify_file, BundleError, FormatError, Manifest, Store, Verified, VerifiedBundle, VerifyOptions, MANIFEST_NAME, SIGNATURES_NAME};
use crate::trust::SignatureRecord;

/// Which pass a progress report is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Copying the bundle into the layout (export) or the layer out of it (import).
    Copy,
    /// The bundle reader (signatures, every member's digest; unpacking on import).
    Verify,
}

/// What `export` wrote.
#[derive(Debug)]
pub struct Exported {
    pub verified: Verified,
    pub tag: String,
    /// The `index.json` entry (the image manifest's descriptor).
    pub manifest: Descriptor,
    pub layer: Descriptor,
    /// Entries that held the tag before (removed from the index; their blobs stay).
    pub replaced: Vec<Descriptor>,
}

/// The manifest annotations of a verified bundle (FORMAT.md §12.3).
pub fn annotations(v: &Verified, file_name: &str) -> BTreeMap<String, String> {
    let m = v.manifest();
    [
        (ANNOTATION_TITLE, file_name.to_string()),
        (ANNOTATION_VERSION, m.version.to_string()),
        (ANNOTATION_CREATED, m.created.clone()),
        (ANNOTATION_BUNDLE_NAME, m.name.clone()),
        (ANNOTATION_BUNDLE_VERSION, m.version.to_string()),
        (ANNOTATION_BUNDLE_IDENTITY, v.identity().to_string()),
        (ANNOTATION_BUNDLE_SIGNERS, v.signers().join(",")),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

/// The image manifest of a verified bundle whose `.zlb` is the blob `layer`.
pub fn artifact_manifest(v: &Verified, file_name: &str, config: Descriptor, mut layer: Descriptor) -> ImageManifest {
    layer.annotations.insert(ANNOTATION_TITLE.into(), file_name.into());
    ImageManifest {
        schema_version: 2,
        media_type: Some(MEDIA_TYPE_IMAGE_MANIFEST.into()),
        artifact_type: Some(ARTIFACT_TYPE_BUNDLE.into()),
        config,
        layers: vec![layer],
        subject: None,
        annotations: annotations(v, file_name),
    }
}

/// The config blob and the image manifest of a bundle artifact: what `export` writes into a
/// layout and `push` to a registry. The same bundle, file name and layer give the same bytes.
pub(crate) struct ArtifactParts {
    pub config: Vec<u8>,
    pub manifest: ImageManifest,
    /// The manifest as pushed and hashed (its digest names the artifact).
    pub manifest_bytes: Vec<u8>,
}

pub(crate) fn artifact_parts(v: &Verified, file_name: &str, layer_digest: &Digest, layer_size: u64, at: &Origin) -> Result<ArtifactParts, OciError> {
    let config = BundleConfig::new(v.manifest_bytes(), v.signatures_bytes())?.to_bytes();
    let layer = Descriptor::new(MEDIA_TYPE_BUNDLE_LAYER, layer_digest, layer_size);
    let manifest = artifact_manifest(v, file_name, Descriptor::new(MEDIA_TYPE_BUNDLE_CONFIG, &Digest::of(&config), config.len() as u64), layer);
    let manifest_bytes = serde_json::to_vec(&manifest).map_err(|e| OciError::Malformed { dir: at.clone(), msg: format!("manifest: {e}") })?;
    Ok(ArtifactParts { config, manifest, manifest_bytes })
}

/// `bundle export`: write the bundle at `bundle` into the layout `dir` under `tag` (default: the
/// bundle's version).
///
/// The bundle's control members are checked against `opts` first (signatures, threshold,
/// revocations, runtime, expiry, rollback state when given), so an untrusted bundle creates
/// nothing. The file is then copied into a temporary file inside the layout while its SHA-256 is
/// computed, and that copy (the exact bytes that become the layer) goes through the bundle
/// reader — every member's digest — before it is renamed to its digest. The config and the
/// manifest follow, and `index.json` is replaced last. When `dir` did not exist and export fails,
/// what it created is removed again. `opts.record_state` should be off: exporting accepts nothing.
pub fn export_bundle(bundle: &Path, dir: &Path, tag: Option<&str>, opts: &VerifyOptions<'_>, progress: &mut dyn FnMut(Phase, u64, u64)) -> Result<Exported, OciError> {
    if let Some(t) = tag.filter(|t| !super::valid_tag(t)) {
        return Err(OciError::Malformed { dir: dir.into(), msg: format!("tag {t:?} is not a valid tag ([A-Za-z0-9_][A-Za-z0-9._-]*, at most 128 characters)") });
    }
    let head = reader::read_head(bundle)?;
    let _ = reader::check_head_only(&head, opts)?;
    let existed = dir.exists();
    let fresh = !existed || std::fs::read_dir(dir).is_ok_and(|mut rd| rd.next().is_none());
    let res = export_into(bundle, dir, tag, &head, opts, progress);
    if res.is_err() && fresh {
        remove_new_layout(dir, !existed);
    }
    res
}

fn export_into(bundle: &Path, dir: &Path, tag: Option<&str>, head: &Head, opts: &VerifyOptions<'_>, progress: &mut dyn FnMut(Phase, u64, u64)) -> Result<Exported, OciError> {
    let layout = Layout::create(dir)?;
    let mut verified = None;
    let progress = std::cell::RefCell::new(progress);
    let (layer_digest, layer_size) = layout.put_blob_file(
        bundle,
        &mut |copy| {
            let v = verify_file(copy, opts, None, &mut |d, t| (progress.borrow_mut())(Phase::Verify, d, t))?;
            if v.manifest_bytes() != head.manifest_bytes.as_slice() {
                return Err(OciError::Mismatch { dir: dir.into(), msg: format!("{} changed while it was exported", bundle.display()) });
            }
            verified = Some(v);
            Ok(())
        },
        &mut |d, t| (progress.borrow_mut())(Phase::Copy, d, t),
    )?;
    let Some(v) = verified else {
        return Err(OciError::Mismatch { dir: dir.into(), msg: "the copy was not verified".into() });
    };
    let tag = tag.map(str::to_string).unwrap_or_else(|| v.manifest().version.to_string());
    let file_name = bundle.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| format!("{}-{}.zlb", v.manifest().name, v.manifest().version));
    let ArtifactParts { config, manifest: m, manifest_bytes: bytes } = artifact_parts(&v, &file_name, &layer_digest, layer_size, &dir.into())?;
    layout.put_blob_bytes(&config)?;
    let manifest_digest = layout.put_blob_bytes(&bytes)?;
    let mut entry = Descriptor::new(MEDIA_TYPE_IMAGE_MANIFEST, &manifest_digest, bytes.len() as u64);
    entry.artifact_type = Some(ARTIFACT_TYPE_BUNDLE.into());
    let replaced = layout.tag_manifest(entry.clone(), &tag)?;
    entry.annotations.insert(super::ANNOTATION_REF_NAME.into(), tag.clone());
    let layer = m.layers.into_iter().next().unwrap_or_else(|| Descriptor::new(MEDIA_TYPE_BUNDLE_LAYER, &layer_digest, layer_size));
    let replaced = replaced.into_iter().filter(|d| d.digest != entry.digest).collect();
    Ok(Exported { verified: v, tag, manifest: entry, layer, replaced })
}

/// Undo a failed export into a new or empty directory: remove only what export creates there
/// (directories only when empty), and the directory itself when export created it.
fn remove_new_layout(dir: &Path, remove_root: bool) {
    let _ = std::fs::remove_file(dir.join(super::layout::LAYOUT_FILE));
    for rel in [super::layout::BLOBS_DIR, "blobs"] {
        let _ = std::fs::remove_dir(dir.join(rel));
    }
    if remove_root {
        let _ = std::fs::remove_dir(dir);
    }
}

/// Which artifact of a layout to import.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Selector {
    /// The entry whose `org.opencontainers.image.ref.name` is this tag.
    Tag(String),
    /// The entry with this manifest digest.
    Digest(String),
    /// The only bundle artifact in the layout.
    Only,
}

/// What `import` installed.
#[derive(Debug)]
pub struct Imported {
    pub bundle: VerifiedBundle,
    /// The chosen `index.json` entry.
    pub entry: Descriptor,
}

fn tags_of(idx: &Index) -> String {
    let t: Vec<String> = idx.manifests.iter().map(|d| d.ref_name().map_or_else(|| format!("untagged {}", d.digest), |t| t.to_string())).collect();
    if t.is_empty() {
        "none".into()
    } else {
        t.join(", ")
    }
}

/// Pick the index entry (FORMAT.md §12.5 step 3) and read its manifest, verified.
fn select(layout: &Layout, idx: &Index, sel: &Selector) -> Result<(Descriptor, ImageManifest), OciError> {
    let dir = layout.root();
    let not_found = |msg: String| OciError::NotFound { dir: dir.into(), msg };
    let chosen: Vec<&Descriptor> = match sel {
        Selector::Tag(t) => {
            let m: Vec<&Descriptor> = idx.manifests.iter().filter(|d| d.ref_name() == Some(t.as_str())).collect();
            if m.is_empty() {
                return Err(not_found(format!("no manifest is tagged {t:?} (tags: {})", tags_of(idx))));
            }
            m
        }
        Selector::Digest(s) => {
            let d = Digest::parse(s).map_err(|why| OciError::InvalidDigest { dir: dir.into(), context: "--digest".into(), digest: s.clone(), why })?;
            let want = d.to_string();
            let m: Vec<&Descriptor> = idx.manifests.iter().filter(|x| x.digest == want).collect();
            if m.is_empty() {
                return Err(not_found(format!("no manifest {want} in index.json (tags: {})", tags_of(idx))));
            }
            m
        }
        Selector::Only => {
            let mut found = Vec::new();
            let mut opened = 0;
            for d in idx.manifests.iter().filter(|d| d.media_type == MEDIA_TYPE_IMAGE_MANIFEST) {
                match d.artifact_type.as_deref() {
                    Some(ARTIFACT_TYPE_BUNDLE) => found.push(d),
                    Some(_) => {}
                    None => {
                        // Tools that copy a layout may drop the descriptor's artifactType: look inside.
                        opened += 1;
                        if opened > MAX_UNTYPED_CANDIDATES {
                            return Err(not_found(format!("more than {MAX_UNTYPED_CANDIDATES} manifests without an artifactType; choose one with --tag or --digest")));
                        }
                        if layout.read_manifest(d)?.0.is_bundle() {
                            found.push(d);
                        }
                    }
                }
            }
            found
        }
    };
    let mut digests: Vec<&str> = chosen.iter().map(|d| d.digest.as_str()).collect();
    digests.sort();
    digests.dedup();
    let entry = match (digests.len(), sel) {
        (0, _) => return Err(not_found(format!("no applianced bundle in the layout (index.json: {})", tags_of(idx)))),
        (1, _) => chosen[0].clone(),
        (n, Selector::Tag(t)) => return Err(not_found(format!("tag {t:?} names {n} different manifests; choose one with --digest"))),
        (n, _) => {
            let names: Vec<String> = chosen.iter().map(|d| d.ref_name().map_or_else(|| d.digest.clone(), str::to_string)).collect();
            return Err(not_found(format!("{n} applianced bundles in the layout (tags: {}); choose one with --tag or --digest", names.join(", "))));
        }
    };
    if entry.media_type != MEDIA_TYPE_IMAGE_MANIFEST {
        return Err(OciError::Malformed { dir: dir.into(), msg: format!("{} is a {:?}, not an image manifest: a bundle is a single image manifest", entry.digest, entry.media_type) });
    }
    let (m, _) = layout.read_manifest(&entry)?;
    Ok((entry, m))
}

/// Check that a manifest is a bundle artifact (FORMAT.md §12.5 step 5); returns its one layer.
pub(crate) fn check_artifact(dir: &Origin, m: &ImageManifest, digest: &str) -> Result<Descriptor, OciError> {
    let bad = |msg: String| OciError::Malformed { dir: dir.clone(), msg: format!("manifest {digest}: {msg}") };
    if !m.is_bundle() {
        return Err(bad(format!(
            "not an applianced bundle: artifactType {:?}, config mediaType {:?} (expected {ARTIFACT_TYPE_BUNDLE}, or no artifactType and {MEDIA_TYPE_BUNDLE_CONFIG})",
            m.artifact_type.as_deref().unwrap_or("none"),
            m.config.media_type
        )));
    }
    if m.config.media_type != MEDIA_TYPE_BUNDLE_CONFIG {
        return Err(bad(format!("config mediaType {:?} (expected {MEDIA_TYPE_BUNDLE_CONFIG})", m.config.media_type)));
    }
    match m.layers.as_slice() {
        [l] if l.media_type == MEDIA_TYPE_BUNDLE_LAYER => Ok(l.clone()),
        [l] => Err(bad(format!("layer mediaType {:?} (expected {MEDIA_TYPE_BUNDLE_LAYER})", l.media_type))),
        ls => Err(bad(format!("{} layers (a bundle artifact has exactly one)", ls.len()))),
    }
}

/// Trust and policy on the config's control members alone, before the layer is read: signatures
/// over the exact manifest bytes first, then the manifest, runtime, expiry and rollback state —
/// the checks of FORMAT.md §8 steps 3–4. The bundle reader repeats them at install.
pub(crate) fn precheck(cfg: &BundleConfig, opts: &VerifyOptions<'_>) -> Result<(Head, Vec<String>), BundleError> {
    let (mb, sb) = (cfg.manifest.as_bytes(), cfg.signatures.as_bytes());
    for (name, b, cap) in [(MANIFEST_NAME, mb, MAX_BUNDLE_MANIFEST_BYTES), (SIGNATURES_NAME, sb, MAX_SIGNATURES_BYTES)] {
        if b.len() as u64 > cap {
            return Err(FormatError::Member { path: name.into(), msg: format!("{} bytes exceeds cap {cap}", b.len()) }.into());
        }
    }
    // The signature document's rules of FORMAT.md §5, as the reader applies them.
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Sigs {
        signatures: Vec<SignatureRecord>,
    }
    let v = crate::bundle::canonical::parse_canonical(sb).map_err(FormatError::Signatures)?;
    let sigs: Sigs = serde_json::from_value(v).map_err(|e| FormatError::Signatures(e.to_string()))?;
    if sigs.signatures.is_empty() || sigs.signatures.len() > 64 {
        return Err(FormatError::Signatures(format!("{} signature records (1-64 allowed)", sigs.signatures.len())).into());
    }
    if sigs.signatures.windows(2).any(|w| w[0].key_id >= w[1].key_id) {
        return Err(FormatError::Signatures("records not sorted by key_id or duplicated".into()).into());
    }
    opts.trust.verify_manifest(mb, &sigs.signatures)?;
    let head = Head { manifest: Manifest::parse(mb)?, manifest_bytes: mb.to_vec(), signatures_bytes: sb.to_vec(), signatures: sigs.signatures };
    let signers = reader::check_head_only(&head, opts)?;
    Ok((head, signers))
}

/// Annotations are informational, but one that names another bundle than the signed manifest
/// in the config is a lie: refuse it.
pub(crate) fn check_annotations(dir: &Origin, m: &ImageManifest, head: &Head, digest: &str) -> Result<(), OciError> {
    let identity = identity_of(&head.manifest_bytes);
    for (key, want) in [(ANNOTATION_BUNDLE_IDENTITY, identity), (ANNOTATION_BUNDLE_NAME, head.manifest.name.clone()), (ANNOTATION_BUNDLE_VERSION, head.manifest.version.to_string())] {
        if let Some(got) = m.annotations.get(key).filter(|g| **g != want) {
            return Err(OciError::Mismatch { dir: dir.clone(), msg: format!("manifest {digest}: annotation {key} is {got:?} but the signed bundle manifest says {want:?}") });
        }
    }
    Ok(())
}

/// `bundle import` (FORMAT.md §12.5): choose the artifact, check the manifest, the config and
/// trust before the layer is touched, copy the layer into a private temporary directory of the
/// store while checking its size and digest, check it holds the bundle the config describes, then
/// install it with [`Store::install`] under the store lock — the same verification as
/// `bundle install`. Nothing is written to the store unless all of it passed (the temporary
/// directory is removed either way). The caller sets `opts` as for install (`record_state` off).
pub fn import_bundle(dir: &Path, sel: &Selector, store: &Store, opts: &VerifyOptions<'_>, progress: &mut dyn FnMut(Phase, u64, u64)) -> Result<Imported, OciError> {
    let layout = Layout::open(dir)?;
    let idx = layout.read_index()?;
    let (entry, m) = select(&layout, &idx, sel)?;
    let layer = check_artifact(&dir.into(), &m, &entry.digest)?;
    let config_bytes = layout.read_blob(&m.config, "config", MAX_CONFIG_BYTES)?;
    let cfg: BundleConfig = serde_json::from_slice(&config_bytes)
        .map_err(|e| OciError::Malformed { dir: dir.into(), msg: format!("config {}: not a bundle config ({MEDIA_TYPE_BUNDLE_CONFIG}): {e}", m.config.digest) })?;
    let (head, _) = precheck(&cfg, opts)?;
    let identity = identity_of(&head.manifest_bytes);
    check_annotations(&dir.into(), &m, &head, &entry.digest)?;

    std::fs::create_dir_all(store.root()).map_err(OciError::io(store.root()))?;
    let tmp = tempfile::Builder::new().prefix(".tmp-oci-").tempdir_in(store.root()).map_err(OciError::io(store.root()))?;
    let copy = tmp.path().join("bundle.zlb");
    layout.copy_blob(&layer, "layer", &copy, &mut |d, t| progress(Phase::Copy, d, t))?;
    let lh = reader::read_head(&copy)?;
    if lh.manifest_bytes != head.manifest_bytes || lh.signatures_bytes != head.signatures_bytes {
        return Err(OciError::Mismatch {
            dir: dir.into(),
            msg: format!("manifest {}: the layer holds bundle {}, not {identity} that the config describes", entry.digest, identity_of(&lh.manifest_bytes)),
        });
    }
    let _lock = store.lock()?;
    let bundle = store.install(&copy, opts, &mut |d, t| progress(Phase::Verify, d, t))?;
    drop(tmp);
    Ok(Imported { bundle, entry })
}
