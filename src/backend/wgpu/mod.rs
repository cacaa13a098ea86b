//! WGSL compute-shader backend through wgpu (placeholder until the backend lands).

use std::path::Path;

use super::{AttnSeg, AttnShape, Backend, BackendError, RopeTable, WeightId, WeightInfo};

/// The shaders (file name, source) shipped in bundles as `kernels/wgsl/NAME`.
pub const SHADERS: &[(&str, &str)] = &[];

pub struct WgpuBackend {
    never: std::convert::Infallible,
}

impl WgpuBackend {
    pub fn open(_weights_path: &Path, _shader_dir: &Path) -> Result<WgpuBackend, BackendError> {
        Err(BackendError::Setup("the wgpu backend is not implemented yet".into()))
    }
    pub fn description(&self) -> String {
        "wgpu".into()
    }
}

/// What wgpu finds on this machine, for `doctor` and backend selection.
#[derive(Debug, Clone)]
pub struct AdapterReport {
    pub name: String,
    pub backend: String,
    pub device_type: String,
    pub driver: String,
    /// Largest storage-buffer binding, bytes.
    pub max_storage_binding: u64,
    /// A software rasteriser (llvmpipe/lavapipe): correct but slower than the CPU backend.
    pub is_software: bool,
}

pub fn probe() -> Result<AdapterReport, String> {
    Err("the wgpu backend is not implemented yet".into())
}

impl Backend for WgpuBackend {
    type Buf = ();
    type Kv = ();
    fn name(&self) -> &'static str {
        match self.never {}
    }
    fn weight(&mut self, _: &str) -> Result<WeightId, BackendError> {
        match self.never {}
    }
    fn weight_info(&self, _: WeightId) -> WeightInfo {
        match self.never {}
    }
    fn alloc(&self, _: usize) {
        match self.never {}
    }
    fn read(&self, _: &(), _: usize) -> Vec<f32> {
        match self.never {}
    }
    fn write(&self, _: &mut (), _: &[f32]) {
        match self.never {}
    }
    fn embed(&self, _: WeightId, _: &[u32], _: &mut ()) {
        match self.never {}
    }
    fn matmul(&self, _: &(), _: usize, _: &mut [(WeightId, &mut ())]) {
        match self.never {}
    }
    fn add_bias(&self, _: &mut (), _: usize, _: WeightId) {
        match self.never {}
    }
    fn rms_norm(&self, _: &(), _: usize, _: WeightId, _: f32, _: &mut ()) {
        match self.never {}
    }
    fn rope_cache(&self, _: &[u32], _: &RopeTable, _: &mut ()) {
        match self.never {}
    }
    fn rope(&self, _: &mut (), _: usize, _: usize, _: usize, _: &(), _: usize) {
        match self.never {}
    }
    fn add(&self, _: &mut (), _: &(), _: usize) {
        match self.never {}
    }
    fn add_rows(&self, _: &mut (), _: usize, _: usize, _: &[f32]) {
        match self.never {}
    }
    fn silu_mul(&self, _: &mut (), _: &(), _: usize) {
        match self.never {}
    }
    fn gather_rows(&self, _: &(), _: usize, _: &[usize], _: &mut ()) {
        match self.never {}
    }
    fn kv_new(&self, _: usize, _: usize, _: usize) {
        match self.never {}
    }
    fn kv_write(&self, _: &mut (), _: usize, _: &(), _: &(), _: usize, _: usize, _: usize) {
        match self.never {}
    }
    fn kv_truncate(&self, _: &mut (), _: usize) {
        match self.never {}
    }
    fn attention(&self, _: usize, _: &(), _: &[AttnSeg<'_, ()>], _: AttnShape, _: &mut ()) {
        match self.never {}
    }
}
