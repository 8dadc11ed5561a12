//! One CUDA device: its context, the one stream every op runs on, and the loaded kernel modules.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use cudarc::driver::{
    CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, DevicePtr, DevicePtrMut,
    DeviceRepr, ValidAsZeroBits,
};
use cudarc::nvrtc::Ptx;

use crate::error::{CudaError, Result};
use crate::guard;
use crate::kernels::{self, Module};
use crate::options::CudaOptions;

/// How one kernel module was obtained (for logs and benchmarks).
#[derive(Clone, Debug)]
pub struct ModuleInfo {
    pub module: &'static str,
    pub hash: String,
    pub arch: String,
    pub cache_path: Option<PathBuf>,
    pub from_cache: bool,
    /// NVRTC compile (or cache read) time plus the driver's module load, in ms.
    pub millis: f64,
}

/// An open CUDA device. All ops are queued on one stream ([`CudaDevice::stream`]), in order;
/// results are visible to the host after [`CudaDevice::synchronize`] or a download.
pub struct CudaDevice {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    name: String,
    cc: (i32, i32),
    /// Launch with programmatic dependent launch ([`crate::launch`]).
    pdl: bool,
    arch: String,
    /// The switches everything on this device reads.
    opts: CudaOptions,
    modules: Mutex<HashMap<Module, Arc<CudaModule>>>,
    funcs: Mutex<HashMap<String, CudaFunction>>,
    infos: Mutex<Vec<ModuleInfo>>,
    /// Scratch of the prefill GEMM (see `gemm.rs`), grown on demand.
    pub(crate) gemm: Mutex<crate::gemm::GemmScratch>,
    /// The cuBLAS handle, made at the first GEMM (None: libcublas cannot be used).
    pub(crate) blas: std::sync::OnceLock<Option<cudarc::cublas::CudaBlas>>,
}

impl std::fmt::Debug for CudaDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaDevice")
            .field("ordinal", &self.ctx.ordinal())
            .field("name", &self.name)
            .field("arch", &self.arch)
            .finish()
    }
}

impl CudaDevice {
    /// Opens device `ordinal` with the default [`CudaOptions`] (no kernel cache on disk).
    /// Errors (never panics) when there is no driver, no such device, or the driver fails.
    pub fn open(ordinal: usize) -> Result<Self> {
        Self::open_with(ordinal, CudaOptions::default())
    }

    /// Opens device `ordinal` with `opts`, which every op, scratch and model on it follows.
    /// Errors (never panics) when there is no driver, no such device, or the driver fails.
    pub fn open_with(ordinal: usize, opts: CudaOptions) -> Result<Self> {
        guard("CudaDevice::open", || {
            if !crate::driver_present() {
                return Err(CudaError::NoDriver);
            }
            let count = crate::device_count()?;
            if ordinal >= count {
                return Err(CudaError::NoDevice { ordinal, count });
            }
            let ctx = CudaContext::new(ordinal).map_err(|e| CudaError::driver("cuCtx", e))?;
            // One stream, ordered by construction: cudarc's per-buffer event tracking (meant for
            // several streams) is switched off before any buffer exists.
            // SAFETY: no CudaSlice has been allocated in this context by us yet, and this crate
            // queues all work on the single stream created below.
            unsafe { ctx.disable_event_tracking() };
            let stream = ctx
                .new_stream()
                .map_err(|e| CudaError::driver("cuStreamCreate", e))?;
            let name = ctx
                .name()
                .map_err(|e| CudaError::driver("cuDeviceGetName", e))?;
            let cc = ctx
                .compute_capability()
                .map_err(|e| CudaError::driver("compute capability", e))?;
            Ok(CudaDevice {
                arch: kernels::arch_for(cc.0, cc.1),
                ctx,
                stream,
                name,
                cc,
                pdl: crate::launch::pdl_enabled(cc.0, opts.pdl),
                opts: opts.clone(),
                modules: Mutex::new(HashMap::new()),
                funcs: Mutex::new(HashMap::new()),
                infos: Mutex::new(Vec::new()),
                gemm: Mutex::new(Default::default()),
                blas: std::sync::OnceLock::new(),
            })
        })
    }

    pub fn ordinal(&self) -> usize {
        self.ctx.ordinal()
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn compute_capability(&self) -> (i32, i32) {
        self.cc
    }

    /// The NVRTC target, `sm_XY`.
    pub fn arch(&self) -> &str {
        &self.arch
    }

    /// Whether kernels launch with programmatic dependent launch (sm_90+ and
    /// [`CudaOptions::pdl`]).
    pub fn pdl(&self) -> bool {
        self.pdl
    }

    /// A launch of `f` on this device's stream.
    pub(crate) fn launch<'a>(&'a self, f: &'a CudaFunction) -> crate::launch::Launch<'a> {
        crate::launch::Launch::new(&self.stream, f, self.pdl)
    }

    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// The options this device was opened with.
    pub fn options(&self) -> &CudaOptions {
        &self.opts
    }

    /// Where compiled kernels are cached ([`CudaOptions::kernel_cache_dir`]; None: kernels are
    /// compiled per process).
    pub fn cache_dir(&self) -> Option<&std::path::Path> {
        self.opts.kernel_cache_dir.as_deref()
    }

    /// Modules loaded so far, in load order.
    pub fn loaded_modules(&self) -> Vec<ModuleInfo> {
        self.infos.lock().unwrap().clone()
    }

    /// Compiles (or reads from the cache) and loads every kernel module now, instead of at first
    /// use, on as many threads as the host has.
    pub fn load_all(&self) -> Result<()> {
        let threads = std::thread::available_parallelism().map_or(4, |n| n.get());
        self.load_all_with(threads, &mut |_, _| {})
    }

    /// [`load_all`](Self::load_all) on up to `threads` compiling threads:
    /// [`compile_missing`](Self::compile_missing), then [`install`](Self::install).
    pub fn load_all_with(
        &self,
        threads: usize,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<()> {
        let compiled = self.compile_missing(threads, progress)?;
        self.install(compiled)
    }

    /// The PTX of every kernel module not loaded yet, compiled (or read from the cache) on up
    /// to `threads` threads ([`kernels::load_or_compile_all`]); `progress(ready, total)` as
    /// modules are ready. Uses NVRTC only, not the device, so it may run on another thread
    /// while weights upload.
    pub fn compile_missing(
        &self,
        threads: usize,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<Vec<(Module, kernels::Compiled)>> {
        let missing: Vec<Module> = {
            let loaded = self.modules.lock().unwrap();
            Module::ALL
                .into_iter()
                .filter(|m| !loaded.contains_key(m))
                .collect()
        };
        let compiled = kernels::load_or_compile_all(
            &missing,
            &self.arch,
            self.cache_dir(),
            threads,
            &mut |done, total, _| progress(done, total),
        )?;
        Ok(missing.into_iter().zip(compiled).collect())
    }

    /// Loads compiled modules into the context (those loaded meanwhile are skipped).
    pub fn install(&self, compiled: Vec<(Module, kernels::Compiled)>) -> Result<()> {
        for (m, c) in compiled {
            if !self.modules.lock().unwrap().contains_key(&m) {
                self.install_one(m, c)?;
            }
        }
        Ok(())
    }

    pub(crate) fn module(&self, m: Module) -> Result<Arc<CudaModule>> {
        if let Some(md) = self.modules.lock().unwrap().get(&m) {
            return Ok(md.clone());
        }
        let c = kernels::load_or_compile(m, &self.arch, self.cache_dir())?;
        self.install_one(m, c)
    }

    /// Loads a compiled module into the context and records it (its time: the compile or the
    /// cache read, and the load).
    fn install_one(&self, m: Module, c: kernels::Compiled) -> Result<Arc<CudaModule>> {
        let t0 = std::time::Instant::now();
        let md = guard("load module", || {
            self.ctx
                .load_module(Ptx::from_src(c.ptx))
                .map_err(|e| CudaError::driver(format!("cuModuleLoadData({}.cu)", m.name()), e))
        })?;
        self.infos.lock().unwrap().push(ModuleInfo {
            module: m.name(),
            hash: c.hash,
            arch: self.arch.clone(),
            cache_path: c.cache_path,
            from_cache: c.from_cache,
            millis: c.millis + t0.elapsed().as_secs_f64() * 1e3,
        });
        self.modules.lock().unwrap().insert(m, md.clone());
        Ok(md)
    }

    pub(crate) fn func(&self, m: Module, name: &str) -> Result<CudaFunction> {
        if let Some(f) = self.funcs.lock().unwrap().get(name) {
            return Ok(f.clone());
        }
        let md = self.module(m)?;
        let f = guard("load function", || {
            md.load_function(name)
                .map_err(|e| CudaError::driver(format!("cuModuleGetFunction({name})"), e))
        })?;
        self.funcs
            .lock()
            .unwrap()
            .insert(name.to_string(), f.clone());
        Ok(f)
    }

    /// Copies host data into a new device buffer.
    pub fn upload<T: DeviceRepr>(&self, data: &[T]) -> Result<CudaSlice<T>> {
        guard("upload", || {
            self.stream
                .clone_htod(data)
                .map_err(|e| CudaError::driver("memcpy htod", e))
        })
    }

    /// Copies host data into an existing device buffer (lengths must match).
    pub fn upload_into<T: DeviceRepr>(
        &self,
        data: &[T],
        dst: &mut impl DevicePtrMut<T>,
    ) -> Result<()> {
        crate::error::ensure!(
            data.len() == dst.len(),
            "upload_into: {} values into a buffer of {}",
            data.len(),
            dst.len()
        );
        guard("upload_into", || {
            self.stream
                .memcpy_htod(data, dst)
                .map_err(|e| CudaError::driver("memcpy htod", e))
        })
    }

    /// Copies a device buffer back to the host (waits for the queued work that writes it).
    pub fn download<T: DeviceRepr + Default + Clone>(
        &self,
        src: &impl DevicePtr<T>,
    ) -> Result<Vec<T>> {
        guard("download", || {
            self.stream
                .clone_dtoh(src)
                .map_err(|e| CudaError::driver("memcpy dtoh", e))
        })
    }

    /// Copies device data into a host slice of the same length (waits for the queued work).
    pub fn download_into<T: DeviceRepr>(
        &self,
        src: &impl DevicePtr<T>,
        dst: &mut [T],
    ) -> Result<()> {
        crate::error::ensure!(
            src.len() == dst.len(),
            "download_into: {} values into a host slice of {}",
            src.len(),
            dst.len()
        );
        guard("download_into", || {
            self.stream
                .memcpy_dtoh(src, dst)
                .map_err(|e| CudaError::driver("memcpy dtoh", e))
        })
    }

    /// A zeroed device buffer of `len` values.
    pub fn alloc_zeros<T: DeviceRepr + ValidAsZeroBits>(&self, len: usize) -> Result<CudaSlice<T>> {
        guard("alloc", || {
            self.stream
                .alloc_zeros(len)
                .map_err(|e| CudaError::driver("alloc", e))
        })
    }

    /// Device-to-device copy of a whole buffer (lengths must match).
    pub fn copy<T: DeviceRepr>(
        &self,
        src: &impl DevicePtr<T>,
        dst: &mut impl DevicePtrMut<T>,
    ) -> Result<()> {
        crate::error::ensure!(
            src.len() == dst.len(),
            "copy: {} values into a buffer of {}",
            src.len(),
            dst.len()
        );
        guard("copy", || {
            self.stream
                .memcpy_dtod(src, dst)
                .map_err(|e| CudaError::driver("memcpy dtod", e))
        })
    }

    /// Sets every value of a buffer or view to zero.
    pub fn zero<T: DeviceRepr + ValidAsZeroBits>(
        &self,
        dst: &mut impl DevicePtrMut<T>,
    ) -> Result<()> {
        guard("memset", || {
            self.stream
                .memset_zeros(dst)
                .map_err(|e| CudaError::driver("memset", e))
        })
    }

    /// Waits for everything queued on the stream; reports a failed kernel here.
    pub fn synchronize(&self) -> Result<()> {
        guard("synchronize", || {
            self.stream
                .synchronize()
                .map_err(|e| CudaError::driver("cuStreamSynchronize", e))
        })
    }
}
