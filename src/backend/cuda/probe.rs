//! Probe the NVIDIA driver before cudarc touches it.
//!
//! cudarc's dynamic loading panics when `libcuda` is missing, and a stub `libcuda.so.1` (as CUDA
//! toolkits and containers ship) makes `CudaContext::new` panic too. So we open the library
//! ourselves, resolve the symbols we need, call `cuInit(0)` and read the devices; only a driver
//! that passes is handed to cudarc. `APPLIANCED_LIBCUDA` names another library file (tests use
//! fake libraries through it).
#![allow(unsafe_code)] // FFI: the driver and NVRTC C APIs, kernel launches

use std::ffi::{c_char, c_int, c_uint, CStr};

use crate::sys::DynLib;

/// What the driver reported.
#[derive(Debug, Clone, PartialEq)]
pub struct DriverReport {
    pub library: String,
    /// CUDA driver API version, e.g. 12040 for 12.4.
    pub driver_version: i32,
    pub devices: Vec<DeviceReport>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct DeviceReport {
    pub ordinal: i32,
    pub name: String,
    /// Compute capability `(major, minor)`.
    pub cc: (i32, i32),
    pub total_mem: u64,
    pub multiprocessors: i32,
}

impl DriverReport {
    pub fn version_string(&self) -> String {
        format!("{}.{}", self.driver_version / 1000, (self.driver_version % 1000) / 10)
    }
}

type CuInit = unsafe extern "C" fn(c_uint) -> c_int;
type CuDriverGetVersion = unsafe extern "C" fn(*mut c_int) -> c_int;
type CuDeviceGetCount = unsafe extern "C" fn(*mut c_int) -> c_int;
type CuDeviceGet = unsafe extern "C" fn(*mut c_int, c_int) -> c_int;
type CuDeviceGetName = unsafe extern "C" fn(*mut c_char, c_int, c_int) -> c_int;
type CuDeviceGetAttribute = unsafe extern "C" fn(*mut c_int, c_int, c_int) -> c_int;
type CuDeviceTotalMem = unsafe extern "C" fn(*mut usize, c_int) -> c_int;

const ATTR_MULTIPROCESSOR_COUNT: c_int = 16;
const ATTR_CC_MAJOR: c_int = 75;
const ATTR_CC_MINOR: c_int = 76;

/// A driver entry point as `T`.
///
/// # Safety
/// `T` must be the entry point's C signature as a function-pointer type.
unsafe fn sym<T: Copy>(lib: &DynLib, name: &str) -> Result<T, String> {
    // SAFETY: the caller's contract.
    unsafe { lib.symbol(name) }.map_err(|_| format!("the driver library lacks {name}"))
}

fn check(what: &str, r: c_int) -> Result<(), String> {
    match r {
        0 => Ok(()),
        100 => Err(format!("{what}: no CUDA-capable device (CUDA_ERROR_NO_DEVICE)")),
        35 => Err(format!("{what}: the driver is older than this runtime needs (CUDA_ERROR_INSUFFICIENT_DRIVER)")),
        34 => Err(format!("{what}: a stub driver library is installed, not the real driver (CUDA_ERROR_STUB_LIBRARY)")),
        999 => Err(format!("{what}: unknown driver error (999)")),
        e => Err(format!("{what} failed with CUDA error {e}")),
    }
}

/// Open and initialise the driver; report its version and devices. Never panics.
pub fn probe() -> Result<DriverReport, String> {
    let library = std::env::var("APPLIANCED_LIBCUDA").unwrap_or_else(|_| "libcuda.so.1".into());
    // Global, and kept open for the process: cudarc reuses it.
    let lib = DynLib::open(&library, true).map_err(|e| format!("no NVIDIA driver ({e})"))?;
    let lib = &lib;
    // SAFETY: the type aliases above are the entry points' C signatures.
    let (init, version, count, get, name, attr, mem) = unsafe {
        (
            sym::<CuInit>(lib, "cuInit")?,
            sym::<CuDriverGetVersion>(lib, "cuDriverGetVersion")?,
            sym::<CuDeviceGetCount>(lib, "cuDeviceGetCount")?,
            sym::<CuDeviceGet>(lib, "cuDeviceGet")?,
            sym::<CuDeviceGetName>(lib, "cuDeviceGetName")?,
            sym::<CuDeviceGetAttribute>(lib, "cuDeviceGetAttribute")?,
            sym::<CuDeviceTotalMem>(lib, "cuDeviceTotalMem_v2")?,
        )
    };
    // SAFETY: resolved driver entry points called with valid out-pointers, per the driver API.
    unsafe {
        check("cuInit", init(0))?;
        let mut v = 0;
        check("cuDriverGetVersion", version(&mut v))?;
        let mut n = 0;
        check("cuDeviceGetCount", count(&mut n))?;
        if n <= 0 {
            return Err("the driver reports no CUDA device".into());
        }
        let mut devices = Vec::new();
        for i in 0..n.min(16) {
            let mut dev = 0;
            check("cuDeviceGet", get(&mut dev, i))?;
            let mut buf = [0 as c_char; 256];
            check("cuDeviceGetName", name(buf.as_mut_ptr(), 255, dev))?;
            let (mut ma, mut mi, mut sms) = (0, 0, 0);
            check("cuDeviceGetAttribute", attr(&mut ma, ATTR_CC_MAJOR, dev))?;
            check("cuDeviceGetAttribute", attr(&mut mi, ATTR_CC_MINOR, dev))?;
            check("cuDeviceGetAttribute", attr(&mut sms, ATTR_MULTIPROCESSOR_COUNT, dev))?;
            let mut bytes = 0usize;
            check("cuDeviceTotalMem", mem(&mut bytes, dev))?;
            devices.push(DeviceReport {
                ordinal: i,
                name: CStr::from_ptr(buf.as_ptr()).to_string_lossy().into_owned(),
                cc: (ma, mi),
                total_mem: bytes as u64,
                multiprocessors: sms,
            });
        }
        Ok(DriverReport { library, driver_version: v, devices })
    }
}
