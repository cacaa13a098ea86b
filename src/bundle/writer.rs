//! Writing `.zlb` files deterministically (FORMAT.md §2, §4).

use std::io::{Read, Write};
use std::path::Path;

use super::{BundleError, FormatError, Member, MANIFEST_NAME, SIGNATURES_NAME};

/// zstd level used by `build`; any level is valid for readers. Level -1 is zstd's fast mode, which
/// stores literals without Huffman coding: quantized weights compress by only ~5% at level 3, and
/// fast mode decodes about 3x faster (≈ 3 GB/s here), so verification is bound by SHA-256 instead.
pub const ZSTD_LEVEL: i32 = -1;

/// The canonical 512-byte ustar header of a member (FORMAT.md §4.1). Readers compare every header
/// byte for byte against this, so no unsigned metadata (mtime, owner, mode) can vary.
pub fn canonical_header(path: &str, size: u64) -> Result<tar::Header, FormatError> {
    let mut h = tar::Header::new_ustar();
    h.set_path(path).map_err(|e| FormatError::Member { path: path.into(), msg: e.to_string() })?;
    h.set_size(size);
    h.set_mode(0o644);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(0);
    h.set_entry_type(tar::EntryType::Regular);
    h.set_cksum();
    // set_path splits long paths into the ustar prefix field; v1 forbids that (paths ≤ 100 bytes,
    // checked by the manifest), so the name field must hold the whole path.
    if h.as_ustar().map(|u| u.prefix.iter().any(|&b| b != 0)).unwrap_or(true) {
        return Err(FormatError::Member { path: path.into(), msg: "path does not fit the ustar name field".into() });
    }
    Ok(h)
}

/// Write a bundle: manifest, signatures, then the members from `sources` (same order as the
/// manifest). Writes to a temporary sibling and renames, so `out` is never partial.
pub fn write_bundle(
    out: &Path,
    manifest_bytes: &[u8],
    signatures_bytes: &[u8],
    members: &[(Member, &Path)],
    progress: &mut dyn FnMut(u64, u64),
) -> Result<(), BundleError> {
    let dir = out.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(BundleError::io(dir))?;
    let tmp = tempfile::Builder::new().prefix(".zlb-").tempfile_in(dir).map_err(BundleError::io(dir))?;
    let total: u64 = members.iter().map(|(m, _)| m.size).sum();
    let mut done = 0u64;
    {
        let file = tmp.as_file().try_clone().map_err(BundleError::io(out))?;
        let mut enc = zstd::stream::write::Encoder::new(std::io::BufWriter::with_capacity(1 << 20, file), ZSTD_LEVEL)
            .map_err(BundleError::io(out))?;
        enc.include_checksum(true).map_err(BundleError::io(out))?;
        enc.include_contentsize(false).map_err(BundleError::io(out))?;
        let mut tar = tar::Builder::new(enc);
        for (name, bytes) in [(MANIFEST_NAME, manifest_bytes), (SIGNATURES_NAME, signatures_bytes)] {
            let h = canonical_header(name, bytes.len() as u64)?;
            tar.append(&h, bytes).map_err(BundleError::io(out))?;
        }
        for (m, src) in members {
            let f = std::fs::File::open(src).map_err(BundleError::io(*src))?;
            let actual = f.metadata().map_err(BundleError::io(*src))?.len();
            if actual != m.size {
                return Err(BundleError::Size { path: m.path.clone(), expected: m.size, actual });
            }
            let h = canonical_header(&m.path, m.size)?;
            tar.append(&h, f.take(m.size)).map_err(BundleError::io(*src))?;
            done += m.size;
            progress(done, total);
        }
        let enc = tar.into_inner().map_err(BundleError::io(out))?;
        let mut w = enc.finish().map_err(BundleError::io(out))?;
        w.flush().map_err(BundleError::io(out))?;
    }
    tmp.as_file().sync_all().map_err(BundleError::io(out))?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        tmp.as_file().set_permissions(std::fs::Permissions::from_mode(0o644)).map_err(BundleError::io(out))?;
    }
    tmp.persist(out).map_err(|e| BundleError::Io { path: out.into(), source: e.error })?;
    Ok(())
}
