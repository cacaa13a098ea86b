//! A GGUF v2/v3 reader that treats the file as hostile.
//!
//! Layout (GGUF spec, github.com/ggml-org/ggml/blob/master/docs/gguf.md):
//! ```text
//! u32 magic "GGUF" | u32 version | u64 tensor_count | u64 metadata_kv_count
//! metadata_kv_count × { gguf_string key, u32 value_type, value }
//! tensor_count × { gguf_string name, u32 n_dims, u64 ne[n_dims], u32 ggml_type, u64 offset }
//! padding to `general.alignment` (default 32)
//! tensor data (each tensor at data_start + offset, offset a multiple of the alignment)
//! ```
//! `gguf_string` is a u64 byte length followed by UTF-8 bytes. Everything is little-endian.
//!
//! Every read goes through one bounded [`Reader`]; every length prefix and count is checked against a
//! named cap *and* against the bytes left before anything is allocated, and every tensor's offset and
//! size are checked against the data section. GGUF dims list `ne0` (the contiguous dimension) first;
//! [`TensorInfo::shape`] gives our logical shape, outermost first (`[ne1, ne0]` for matrices).
#![allow(unsafe_code)]

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use crate::model::TensorType;

use super::ImportError;

/// Largest accepted string (key, value or tensor name): 64 MiB (a chat template is a few KiB).
pub const MAX_STRING_BYTES: u64 = 64 << 20;
/// Largest accepted array length (a vocabulary has ~10^5 entries).
pub const MAX_ARRAY_LEN: u64 = 16 << 20;
/// Most metadata key/value pairs.
pub const MAX_KV_COUNT: u64 = 1 << 16;
/// Most tensors.
pub const MAX_TENSOR_COUNT: u64 = 1 << 16;
/// Most dimensions of one tensor (GGML_MAX_DIMS).
pub const MAX_DIMS: u32 = 4;
/// Deepest nesting of arrays inside arrays.
pub const MAX_ARRAY_DEPTH: u32 = 3;
/// Largest accepted `general.alignment`.
pub const MAX_ALIGNMENT: u64 = 1 << 16;

const MAGIC: &[u8; 4] = b"GGUF";

/// One metadata value, of any GGUF value type.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    Array(Vec<Value>),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl Value {
    /// Name of the GGUF value type, for error messages.
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::U8(_) => "u8",
            Value::I8(_) => "i8",
            Value::U16(_) => "u16",
            Value::I16(_) => "i16",
            Value::U32(_) => "u32",
            Value::I32(_) => "i32",
            Value::F32(_) => "f32",
            Value::Bool(_) => "bool",
            Value::String(_) => "string",
            Value::Array(_) => "array",
            Value::U64(_) => "u64",
            Value::I64(_) => "i64",
            Value::F64(_) => "f64",
        }
    }
    /// Any integer type as u64 (negative values give None).
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::U8(v) => Some(v.into()),
            Value::U16(v) => Some(v.into()),
            Value::U32(v) => Some(v.into()),
            Value::U64(v) => Some(v),
            Value::I8(v) => u64::try_from(v).ok(),
            Value::I16(v) => u64::try_from(v).ok(),
            Value::I32(v) => u64::try_from(v).ok(),
            Value::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            Value::I8(v) => Some(v.into()),
            Value::I16(v) => Some(v.into()),
            Value::I32(v) => Some(v.into()),
            Value::I64(v) => Some(v),
            _ => self.as_u64().and_then(|v| i64::try_from(v).ok()),
        }
    }
    /// Any float or integer type as f64.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v.into()),
            Value::F64(v) => Some(v),
            _ => self.as_i64().map(|v| v as f64),
        }
    }
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Value::Bool(b) => Some(b),
            _ => None,
        }
    }
    pub fn as_array(&self) -> Option<&[Value]> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }
}

/// GGML tensor type ids (ggml.h `enum ggml_type`), names and block sizes, for the types this reader
/// knows about. Only those mapping to a [`TensorType`] are accepted.
fn ggml_type(id: u32) -> Option<(&'static str, Option<TensorType>)> {
    Some(match id {
        0 => ("f32", Some(TensorType::F32)),
        1 => ("f16", Some(TensorType::F16)),
        2 => ("q4_0", Some(TensorType::Q4_0)),
        3 => ("q4_1", Some(TensorType::Q4_1)),
        6 => ("q5_0", Some(TensorType::Q5_0)),
        7 => ("q5_1", Some(TensorType::Q5_1)),
        8 => ("q8_0", Some(TensorType::Q8_0)),
        9 => ("q8_1", None),
        10 => ("q2_k", None),
        11 => ("q3_k", None),
        12 => ("q4_k", Some(TensorType::Q4K)),
        13 => ("q5_k", Some(TensorType::Q5K)),
        14 => ("q6_k", Some(TensorType::Q6K)),
        15 => ("q8_k", None),
        16 => ("iq2_xxs", None),
        17 => ("iq2_xs", None),
        18 => ("iq3_xxs", None),
        19 => ("iq1_s", None),
        20 => ("iq4_nl", None),
        21 => ("iq3_s", None),
        22 => ("iq2_s", None),
        23 => ("iq4_xs", None),
        24 => ("i8", None),
        25 => ("i16", None),
        26 => ("i32", None),
        27 => ("i64", None),
        28 => ("f64", None),
        29 => ("iq1_m", None),
        30 => ("bf16", Some(TensorType::Bf16)),
        34 => ("tq1_0", None),
        35 => ("tq2_0", None),
        39 => ("mxfp4", None),
        _ => return None,
    })
}

/// GGML type id of a [`TensorType`] (for writers).
pub fn ggml_type_id(t: TensorType) -> u32 {
    match t {
        TensorType::F32 => 0,
        TensorType::F16 => 1,
        TensorType::Q4_0 => 2,
        TensorType::Q4_1 => 3,
        TensorType::Q5_0 => 6,
        TensorType::Q5_1 => 7,
        TensorType::Q8_0 => 8,
        TensorType::Q4K => 12,
        TensorType::Q5K => 13,
        TensorType::Q6K => 14,
        TensorType::Bf16 => 30,
    }
}

/// One tensor's header entry, validated against the file.
#[derive(Debug, Clone)]
pub struct TensorInfo {
    pub name: String,
    /// GGUF order: `ne[0]` is the contiguous dimension.
    pub ne: Vec<u64>,
    pub ty: TensorType,
    /// Offset from the start of the data section.
    pub offset: u64,
    /// Size in bytes.
    pub size: u64,
}

impl TensorInfo {
    /// Logical shape, outermost first (`[ne1, ne0]` for a matrix, `[ne0]` for a vector).
    pub fn shape(&self) -> Vec<usize> {
        // ne values were checked to fit in usize when the tensor was parsed.
        self.ne.iter().rev().map(|&d| d as usize).collect()
    }
    pub fn n_elements(&self) -> u64 {
        self.ne.iter().product()
    }
}

/// A parsed, memory-mapped GGUF file.
pub struct GgufFile {
    path: PathBuf,
    map: memmap2::Mmap,
    pub version: u32,
    pub alignment: u64,
    /// Metadata in file order of keys is not kept; keys are unique (duplicates are rejected).
    pub metadata: BTreeMap<String, Value>,
    /// Tensors in file order.
    pub tensors: Vec<TensorInfo>,
    data_start: usize,
}

/// The single bounded cursor every header read goes through.
struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    path: &'a Path,
}

impl<'a> Reader<'a> {
    fn err(&self, what: String) -> ImportError {
        ImportError::Gguf { path: self.path.to_path_buf(), offset: self.pos as u64, msg: what }
    }
    fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }
    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], ImportError> {
        if n > self.remaining() {
            return Err(self.err(format!(
                "truncated file: {what} needs {n} bytes, only {} left",
                self.remaining()
            )));
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }
    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], ImportError> {
        let s = self.take(N, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }
    fn u8(&mut self, what: &str) -> Result<u8, ImportError> {
        Ok(self.array::<1>(what)?[0])
    }
    fn u16(&mut self, what: &str) -> Result<u16, ImportError> {
        Ok(u16::from_le_bytes(self.array(what)?))
    }
    fn u32(&mut self, what: &str) -> Result<u32, ImportError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }
    fn u64(&mut self, what: &str) -> Result<u64, ImportError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }
    /// A count checked against `cap` and against the bytes left (each item needs `min_item_bytes`).
    fn count(&mut self, what: &str, cap: u64, min_item_bytes: u64) -> Result<usize, ImportError> {
        let n = self.u64(what)?;
        if n > cap {
            return Err(self.err(format!("{what} {n} exceeds the cap of {cap}")));
        }
        if n.saturating_mul(min_item_bytes) > self.remaining() as u64 {
            return Err(self.err(format!(
                "{what} {n} cannot fit in the {} bytes left (truncated or corrupt file)",
                self.remaining()
            )));
        }
        Ok(n as usize) // n <= cap < usize::MAX
    }
    fn string(&mut self, what: &str) -> Result<String, ImportError> {
        let n = self.count(&format!("{what} length"), MAX_STRING_BYTES, 1)?;
        let start = self.pos;
        let bytes = self.take(n, what)?;
        match std::str::from_utf8(bytes) {
            Ok(s) => Ok(s.to_owned()),
            Err(e) => Err(ImportError::Gguf {
                path: self.path.to_path_buf(),
                offset: start as u64,
                msg: format!("{what} is not valid UTF-8: {e}"),
            }),
        }
    }
    fn value(&mut self, ty: u32, key: &str, depth: u32) -> Result<Value, ImportError> {
        Ok(match ty {
            0 => Value::U8(self.u8(key)?),
            1 => Value::I8(self.u8(key)? as i8),
            2 => Value::U16(self.u16(key)?),
            3 => Value::I16(self.u16(key)? as i16),
            4 => Value::U32(self.u32(key)?),
            5 => Value::I32(self.u32(key)? as i32),
            6 => Value::F32(f32::from_bits(self.u32(key)?)),
            7 => match self.u8(key)? {
                0 => Value::Bool(false),
                1 => Value::Bool(true),
                b => return Err(self.err(format!("metadata {key}: bool byte {b} is neither 0 nor 1"))),
            },
            8 => Value::String(self.string(&format!("metadata {key}"))?),
            9 => {
                if depth >= MAX_ARRAY_DEPTH {
                    return Err(self.err(format!("metadata {key}: arrays nested deeper than {MAX_ARRAY_DEPTH}")));
                }
                let elem_ty = self.u32(key)?;
                let min = value_min_bytes(elem_ty)
                    .ok_or_else(|| self.err(format!("metadata {key}: unknown array element type {elem_ty}")))?;
                let n = self.count(&format!("metadata {key} array length"), MAX_ARRAY_LEN, min)?;
                let mut items = Vec::with_capacity(n);
                for _ in 0..n {
                    items.push(self.value(elem_ty, key, depth + 1)?);
                }
                Value::Array(items)
            }
            10 => Value::U64(self.u64(key)?),
            11 => Value::I64(self.u64(key)? as i64),
            12 => Value::F64(f64::from_bits(self.u64(key)?)),
            t => return Err(self.err(format!("metadata {key}: unknown value type {t}"))),
        })
    }
}

/// Smallest encoding of one value of a GGUF value type (None: unknown type).
fn value_min_bytes(ty: u32) -> Option<u64> {
    Some(match ty {
        0 | 1 | 7 => 1,
        2 | 3 => 2,
        4..=6 => 4,
        8 => 8,
        9 => 12,
        10..=12 => 8,
        _ => return None,
    })
}

impl GgufFile {
    /// Map and parse a GGUF file, validating the header and every tensor extent.
    pub fn open(path: &Path) -> Result<GgufFile, ImportError> {
        let file = File::open(path).map_err(|e| ImportError::io(path, e))?;
        // SAFETY: the map is read-only and only read through bounds-checked slices. The importer reads
        // a source file the operator handed it; if another process truncates it while mapped we may
        // get SIGBUS, the documented limit of memory-mapping (build inputs are not modified in place).
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| ImportError::io(path, e))?;
        Self::parse(path, map)
    }

    fn parse(path: &Path, map: memmap2::Mmap) -> Result<GgufFile, ImportError> {
        let mut r = Reader { buf: &map[..], pos: 0, path };
        let magic = r.array::<4>("magic")?;
        if &magic != MAGIC {
            return Err(ImportError::Gguf {
                path: path.to_path_buf(),
                offset: 0,
                msg: format!("bad magic {:02x?}: not a GGUF file", magic),
            });
        }
        let version = r.u32("version")?;
        if version != 2 && version != 3 {
            return Err(r.err(format!("unsupported GGUF version {version} (supported: 2, 3)")));
        }
        // A tensor info is at least 8 (name len) + 4 (n_dims) + 4 (type) + 8 (offset) bytes; a kv at
        // least 8 (key len) + 4 (type) + 1 bytes.
        let n_tensors = r.count("tensor count", MAX_TENSOR_COUNT, 24)?;
        let n_kv = r.count("metadata count", MAX_KV_COUNT, 13)?;
        let mut metadata = BTreeMap::new();
        for _ in 0..n_kv {
            let key = r.string("metadata key")?;
            let ty = r.u32(&key)?;
            let v = r.value(ty, &key, 0)?;
            if metadata.insert(key.clone(), v).is_some() {
                return Err(r.err(format!("duplicate metadata key {key}")));
            }
        }
        let alignment = match metadata.get("general.alignment") {
            None => 32,
            Some(v) => match v.as_u64() {
                Some(a) if a > 0 && a.is_power_of_two() && a <= MAX_ALIGNMENT => a,
                _ => return Err(r.err(format!("general.alignment {v:?} is not a power of two <= {MAX_ALIGNMENT}"))),
            },
        };
        let mut infos = Vec::with_capacity(n_tensors);
        let mut names = std::collections::HashSet::new();
        for _ in 0..n_tensors {
            let name = r.string("tensor name")?;
            let n_dims = r.u32(&name)?;
            if n_dims == 0 || n_dims > MAX_DIMS {
                return Err(r.err(format!("tensor {name}: {n_dims} dimensions (must be 1..={MAX_DIMS})")));
            }
            let mut ne = Vec::with_capacity(n_dims as usize);
            for _ in 0..n_dims {
                ne.push(r.u64(&name)?);
            }
            let ty_id = r.u32(&name)?;
            let offset = r.u64(&name)?;
            if !names.insert(name.clone()) {
                return Err(r.err(format!("duplicate tensor name {name}")));
            }
            infos.push((name, ne, ty_id, offset));
        }
        let data_start = (r.pos as u64).div_ceil(alignment) * alignment;
        if data_start > map.len() as u64 && n_tensors > 0 {
            return Err(r.err(format!("truncated file: tensor data would start at {data_start}, past the end")));
        }
        let data_len = (map.len() as u64).saturating_sub(data_start);
        let mut tensors = Vec::with_capacity(infos.len());
        for (name, ne, ty_id, offset) in infos {
            let terr = |msg: String| ImportError::Tensor { path: path.to_path_buf(), tensor: name.clone(), msg };
            let ty = match ggml_type(ty_id) {
                Some((_, Some(t))) => t,
                Some((tname, None)) => {
                    return Err(ImportError::UnsupportedTensorType {
                        path: path.to_path_buf(),
                        tensor: name,
                        ty: format!("{tname} (ggml type {ty_id})"),
                    })
                }
                None => {
                    return Err(ImportError::UnsupportedTensorType {
                        path: path.to_path_buf(),
                        tensor: name,
                        ty: format!("unknown ggml type {ty_id}"),
                    })
                }
            };
            if ne.contains(&0) {
                return Err(terr(format!("zero dimension in {ne:?}")));
            }
            let n_el = ne.iter().try_fold(1u64, |a, &d| a.checked_mul(d));
            match n_el {
                // No supported type packs more than 8 elements per byte.
                Some(n) if n <= data_len.saturating_mul(8) && usize::try_from(n).is_ok() => {}
                _ => return Err(terr(format!("dimensions {ne:?} are impossibly large for the file"))),
            }
            let ne0 = ne[0] as usize; // <= n_el which fits usize
            let row = ty.row_bytes(ne0).ok_or_else(|| {
                terr(format!("ne0 = {ne0} is not a multiple of the {} block size {}", ty.name(), ty.block_elems()))
            })? as u64;
            let rows: u64 = ne[1..].iter().product(); // <= n_el, no overflow
            let size = row
                .checked_mul(rows)
                .ok_or_else(|| terr(format!("dimensions {ne:?} overflow")))?;
            if offset % alignment != 0 {
                return Err(terr(format!("offset {offset} is not a multiple of the alignment {alignment}")));
            }
            match offset.checked_add(size) {
                Some(end) if end <= data_len => {}
                _ => {
                    return Err(terr(format!(
                        "data [{offset}, {offset}+{size}) runs past the end of the data section ({data_len} bytes)"
                    )))
                }
            }
            tensors.push(TensorInfo { name, ne, ty, offset, size });
        }
        Ok(GgufFile {
            path: path.to_path_buf(),
            version,
            alignment,
            metadata,
            tensors,
            data_start: data_start as usize,
            map,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.metadata.get(key)
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// The bytes of a tensor (bounds were checked at parse time).
    pub fn tensor_data(&self, t: &TensorInfo) -> &[u8] {
        let start = self.data_start + t.offset as usize;
        &self.map[start..start + t.size as usize]
    }

    /// Whole mapped file (for hashing).
    pub fn bytes(&self) -> &[u8] {
        &self.map[..]
    }

    fn meta_err(&self, key: &str, msg: String) -> ImportError {
        ImportError::Metadata { path: self.path.clone(), key: key.to_string(), msg }
    }

    /// A required string.
    pub fn str(&self, key: &str) -> Result<&str, ImportError> {
        match self.get(key) {
            None => Err(self.meta_err(key, "missing".into())),
            Some(v) => v.as_str().ok_or_else(|| self.meta_err(key, format!("expected a string, got {}", v.type_name()))),
        }
    }
    pub fn opt_str(&self, key: &str) -> Result<Option<&str>, ImportError> {
        if self.get(key).is_none() {
            return Ok(None);
        }
        self.str(key).map(Some)
    }
    /// An optional non-negative integer.
    pub fn opt_u64(&self, key: &str) -> Result<Option<u64>, ImportError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .map(Some)
                .ok_or_else(|| self.meta_err(key, format!("expected a non-negative integer, got {v:?}"))),
        }
    }
    pub fn u64(&self, key: &str) -> Result<u64, ImportError> {
        self.opt_u64(key)?.ok_or_else(|| self.meta_err(key, "missing".into()))
    }
    pub fn opt_f64(&self, key: &str) -> Result<Option<f64>, ImportError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v.as_f64().map(Some).ok_or_else(|| self.meta_err(key, format!("expected a number, got {v:?}"))),
        }
    }
    pub fn opt_bool(&self, key: &str) -> Result<Option<bool>, ImportError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v.as_bool().map(Some).ok_or_else(|| self.meta_err(key, format!("expected a bool, got {v:?}"))),
        }
    }
    /// An optional array of strings.
    pub fn opt_str_array(&self, key: &str) -> Result<Option<Vec<String>>, ImportError> {
        let Some(v) = self.get(key) else { return Ok(None) };
        let arr = v.as_array().ok_or_else(|| self.meta_err(key, format!("expected an array, got {}", v.type_name())))?;
        arr.iter()
            .map(|x| x.as_str().map(str::to_owned).ok_or_else(|| self.meta_err(key, "expected an array of strings".into())))
            .collect::<Result<Vec<_>, _>>()
            .map(Some)
    }
    /// An optional array of integers.
    pub fn opt_i64_array(&self, key: &str) -> Result<Option<Vec<i64>>, ImportError> {
        let Some(v) = self.get(key) else { return Ok(None) };
        let arr = v.as_array().ok_or_else(|| self.meta_err(key, format!("expected an array, got {}", v.type_name())))?;
        arr.iter()
            .map(|x| x.as_i64().ok_or_else(|| self.meta_err(key, "expected an array of integers".into())))
            .collect::<Result<Vec<_>, _>>()
            .map(Some)
    }
    /// An optional array of numbers.
    pub fn opt_f64_array(&self, key: &str) -> Result<Option<Vec<f64>>, ImportError> {
        let Some(v) = self.get(key) else { return Ok(None) };
        let arr = v.as_array().ok_or_else(|| self.meta_err(key, format!("expected an array, got {}", v.type_name())))?;
        arr.iter()
            .map(|x| x.as_f64().ok_or_else(|| self.meta_err(key, "expected an array of numbers".into())))
            .collect::<Result<Vec<_>, _>>()
            .map(Some)
    }
}

/// Minimal GGUF v3 writer, used by tests and [`super::testutil`] (feature `testutil`; not in
/// the release binary).
#[cfg(any(test, feature = "testutil"))]
pub struct GgufWriter {
    kvs: Vec<(String, Value)>,
    tensors: Vec<(String, Vec<u64>, TensorType, Vec<u8>)>,
    alignment: u64,
}

#[cfg(any(test, feature = "testutil"))]
impl Default for GgufWriter {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(any(test, feature = "testutil"))]
impl GgufWriter {
    pub fn new() -> Self {
        GgufWriter { kvs: Vec::new(), tensors: Vec::new(), alignment: 32 }
    }
    pub fn kv(&mut self, key: &str, v: Value) -> &mut Self {
        if key == "general.alignment" {
            if let Some(a) = v.as_u64() {
                self.alignment = a.max(1);
            }
        }
        self.kvs.push((key.to_string(), v));
        self
    }
    /// Add a tensor with GGUF dims (`ne[0]` contiguous) and its raw bytes.
    pub fn tensor(&mut self, name: &str, ne: &[u64], ty: TensorType, data: Vec<u8>) -> &mut Self {
        self.tensors.push((name.to_string(), ne.to_vec(), ty, data));
        self
    }
    fn put_str(out: &mut Vec<u8>, s: &str) {
        out.extend_from_slice(&(s.len() as u64).to_le_bytes());
        out.extend_from_slice(s.as_bytes());
    }
    fn type_id(v: &Value) -> u32 {
        match v {
            Value::U8(_) => 0,
            Value::I8(_) => 1,
            Value::U16(_) => 2,
            Value::I16(_) => 3,
            Value::U32(_) => 4,
            Value::I32(_) => 5,
            Value::F32(_) => 6,
            Value::Bool(_) => 7,
            Value::String(_) => 8,
            Value::Array(_) => 9,
            Value::U64(_) => 10,
            Value::I64(_) => 11,
            Value::F64(_) => 12,
        }
    }
    fn put_value(out: &mut Vec<u8>, v: &Value) {
        match v {
            Value::U8(x) => out.push(*x),
            Value::I8(x) => out.push(*x as u8),
            Value::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
            Value::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
            Value::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
            Value::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
            Value::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
            Value::Bool(x) => out.push(*x as u8),
            Value::String(s) => Self::put_str(out, s),
            Value::Array(a) => {
                let et = a.first().map(Self::type_id).unwrap_or(4);
                out.extend_from_slice(&et.to_le_bytes());
                out.extend_from_slice(&(a.len() as u64).to_le_bytes());
                for x in a {
                    Self::put_value(out, x);
                }
            }
            Value::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
            Value::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
            Value::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
        }
    }
    /// Serialize to bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        let a = self.alignment as usize;
        let mut out = Vec::new();
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&3u32.to_le_bytes());
        out.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        out.extend_from_slice(&(self.kvs.len() as u64).to_le_bytes());
        for (k, v) in &self.kvs {
            Self::put_str(&mut out, k);
            out.extend_from_slice(&Self::type_id(v).to_le_bytes());
            Self::put_value(&mut out, v);
        }
        let mut offset = 0usize;
        let mut offsets = Vec::new();
        for (name, ne, ty, data) in &self.tensors {
            Self::put_str(&mut out, name);
            out.extend_from_slice(&(ne.len() as u32).to_le_bytes());
            for d in ne {
                out.extend_from_slice(&d.to_le_bytes());
            }
            out.extend_from_slice(&ggml_type_id(*ty).to_le_bytes());
            out.extend_from_slice(&(offset as u64).to_le_bytes());
            offsets.push(offset);
            offset = (offset + data.len()).div_ceil(a) * a;
        }
        let data_start = out.len().div_ceil(a) * a;
        out.resize(data_start, 0);
        for ((_, _, _, data), off) in self.tensors.iter().zip(offsets) {
            out.resize(data_start + off, 0);
            out.extend_from_slice(data);
        }
        out
    }
}
