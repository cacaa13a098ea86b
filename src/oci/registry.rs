//! `bundle push` and `bundle pull` (FORMAT.md §12.6): the bundle artifact of §12 in an OCI
//! registry (distribution spec v1.1), through the oras-project's `oci-client` crate.
//!
//! Pull checks, in this order, before anything reaches the store: the image manifest (size cap,
//! digest when pulled by digest, media types, one layer), the config blob (size from the
//! manifest, digest), the signatures over the bundle manifest it carries and trust, expiry,
//! revocation and rollback — all before the layer is requested. The layer then streams through
//! the bundle reader that `verify` uses while its SHA-256 is computed, in one pass, and is
//! unpacked into a private temporary directory of the store that is renamed into place only when
//! every member's digest and the layer's digest matched. A pull that the network interrupts keeps
//! the bytes it received in a resume file beside the store (`<store>/../pull/`), and the next
//! pull of the same layer asks the registry for the rest only (an HTTP range request). A pull
//! refused for what the registry sent removes that file.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use futures::StreamExt;
use oci_client::client::{Certificate, CertificateEncoding, ClientConfig, ClientProtocol, SizedStream};
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};
use sha2::Digest as _;

use super::transfer::{artifact_parts, check_annotations, check_artifact, precheck, ArtifactParts, Phase};
use super::{BundleConfig, Descriptor, Digest, ImageManifest, OciError, Origin, MAX_CONFIG_BYTES, MAX_MANIFEST_BYTES, MEDIA_TYPE_IMAGE_MANIFEST};
use crate::bundle::reader;
use crate::bundle::{verify_stream, BundleError, Store, Verified, VerifiedBundle, VerifyOptions};

/// How to reach a registry.
#[derive(Debug, Clone)]
pub struct RegistryOptions {
    /// Plain HTTP instead of HTTPS (loopback tests only; the CLI flag says so).
    pub plain_http: bool,
    /// PEM file of the CA certificates to trust instead of the system's (a site CA).
    pub ca_file: Option<PathBuf>,
    /// Credentials ([`read_auth`]); anonymous without.
    pub auth_file: Option<PathBuf>,
    /// A client certificate for mutual TLS: the PEM certificate chain (leaf first) and its
    /// private key ([`read_identity`]). Both or neither.
    pub client_cert: Option<(PathBuf, PathBuf)>,
    /// Limit on establishing a connection.
    pub connect_timeout: Duration,
    /// Longest wait for the next bytes of a response before the transfer counts as stalled.
    pub stall_timeout: Duration,
    /// Limit on the whole command's network work (a registry that trickles bytes just fast
    /// enough to never stall still ends here).
    pub deadline: Duration,
}

impl Default for RegistryOptions {
    fn default() -> Self {
        RegistryOptions { plain_http: false, ca_file: None, auth_file: None, client_cert: None, connect_timeout: Duration::from_secs(10), stall_timeout: Duration::from_secs(30), deadline: Duration::from_secs(3600) }
    }
}

fn registry_err(r: &str, msg: impl std::fmt::Display) -> OciError {
    OciError::Registry { reference: r.into(), msg: msg.to_string() }
}

/// Parse `HOST[:PORT]/REPOSITORY[:TAG|@sha256:HEX]` by the distribution spec's grammar. The
/// registry must be named: an appliance never falls back to Docker Hub. Returns the reference and
/// whether a tag was written (without one: `latest` for pull, the version for push).
pub fn parse_reference(s: &str) -> Result<(Reference, bool), OciError> {
    let bad = |why: &str| registry_err(s, format!("not a reference HOST[:PORT]/REPOSITORY[:TAG|@sha256:HEX]: {why}"));
    let Some((host, rest)) = s.split_once('/') else {
        return Err(bad("no registry host"));
    };
    if !(host.contains('.') || host.contains(':') || host == "localhost") || rest.is_empty() {
        return Err(bad("the first part must be the registry (a host name with a dot or a port, or localhost)"));
    }
    let host_ok = |h: &str| !h.is_empty() && h.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-');
    let (name, port) = match host.strip_prefix('[') {
        Some(v6) => match v6.split_once(']') {
            Some((a, p)) if a.parse::<std::net::Ipv6Addr>().is_ok() => (None, p.strip_prefix(':')),
            _ => return Err(bad("an invalid IPv6 address")),
        },
        None => match host.split_once(':') {
            Some((h, p)) => (Some(h), Some(p)),
            None => (Some(host), None),
        },
    };
    if name.is_some_and(|h| !host_ok(h)) || port.is_some_and(|p| p.is_empty() || p.len() > 5 || !p.bytes().all(|b| b.is_ascii_digit())) {
        return Err(bad("the registry part is not a host[:port]"));
    }
    let (repo, tag, digest) = match rest.split_once('@') {
        Some((repo, d)) => {
            Digest::parse(d).map_err(|why| bad(&why))?;
            (repo, None, Some(d))
        }
        None => match rest.rsplit_once(':').filter(|(_, t)| !t.contains('/')) {
            Some((repo, t)) => (repo, Some(t), None),
            None => (rest, None, None),
        },
    };
    if let Some(t) = tag.filter(|t| !super::valid_tag(t)) {
        return Err(bad(&format!("tag {t:?} is not [A-Za-z0-9_][A-Za-z0-9._-]*, at most 128 characters")));
    }
    // path-component = [a-z0-9]+ (separator [a-z0-9]+)*, separator = . | _ | __ | -+
    let component = |c: &str| {
        let b = c.as_bytes();
        !b.is_empty()
            && b[0].is_ascii_lowercase() | b[0].is_ascii_digit()
            && b[b.len() - 1].is_ascii_lowercase() | b[b.len() - 1].is_ascii_digit()
            && b.iter().all(|&x| x.is_ascii_lowercase() || x.is_ascii_digit() || matches!(x, b'.' | b'_' | b'-'))
            && !c.contains("..")
            && !c.contains("._")
            && !c.contains("_.")
            && !c.contains("___")
    };
    if repo.len() > 255 || !repo.split('/').all(component) {
        return Err(bad(&format!("repository {repo:?} is not lowercase letters and digits separated by '.', '_', '-' or '/'")));
    }
    let r = match (tag, digest) {
        (_, Some(d)) => Reference::with_digest(host.into(), repo.into(), d.into()),
        (Some(t), None) => Reference::with_tag(host.into(), repo.into(), t.into()),
        (None, None) => Reference::with_tag(host.into(), repo.into(), "latest".into()),
    };
    Ok((r, tag.is_some()))
}

/// Read registry credentials from `path`, which must be a regular file of the current user that
/// nobody else can read (mode 0600 or stricter). The first line that is neither empty nor a
/// `#` comment is `basic USER PASSWORD` (the password is the rest of the line) or
/// `bearer TOKEN`.
pub fn read_auth(path: &Path) -> Result<RegistryAuth, OciError> {
    let text = read_private(path, "credentials")?;
    let bad = |msg: String| OciError::Registry { reference: path.display().to_string(), msg };
    let line = text.lines().map(str::trim).find(|l| !l.is_empty() && !l.starts_with('#')).ok_or_else(|| bad("credentials: no `basic USER PASSWORD` or `bearer TOKEN` line".into()))?;
    let (kind, rest) = line.split_once(char::is_whitespace).unwrap_or((line, ""));
    let rest = rest.trim_start();
    match kind {
        "basic" => match rest.split_once(char::is_whitespace) {
            Some((user, pass)) if !user.is_empty() && !pass.trim_start().is_empty() => Ok(RegistryAuth::Basic(user.into(), pass.trim_start().into())),
            _ => Err(bad("credentials: `basic` needs a user and a password".into())),
        },
        "bearer" if !rest.is_empty() && !rest.contains(char::is_whitespace) => Ok(RegistryAuth::Bearer(rest.into())),
        "bearer" => Err(bad("credentials: `bearer` needs one token".into())),
        other => Err(bad(format!("credentials: unknown kind {other:?} (basic or bearer)"))),
    }
}

/// Read a secret (`what`: credentials, a client key) from `path`, which must be a regular file
/// of the current user that nobody else can read (mode 0600 or stricter). At most 64 KiB.
fn read_private(path: &Path, what: &str) -> Result<String, OciError> {
    use std::os::unix::fs::MetadataExt;
    let md = std::fs::symlink_metadata(path).map_err(OciError::io(path))?;
    let bad = |msg: String| OciError::Registry { reference: path.display().to_string(), msg };
    if !md.file_type().is_file() {
        return Err(bad(format!("{what}: not a regular file")));
    }
    if md.mode() & 0o077 != 0 {
        return Err(bad(format!("{what}: mode {:o} lets other users read it (chmod 600 it)", md.mode() & 0o777)));
    }
    if md.uid() != crate::sys::euid() {
        return Err(bad(format!("{what}: owned by uid {}, not by this user", md.uid())));
    }
    let mut text = String::new();
    std::fs::File::open(path).and_then(|f| f.take(64 << 10).read_to_string(&mut text)).map_err(OciError::io(path))?;
    Ok(text)
}

/// The PEM blocks of `text` whose label is one of `labels` (`-----BEGIN {label}-----` to its
/// `-----END {label}-----`), each with a final newline, in order.
fn pem_blocks(text: &str, labels: &[&str]) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(b) = rest.find("-----BEGIN ") {
        let after = &rest[b + "-----BEGIN ".len()..];
        let Some(label) = after.find("-----").map(|e| &after[..e]) else { break };
        let end = format!("-----END {label}-----");
        let Some(e) = rest[b..].find(&end) else { break };
        if labels.contains(&label) {
            out.push(format!("{}\n", &rest[b..b + e + end.len()]));
        }
        rest = &rest[b + e + end.len()..];
    }
    out
}

/// Split a PEM file into its certificates (a site CA bundle may hold several).
fn read_ca(path: &Path) -> Result<Vec<Certificate>, OciError> {
    let mut text = String::new();
    std::fs::File::open(path).and_then(|f| f.take(4 << 20).read_to_string(&mut text)).map_err(OciError::io(path))?;
    let out: Vec<Certificate> = pem_blocks(&text, &["CERTIFICATE"]).into_iter().map(|pem| Certificate { encoding: CertificateEncoding::Pem, data: pem.into_bytes() }).collect();
    if out.is_empty() {
        return Err(OciError::Registry { reference: path.display().to_string(), msg: "--ca-file holds no PEM certificate".into() });
    }
    Ok(out)
}

/// A client certificate for mutual TLS, as one PEM buffer (the key, then the chain): `cert` holds
/// the certificate chain, leaf first (readable by anyone), `key` its one private key (PKCS#8,
/// PKCS#1 or SEC1 PEM, a private file as for [`read_auth`]). The key is checked against the
/// leaf certificate when the client is built, so a key for another certificate is refused
/// before any connection.
pub fn read_identity(cert: &Path, key: &Path) -> Result<Vec<u8>, OciError> {
    let mut text = String::new();
    std::fs::File::open(cert).and_then(|f| f.take(4 << 20).read_to_string(&mut text)).map_err(OciError::io(cert))?;
    let chain = pem_blocks(&text, &["CERTIFICATE"]);
    if chain.is_empty() {
        return Err(OciError::Registry { reference: cert.display().to_string(), msg: "--client-cert holds no PEM certificate".into() });
    }
    let secret = read_private(key, "client key")?;
    let keys = pem_blocks(&secret, &["PRIVATE KEY", "RSA PRIVATE KEY", "EC PRIVATE KEY"]);
    if keys.len() != 1 {
        let msg = if keys.is_empty() { "client key: no PEM private key (PRIVATE KEY, RSA PRIVATE KEY or EC PRIVATE KEY)".to_string() } else { format!("client key: {} private keys; give exactly one", keys.len()) };
        return Err(OciError::Registry { reference: key.display().to_string(), msg });
    }
    let mut pem = keys.concat();
    pem.push_str(&chain.concat());
    Ok(pem.into_bytes())
}

/// A client, its credentials and a runtime to drive it, for one command.
struct Session {
    rt: tokio::runtime::Runtime,
    client: Client,
    auth: RegistryAuth,
    reference: Reference,
    /// The reference as the user wrote it, for error lines.
    shown: String,
    deadline: Instant,
    stall: Duration,
    /// Whether a client certificate is offered (for the hint on a TLS refusal).
    identity: bool,
}

impl Session {
    fn open(reference: &str, ro: &RegistryOptions, monolithic_push: bool) -> Result<(Session, bool), OciError> {
        let (r, tagged) = parse_reference(reference)?;
        let auth = match &ro.auth_file {
            Some(p) => read_auth(p)?,
            None => RegistryAuth::Anonymous,
        };
        // reqwest is built without a default crypto provider; this one is installed once per
        // process (a second install is refused, which is fine). rustls deprecates `ring` for
        // lacking post-quantum key exchange; aws-lc-rs has it but needs cmake for the static
        // musl and aarch64 builds. Registry TLS carries public, signed bundles.
        #[allow(deprecated)]
        let _ = rustls::crypto::ring::default_provider().install_default();
        let identity_pem = match &ro.client_cert {
            Some((cert, key)) => Some(read_identity(cert, key)?),
            None => None,
        };
        let config = ClientConfig {
            protocol: if ro.plain_http { ClientProtocol::Http } else { ClientProtocol::Https },
            identity_pem,
            // A registry's manifest, token or error answer is read whole: never beyond the
            // manifest cap (blobs stream, under their descriptors' sizes).
            max_response_bytes: Some(MAX_MANIFEST_BYTES as usize),
            tls_certs_only: match &ro.ca_file {
                Some(p) => read_ca(p)?,
                None => Vec::new(),
            },
            connect_timeout: Some(ro.connect_timeout),
            read_timeout: Some(ro.stall_timeout),
            use_monolithic_push: monolithic_push,
            platform_resolver: None,
            user_agent: concat!("applianced/", env!("CARGO_PKG_VERSION")),
            ..Default::default()
        };
        let identity = config.identity_pem.is_some();
        let client = Client::try_from(config).map_err(|e| {
            let d = describe(&e);
            registry_err(reference, if d.contains("KeyMismatch") { "client setup: --client-key is not the private key of --client-cert's certificate".to_string() } else { format!("client setup: {d}") })
        })?;
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| registry_err(reference, format!("runtime: {e}")))?;
        let s = Session { rt, client, auth, reference: r, shown: reference.into(), deadline: Instant::now() + ro.deadline, stall: ro.stall_timeout, identity };
        s.rt.block_on(s.client.store_auth_if_needed(s.reference.resolve_registry(), &s.auth));
        Ok((s, tagged))
    }

    fn err(&self, msg: impl std::fmt::Display) -> OciError {
        registry_err(&self.shown, msg)
    }

    /// Run one registry operation under the command's deadline.
    fn run<T>(&self, what: &str, fut: impl std::future::Future<Output = Result<T, oci_client::errors::OciDistributionError>>) -> Result<T, OciError> {
        self.run_raw(what, fut).map_err(|(e, _)| e)
    }

    /// [`Session::run`], also saying whether the registry answered with an HTTP client error
    /// (4xx: it refused the request itself, as a range it cannot satisfy).
    fn run_raw<T>(&self, what: &str, fut: impl std::future::Future<Output = Result<T, oci_client::errors::OciDistributionError>>) -> Result<T, (OciError, bool)> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        match self.rt.block_on(async { tokio::time::timeout(left, fut).await }) {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err((self.classify(what, &e), refused(&e))),
            Err(_) => Err((self.err(format!("{what}: the --deadline passed")), false)),
        }
    }

    fn classify(&self, what: &str, e: &oci_client::errors::OciDistributionError) -> OciError {
        match (unknown(e), e) {
                (Some(code), _) => OciError::NotFound { dir: Origin::Registry(self.shown.clone()), msg: format!("{what}: {code}") },
                // What the registry sent is not what was asked for by digest.
                (None, oci_client::errors::OciDistributionError::DigestError(d)) => OciError::Mismatch { dir: Origin::Registry(self.shown.clone()), msg: format!("{what}: {d}") },
                // Refused while it arrived, before it was all in memory.
                (None, oci_client::errors::OciDistributionError::ResponseTooLarge { limit, .. }) => OciError::TooLarge { dir: Origin::Registry(self.shown.clone()), what: format!("{what}: the registry's answer"), cap: *limit as u64 },
                (None, _) => {
                    let d = describe(e);
                    // A registry that checks client certificates refuses the handshake with
                    // an alert; say which flag it is about.
                    let hint = match (["BadCertificate", "CertificateRequired", "UnknownCA", "CertificateUnknown"].iter().any(|a| d.contains(&format!("fatal alert: {a}"))), self.identity) {
                        (false, _) => "",
                        (true, false) => " (the registry may require a client certificate: --client-cert and --client-key)",
                        (true, true) => " (the registry refused the --client-cert certificate)",
                    };
                    self.err(format!("{what}: {d}{hint}"))
                }
            }
    }
}

/// The registry's "no such thing" answers (an unknown repository, tag, manifest or blob), as
/// the distribution spec's error code: these are exit 15, not a registry failure.
fn unknown(e: &oci_client::errors::OciDistributionError) -> Option<String> {
    use oci_client::errors::{OciDistributionError as E, OciErrorCode as C};
    match e {
        E::RegistryError { envelope, .. } => envelope
            .errors
            .iter()
            .find(|x| matches!(x.code, C::ManifestUnknown | C::BlobUnknown | C::NameUnknown | C::NotFound))
            .map(|x| format!("{} ({:?})", if x.message.is_empty() { "not found" } else { x.message.as_str() }, x.code)),
        E::ImageManifestNotFoundError(m) => Some(m.clone()),
        E::ServerError { code: 404, .. } => Some("not found (HTTP 404)".into()),
        _ => None,
    }
}

/// Whether the registry answered with an HTTP client error (4xx).
fn refused(e: &oci_client::errors::OciDistributionError) -> bool {
    use oci_client::errors::OciDistributionError as E;
    match e {
        E::ServerError { code, .. } => (400..500).contains(code),
        E::RegistryError { .. } | E::UnauthorizedError { .. } => true,
        E::RequestError(r) => r.status().is_some_and(|s| s.is_client_error()),
        _ => false,
    }
}

/// One line for a client error, without the URL query noise reqwest adds.
fn describe(e: &oci_client::errors::OciDistributionError) -> String {
    use std::error::Error as _;
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(x) = src {
        let t = x.to_string();
        if !s.contains(&t) {
            s = format!("{s}: {t}");
        }
        src = x.source();
    }
    s
}

/// What `push` did.
#[derive(Debug)]
pub struct Pushed {
    pub verified: Verified,
    /// The reference pushed (with the tag used).
    pub reference: String,
    pub manifest_digest: String,
    pub manifest_size: u64,
    pub layer: Descriptor,
    /// Blobs uploaded; the others were in the repository already.
    pub uploaded: Vec<&'static str>,
}

/// `bundle push`: verify the bundle exactly as `verify` does (trust before anything else), then
/// upload its config and layer unless the repository has them, then the image manifest under the
/// tag (default: the bundle's version). The manifest is byte-identical to what `export` writes
/// into a layout for the same file, so both name the artifact by the same digest.
pub fn push_bundle(bundle: &Path, reference: &str, ro: &RegistryOptions, opts: &VerifyOptions<'_>, progress: &mut dyn FnMut(Phase, u64, u64)) -> Result<Pushed, OciError> {
    let head = reader::read_head(bundle)?;
    let _ = reader::check_head_only(&head, opts)?;
    let (mut s, tagged) = Session::open(reference, ro, true)?;
    if s.reference.digest().is_some() {
        return Err(s.err("push takes a tag, not a digest (the registry computes the digest)"));
    }
    let size = std::fs::metadata(bundle).map_err(OciError::io(bundle))?.len();
    let layer_digest = {
        let mut f = std::fs::File::open(bundle).map_err(OciError::io(bundle))?;
        let mut h = sha2::Sha256::new();
        let mut buf = vec![0u8; 1 << 20];
        let mut done = 0u64;
        loop {
            let n = f.read(&mut buf).map_err(OciError::io(bundle))?;
            if n == 0 {
                break;
            }
            h.update(&buf[..n]);
            done += n as u64;
            progress(Phase::Copy, done, size);
        }
        Digest::from_sha256(h)
    };
    let v = crate::bundle::verify_file(bundle, opts, None, &mut |d, t| progress(Phase::Verify, d, t))?;
    if v.manifest_bytes() != head.manifest_bytes.as_slice() {
        return Err(OciError::Mismatch { dir: Origin::Layout(bundle.into()), msg: format!("{} changed while it was pushed", bundle.display()) });
    }
    if !tagged {
        s.reference = Reference::with_tag(s.reference.registry().into(), s.reference.repository().into(), v.manifest().version.to_string());
    }
    let file_name = bundle.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| format!("{}-{}.zlb", v.manifest().name, v.manifest().version));
    let at = Origin::Registry(s.shown.clone());
    let ArtifactParts { config, manifest, manifest_bytes } = artifact_parts(&v, &file_name, &layer_digest, size, &at)?;
    let r = s.reference.clone();
    let mut uploaded = Vec::new();
    let cd = manifest.config.digest.clone();
    if !s.run("checking the config blob", s.client.blob_exists(&r, &cd))? {
        s.run("uploading the config blob", s.client.push_blob(&r, config, &cd))?;
        uploaded.push("config");
    }
    let ld = layer_digest.to_string();
    if !s.run("checking the layer blob", s.client.blob_exists(&r, &ld))? {
        let f = std::fs::File::open(bundle).map_err(OciError::io(bundle))?;
        // The upload reads the file again; the registry checks the digest computed above, so a
        // file changed since it was verified is refused by the registry, not published.
        let stream = futures::stream::unfold(f, |mut f| async move {
            let mut buf = vec![0u8; 1 << 20];
            match f.read(&mut buf) {
                Ok(0) => None,
                Ok(n) => {
                    buf.truncate(n);
                    Some((Ok(bytes::Bytes::from(buf)), f))
                }
                Err(e) => Some((Err(oci_client::errors::OciDistributionError::IoError(e)), f)),
            }
        });
        s.run("uploading the layer blob", s.client.push_blob_stream(&r, stream, &ld, Some(size)))?;
        uploaded.push("layer");
    }
    let ct = http::HeaderValue::from_static(MEDIA_TYPE_IMAGE_MANIFEST);
    s.run("uploading the manifest", s.client.push_manifest_raw(&r, manifest_bytes.clone(), ct))?;
    let layer = manifest.layers.into_iter().next().unwrap_or_else(|| Descriptor::new(super::MEDIA_TYPE_BUNDLE_LAYER, &layer_digest, size));
    Ok(Pushed { verified: v, reference: r.whole(), manifest_digest: Digest::of(&manifest_bytes).to_string(), manifest_size: manifest_bytes.len() as u64, layer, uploaded })
}

/// Where `pull` puts what it fetched.
pub enum PullTarget<'a> {
    /// Into the store (verified and unpacked while it streams), as `bundle install` would.
    Store(&'a Store),
    /// To a `.zlb` file, written only once the bundle verified (a temporary file is renamed).
    File(&'a Path),
}

/// What `pull` did.
#[derive(Debug)]
pub struct Pulled {
    /// The verified bundle; for [`PullTarget::Store`] its entry.
    pub verified: Verified,
    pub entry: Option<VerifiedBundle>,
    pub manifest_digest: String,
    pub layer: Descriptor,
    /// Layer bytes fetched from the registry by this pull (0 when the store had the bundle).
    pub downloaded: u64,
    /// Layer bytes taken from an earlier, interrupted pull.
    pub resumed: u64,
}

/// `bundle pull` (FORMAT.md §12.6).
pub fn pull_bundle(reference: &str, ro: &RegistryOptions, target: PullTarget<'_>, resume: &Path, opts: &VerifyOptions<'_>, progress: &mut dyn FnMut(Phase, u64, u64)) -> Result<Pulled, OciError> {
    let (s, _) = Session::open(reference, ro, false)?;
    let at = Origin::Registry(s.shown.clone());
    let r = s.reference.clone();
    let (body, _) = s.run("fetching the manifest", s.client.pull_manifest_raw(&r, &s.auth, &[MEDIA_TYPE_IMAGE_MANIFEST]))?;
    if body.len() as u64 > MAX_MANIFEST_BYTES {
        return Err(OciError::TooLarge { dir: at, what: "the image manifest".into(), cap: MAX_MANIFEST_BYTES });
    }
    let actual = Digest::of(&body).to_string();
    if let Some(want) = r.digest().filter(|d| *d != actual) {
        return Err(OciError::Digest { dir: at, what: "manifest".into(), digest: want.into(), actual });
    }
    let m: ImageManifest = serde_json::from_slice(&body).map_err(|e| OciError::Malformed { dir: at.clone(), msg: format!("manifest {actual}: {e}") })?;
    if m.schema_version != 2 {
        return Err(OciError::Malformed { dir: at, msg: format!("manifest {actual}: schemaVersion {} (expected 2)", m.schema_version) });
    }
    if m.media_type.as_deref().is_some_and(|t| t != MEDIA_TYPE_IMAGE_MANIFEST) {
        return Err(OciError::Malformed { dir: at, msg: format!("manifest {actual}: mediaType {:?} is not an image manifest", m.media_type) });
    }
    let layer = check_artifact(&at, &m, &actual)?;
    let (layer_digest, layer_size) = blob_of(&at, &layer, "layer")?;
    let (config_digest, config_size) = blob_of(&at, &m.config, "config")?;
    if config_size > MAX_CONFIG_BYTES {
        return Err(OciError::TooLarge { dir: at, what: format!("config blob {config_digest}"), cap: MAX_CONFIG_BYTES });
    }
    let config = fetch_small(&s, &at, &config_digest, config_size)?;
    let cfg: BundleConfig = serde_json::from_slice(&config).map_err(|e| OciError::Malformed { dir: at.clone(), msg: format!("config {config_digest}: not a bundle config: {e}") })?;
    // Signatures, trust, expiry, revocation, rollback: before a byte of the layer is requested.
    let (head, signers) = precheck(&cfg, opts)?;
    check_annotations(&at, &m, &head, &actual)?;
    // The store lock also keeps two pulls from writing one resume file.
    let _lock = match target {
        PullTarget::Store(store) => Some(store.lock()?),
        PullTarget::File(_) => None,
    };
    std::fs::create_dir_all(resume).map_err(OciError::io(resume))?;
    let part = resume.join(format!("{}.partial", layer_digest.hex()));
    let mut blob = BlobRead::new(&s, &at, layer_digest.clone(), layer_size, &part)?;
    let resumed = blob.prefix;
    let result = match target {
        PullTarget::Store(store) => {
            store.install_stream(head, signers, layer_size, || Ok(&mut blob), opts, &mut |d, t| progress(Phase::Verify, d, t)).map(|e| (e.verified.clone(), Some(e)))
        }
        PullTarget::File(out) => {
            let v = verify_stream(&mut blob, layer_size, opts, None, &mut |d, t| progress(Phase::Verify, d, t));
            v.and_then(|v| {
                if v.manifest_bytes() != head.manifest_bytes.as_slice() {
                    return Err(BundleError::Store { path: out.into(), msg: "the layer holds another bundle than the config".into() });
                }
                Ok((v, None))
            })
        }
    };
    if result.is_err() && blob.failure.is_none() && !blob.done {
        // The reader refused what it read. If the registry served other bytes than the layer's
        // digest, that is the cause to name: read the rest (within the size and the deadline)
        // to find out.
        let _ = std::io::copy(&mut blob, &mut std::io::sink());
    }
    let downloaded = blob.fetched;
    match (result, blob.failure.take()) {
        (Ok((verified, entry)), None) => {
            blob.finish(match target {
                PullTarget::File(out) => Some(out),
                PullTarget::Store(_) => None,
            })?;
            Ok(Pulled { verified, entry, manifest_digest: actual, layer, downloaded, resumed })
        }
        (_, Some(f)) => {
            if !f.keep_partial {
                let _ = std::fs::remove_file(&part);
            }
            Err(f.error)
        }
        (Err(e), None) => {
            let _ = std::fs::remove_file(&part);
            Err(e.into())
        }
    }
}

/// A descriptor's digest and size, checked.
fn blob_of(at: &Origin, d: &Descriptor, what: &str) -> Result<(Digest, u64), OciError> {
    let dg = Digest::parse(&d.digest).map_err(|why| OciError::InvalidDigest { dir: at.clone(), context: format!("{what} descriptor"), digest: d.digest.clone(), why })?;
    if d.size <= 0 {
        return Err(OciError::Malformed { dir: at.clone(), msg: format!("{what} blob {dg}: size {} is not positive", d.size) });
    }
    Ok((dg, d.size as u64))
}

/// Fetch a small blob whole, reading no more than its descriptor's size, and check its digest.
fn fetch_small(s: &Session, at: &Origin, digest: &Digest, size: u64) -> Result<Vec<u8>, OciError> {
    let ds = digest.to_string();
    let mut stream: SizedStream = s.run("fetching the config blob", s.client.pull_blob_stream(&s.reference, ds.as_str()))?;
    let mut out = Vec::with_capacity(size as usize);
    let mut h = sha2::Sha256::new();
    loop {
        let left = s.deadline.saturating_duration_since(Instant::now()).min(s.stall);
        let next = s.rt.block_on(async { tokio::time::timeout(left, stream.next()).await });
        match next {
            Err(_) => return Err(s.err("fetching the config blob: stalled or past the --deadline")),
            Ok(None) => break,
            Ok(Some(Err(e))) => return Err(s.err(format!("fetching the config blob: {e}"))),
            Ok(Some(Ok(b))) => {
                if out.len() as u64 + b.len() as u64 > size {
                    return Err(OciError::Size { dir: at.clone(), what: "config".into(), digest: ds, expected: size, actual: out.len() as u64 + b.len() as u64 });
                }
                h.update(&b);
                out.extend_from_slice(&b);
            }
        }
    }
    if out.len() as u64 != size {
        return Err(OciError::Size { dir: at.clone(), what: "config".into(), digest: ds, expected: size, actual: out.len() as u64 });
    }
    let got = Digest::from_sha256(h);
    if got != *digest {
        return Err(OciError::Digest { dir: at.clone(), what: "config".into(), digest: ds, actual: got.to_string() });
    }
    Ok(out)
}

/// Why the layer stream stopped, when it was its fault (not the bundle's).
struct Failure {
    error: OciError,
    /// An interruption (network, deadline): the bytes so far are good for a resume.
    keep_partial: bool,
}

/// The layer as a [`Read`]: first the bytes of an earlier interrupted pull (from the resume
/// file), then the registry's response from that offset on. Every byte is hashed and appended to
/// the resume file; at the end, size and digest must match the descriptor or the read fails.
struct BlobRead<'a> {
    s: &'a Session,
    at: &'a Origin,
    digest: Digest,
    size: u64,
    part_path: PathBuf,
    /// The resume file, for reading its bytes back.
    part: std::fs::File,
    /// Hashes the layer's bytes and appends the new ones to the resume file, on its own thread
    /// (off the thread that receives and decompresses; `None` once [`BlobRead::end`] joined it).
    tee: Option<Tee>,
    /// Bytes of the resume file not yet read back.
    prefix_left: u64,
    /// Length of the resume file when the pull began.
    prefix: u64,
    stream: Option<SizedStream>,
    /// Bytes of a full (not ranged) response still to skip because the resume file has them.
    skip: u64,
    cur: bytes::Bytes,
    /// Layer bytes read so far (resume file and network).
    got: u64,
    /// Bytes fetched from the network.
    fetched: u64,
    done: bool,
    failure: Option<Failure>,
}

impl<'a> BlobRead<'a> {
    fn new(s: &'a Session, at: &'a Origin, digest: Digest, size: u64, part_path: &Path) -> Result<BlobRead<'a>, OciError> {
        let part = std::fs::OpenOptions::new().create(true).truncate(false).read(true).write(true).open(part_path).map_err(OciError::io(part_path))?;
        let mut len = part.metadata().map_err(OciError::io(part_path))?.len();
        if len > size {
            part.set_len(0).map_err(OciError::io(part_path))?;
            len = 0;
        }
        let append = std::fs::OpenOptions::new().append(true).open(part_path).map_err(OciError::io(part_path))?;
        Ok(BlobRead {
            s,
            at,
            digest,
            size,
            part_path: part_path.into(),
            part,
            tee: Some(Tee::start(append)),
            prefix_left: len,
            prefix: len,
            stream: None,
            skip: 0,
            cur: bytes::Bytes::new(),
            got: 0,
            fetched: 0,
            done: false,
            failure: None,
        })
    }

    fn fail(&mut self, error: OciError, keep_partial: bool) -> std::io::Error {
        let msg = error.to_string();
        self.failure = Some(Failure { error, keep_partial });
        std::io::Error::other(msg)
    }

    fn interrupted(&mut self, msg: String) -> std::io::Error {
        let e = self.s.err(format!("layer: {msg} after {} of {} bytes; run the pull again to resume", self.got, self.size));
        self.fail(e, true)
    }

    /// Open the registry's response for the bytes from `self.got` on.
    fn open(&mut self) -> Result<(), std::io::Error> {
        let r = self.s.reference.clone();
        let ds = self.digest.to_string();
        let got = self.got;
        // Always a range request (`bytes=0-` for a fresh pull): the client then leaves the
        // digest to us instead of hashing the whole layer a second time (its check of a full
        // response is redundant with this reader's, and runs on the same thread).
        let what = if got == 0 { "fetching the layer" } else { "resuming the layer" };
        let res = self.s.run_raw(what, self.s.client.pull_blob_stream_partial(&r, ds.as_str(), got, None)).map(|resp| match resp {
            oci_client::client::BlobResponse::Partial(st) => (st, 0),
            // The registry ignored the range: skip what the resume file holds.
            oci_client::client::BlobResponse::Full(st) => (st, got),
        });
        match res {
            Ok((st, skip)) => {
                self.stream = Some(st);
                self.skip = skip;
                Ok(())
            }
            // A registry that refuses the request (a range it cannot satisfy: the resume file is
            // not a prefix of this blob) starts over next time; a network failure keeps it.
            Err((e, refused)) => Err(self.fail(e, !refused)),
        }
    }

    fn end(&mut self) -> std::io::Result<()> {
        if self.got != self.size {
            return Err(self.interrupted("the registry closed the transfer".into()));
        }
        let (h, written) = match self.tee.take() {
            Some(t) => t.finish(),
            None => return Err(std::io::Error::other("layer already ended")),
        };
        if let Err(e) = written {
            let err = OciError::Io { path: self.part_path.clone(), source: e };
            return Err(self.fail(err, false));
        }
        let actual = Digest::from_sha256(h);
        if actual != self.digest {
            let e = OciError::Digest { dir: self.at.clone(), what: "layer".into(), digest: self.digest.to_string(), actual: actual.to_string() };
            return Err(self.fail(e, false));
        }
        self.done = true;
        Ok(())
    }

    fn tee_send(&mut self, m: TeeMsg) {
        // A tee that stopped (a write error) says why at the end.
        if let Some(t) = &self.tee {
            let _ = t.tx.send(m);
        }
    }

    /// After success: remove the resume file, or make it the output file.
    fn finish(&mut self, out: Option<&Path>) -> Result<(), OciError> {
        match out {
            None => {
                let _ = std::fs::remove_file(&self.part_path);
                Ok(())
            }
            Some(out) => {
                std::fs::File::open(&self.part_path).and_then(|f| f.sync_all()).map_err(OciError::io(&self.part_path))?;
                let tmp = out.with_extension(format!("zlb.tmp-{}", std::process::id()));
                std::fs::copy(&self.part_path, &tmp).map_err(OciError::io(&tmp))?;
                std::fs::File::open(&tmp).and_then(|f| f.sync_all()).map_err(OciError::io(&tmp))?;
                std::fs::rename(&tmp, out).map_err(OciError::io(out))?;
                let _ = std::fs::remove_file(&self.part_path);
                Ok(())
            }
        }
    }
}

enum TeeMsg {
    /// Bytes read back from the resume file: hash only.
    Hash(bytes::Bytes),
    /// Bytes from the registry: hash, and append to the resume file.
    HashAndKeep(bytes::Bytes),
}

/// The layer's SHA-256 and the resume file's writes, on a thread of their own.
struct Tee {
    tx: std::sync::mpsc::SyncSender<TeeMsg>,
    worker: std::thread::JoinHandle<(sha2::Sha256, std::io::Result<()>)>,
}

impl Tee {
    fn start(mut file: std::fs::File) -> Tee {
        let (tx, rx) = std::sync::mpsc::sync_channel::<TeeMsg>(256);
        let worker = std::thread::spawn(move || {
            let mut h = sha2::Sha256::new();
            let mut written = Ok(());
            for m in rx {
                match m {
                    TeeMsg::Hash(b) => h.update(&b),
                    TeeMsg::HashAndKeep(b) => {
                        h.update(&b);
                        if written.is_ok() {
                            written = file.write_all(&b);
                        }
                    }
                }
            }
            (h, written)
        });
        Tee { tx, worker }
    }

    /// Every byte sent so far hashed and written: the hash and the first write error, if any.
    fn finish(self) -> (sha2::Sha256, std::io::Result<()>) {
        drop(self.tx);
        self.worker.join().unwrap_or_else(|_| (sha2::Sha256::new(), Err(std::io::Error::other("layer hashing thread panicked"))))
    }
}

impl Read for BlobRead<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if buf.is_empty() || self.failure.is_some() {
            return if self.failure.is_some() { Err(std::io::Error::other("layer transfer failed")) } else { Ok(0) };
        }
        loop {
            if !self.cur.is_empty() {
                let n = self.cur.len().min(buf.len());
                buf[..n].copy_from_slice(&self.cur[..n]);
                let _ = self.cur.split_to(n);
                return Ok(n);
            }
            if self.done {
                return Ok(0);
            }
            if self.prefix_left > 0 {
                let want = (self.prefix_left as usize).min(buf.len());
                let n = self.part.read(&mut buf[..want]).map_err(|e| {
                    let err = OciError::Io { path: self.part_path.clone(), source: e };
                    self.fail(err, false)
                })?;
                if n == 0 {
                    // The resume file shrank under us: fetch the rest from the registry.
                    self.prefix_left = 0;
                    self.part.set_len(self.got)?;
                    continue;
                }
                self.tee_send(TeeMsg::Hash(bytes::Bytes::copy_from_slice(&buf[..n])));
                self.prefix_left -= n as u64;
                self.got += n as u64;
                return Ok(n);
            }
            if self.got == self.size && self.stream.is_none() {
                self.end()?;
                return Ok(0);
            }
            if self.stream.is_none() {
                self.open()?;
            }
            let left = self.s.deadline.saturating_duration_since(Instant::now());
            let wait = left.min(self.s.stall);
            let Some(stream) = self.stream.as_mut() else { continue };
            let next = self.s.rt.block_on(async { tokio::time::timeout(wait, stream.next()).await });
            let mut chunk = match next {
                Err(_) if wait == left => return Err(self.interrupted("the --deadline passed".into())),
                Err(_) => return Err(self.interrupted(format!("no data for {} s (stalled)", wait.as_secs()))),
                Ok(None) => {
                    self.stream = None;
                    self.end()?;
                    return Ok(0);
                }
                // The client checks a full response's digest itself and ends the stream with an
                // error when it differs: with every byte here, our own check names the cause.
                Ok(Some(Err(_))) if self.got == self.size => {
                    self.stream = None;
                    self.end()?;
                    return Ok(0);
                }
                Ok(Some(Err(e))) => return Err(self.interrupted(e.to_string())),
                Ok(Some(Ok(b))) => b,
            };
            self.fetched += chunk.len() as u64;
            if self.skip > 0 {
                let k = (self.skip as usize).min(chunk.len());
                let _ = chunk.split_to(k);
                self.skip -= k as u64;
            }
            if self.got + chunk.len() as u64 > self.size {
                let e = OciError::Size { dir: self.at.clone(), what: "layer".into(), digest: self.digest.to_string(), expected: self.size, actual: self.got + chunk.len() as u64 };
                return Err(self.fail(e, false));
            }
            self.tee_send(TeeMsg::HashAndKeep(chunk.clone()));
            self.got += chunk.len() as u64;
            self.cur = chunk;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_must_name_the_registry() {
        let (r, tagged) = parse_reference("127.0.0.1:5000/apps/tiny:ring0").unwrap();
        assert_eq!((r.registry(), r.repository(), r.tag(), tagged), ("127.0.0.1:5000", "apps/tiny", Some("ring0"), true));
        let (r, tagged) = parse_reference("registry.example.org/tiny").unwrap();
        assert_eq!((r.registry(), r.repository(), tagged), ("registry.example.org", "tiny", false));
        let d = format!("sha256:{}", "ab".repeat(32));
        let (r, tagged) = parse_reference(&format!("localhost/a/b@{d}")).unwrap();
        assert_eq!((r.digest(), tagged), (Some(d.as_str()), false));
        let (r, _) = parse_reference("[::1]:5000/a/b_c.d-e:v1").unwrap();
        assert_eq!((r.registry(), r.repository(), r.tag()), ("[::1]:5000", "a/b_c.d-e", Some("v1")));
        for bad in [
            "tiny:1",
            "apps/tiny:1",
            "library/tiny",
            "",
            "host.example/",
            &format!("localhost/x@sha256:{}", "AB".repeat(32)),
            "localhost/x@sha256:../../etc",
            "localhost/Apps/x:1",
            "localhost/a//b:1",
            "localhost/a/../b:1",
            "localhost/x:-tag",
            "localhost:port/x:1",
            "bad_host.example/x:1",
            "[::zz]:5000/x:1",
        ] {
            let e = parse_reference(bad).unwrap_err().to_string();
            assert!(e.contains("not a reference"), "{bad}: {e}");
        }
    }

    fn auth_file(text: &str, mode: u32) -> (tempfile::TempDir, PathBuf) {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("auth");
        std::fs::write(&p, text).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
        (d, p)
    }

    #[test]
    fn credentials_files() {
        let (_d, p) = auth_file("# site registry\n\nbasic pull-bot pass word\n", 0o600);
        assert!(matches!(read_auth(&p).unwrap(), RegistryAuth::Basic(u, pw) if u == "pull-bot" && pw == "pass word"));
        let (_d, p) = auth_file("bearer abc.def\n", 0o400);
        assert!(matches!(read_auth(&p).unwrap(), RegistryAuth::Bearer(t) if t == "abc.def"));
        for (text, mode, why) in [
            ("basic u p\n", 0o640, "chmod 600"),
            ("basic u p\n", 0o604, "chmod 600"),
            ("basic u\n", 0o600, "needs a user and a password"),
            ("bearer a b\n", 0o600, "one token"),
            ("token x\n", 0o600, "unknown kind"),
            ("# nothing\n", 0o600, "no `basic USER PASSWORD`"),
        ] {
            let (_d, p) = auth_file(text, mode);
            let e = read_auth(&p).unwrap_err().to_string();
            assert!(e.contains(why), "{text:?} {mode:o}: {e}");
            assert!(!e.contains("secret") && !e.contains(" p\n"), "the error never shows the credentials: {e}");
        }
    }

    #[test]
    fn a_ca_file_may_hold_several_certificates() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("ca.pem");
        let cert = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
        std::fs::write(&p, format!("subject=site root\n{cert}subject=site intermediate\n{cert}")).unwrap();
        assert_eq!(read_ca(&p).unwrap().len(), 2);
        std::fs::write(&p, "not a certificate").unwrap();
        assert!(read_ca(&p).unwrap_err().to_string().contains("no PEM certificate"));
    }

    #[test]
    fn a_client_identity_is_one_private_key_then_the_chain() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().unwrap();
        let block = |label: &str, body: &str| format!("-----BEGIN {label}-----\n{body}\n-----END {label}-----\n");
        let (cert, key) = (d.path().join("box.pem"), d.path().join("box.key"));
        // The chain as openssl writes it (text between blocks), leaf first.
        std::fs::write(&cert, format!("subject=box\n{}issuer=ca\n{}", block("CERTIFICATE", "LEAF"), block("CERTIFICATE", "INTER"))).unwrap();
        for label in ["PRIVATE KEY", "RSA PRIVATE KEY", "EC PRIVATE KEY"] {
            // EC parameters that openssl may write before the key are left out.
            std::fs::write(&key, format!("{}{}", block("EC PARAMETERS", "P256"), block(label, "KEY"))).unwrap();
            std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
            let pem = String::from_utf8(read_identity(&cert, &key).unwrap()).unwrap();
            assert_eq!(pem, format!("{}{}{}", block(label, "KEY"), block("CERTIFICATE", "LEAF"), block("CERTIFICATE", "INTER")));
        }
        std::fs::write(&key, format!("{}{}", block("PRIVATE KEY", "A"), block("PRIVATE KEY", "B"))).unwrap();
        assert!(read_identity(&cert, &key).unwrap_err().to_string().contains("2 private keys"));
        std::fs::write(&key, block("PUBLIC KEY", "A")).unwrap();
        assert!(read_identity(&cert, &key).unwrap_err().to_string().contains("no PEM private key"));
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o640)).unwrap();
        assert!(read_identity(&cert, &key).unwrap_err().to_string().contains("chmod 600"));
        std::fs::write(&cert, block("PRIVATE KEY", "KEY")).unwrap();
        assert!(read_identity(&cert, &key).unwrap_err().to_string().contains("--client-cert holds no PEM certificate"));
    }
}
