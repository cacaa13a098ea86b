//! CUDA backend (placeholder while it is written).
use std::path::Path;
pub fn availability(_root: &Path) -> Result<String, String> {
    Err("not implemented yet".into())
}
pub type CudaBackend = super::wgpu::WgpuBackend;
pub fn open(_root: &Path, _cfg: &crate::model::ModelConfig) -> Result<CudaBackend, super::BackendError> {
    Err(super::BackendError::Setup("not implemented yet".into()))
}
