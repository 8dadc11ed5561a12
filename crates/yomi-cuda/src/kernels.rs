//! Kernel sources, NVRTC compilation and the on-disk PTX cache.
//!
//! Each module is one `.cu` file under `kernels/`, compiled as `common.cuh` + the file (NVRTC gets
//! one string and no include path: the kernels use no CUDA headers). The cache key is a 64-bit
//! FNV-1a hash of the full source, the compile options (the target architecture among them) and
//! the NVRTC version; the PTX is stored as `<module>-<hash>-<arch>.ptx` in the device's
//! [`crate::CudaOptions::kernel_cache_dir`] (the `yomi` binary's: [`cache_dir_from`]).

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Instant;

use crate::error::{CudaError, Result};
use crate::quant::QuantFormat;

/// The prelude every module starts with.
pub const PRELUDE: &str = include_str!("../kernels/common.cuh");

/// One kernel file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Module {
    Norm,
    Act,
    Rope,
    Gemv,
    Gdn,
    Glue,
    Attn,
    Conv,
    /// gemv_quant.cu's kernels of one format.
    GemvQuant(QuantFormat),
    Topk,
    Gemm,
}

impl Module {
    pub const ALL: [Module; 16] = [
        Module::Norm,
        Module::Act,
        Module::Rope,
        Module::Gemv,
        Module::Gdn,
        Module::Glue,
        Module::Attn,
        Module::Conv,
        Module::GemvQuant(QuantFormat::Q8_0),
        Module::GemvQuant(QuantFormat::Q4_0),
        Module::GemvQuant(QuantFormat::Q4_1),
        Module::GemvQuant(QuantFormat::Q4_K),
        Module::GemvQuant(QuantFormat::Q5_K),
        Module::GemvQuant(QuantFormat::Q6_K),
        Module::Topk,
        Module::Gemm,
    ];

    /// File stem under `kernels/`.
    pub fn name(self) -> &'static str {
        match self {
            Module::Norm => "norm",
            Module::Act => "act",
            Module::Rope => "rope",
            Module::Gemv => "gemv",
            Module::Gdn => "gdn",
            Module::Glue => "glue",
            Module::Attn => "attention",
            Module::Conv => "conv",
            Module::GemvQuant(f) => match f {
                QuantFormat::Q8_0 => "gemv_quant_q8_0",
                QuantFormat::Q4_0 => "gemv_quant_q4_0",
                QuantFormat::Q4_1 => "gemv_quant_q4_1",
                QuantFormat::Q4_K => "gemv_quant_q4_k",
                QuantFormat::Q5_K => "gemv_quant_q5_k",
                QuantFormat::Q6_K => "gemv_quant_q6_k",
            },
            Module::Topk => "topk",
            Module::Gemm => "gemm",
        }
    }

    /// The file's own text (without the prelude).
    pub fn file_source(self) -> &'static str {
        match self {
            Module::Norm => include_str!("../kernels/norm.cu"),
            Module::Act => include_str!("../kernels/act.cu"),
            Module::Rope => include_str!("../kernels/rope.cu"),
            Module::Gemv => include_str!("../kernels/gemv.cu"),
            Module::Gdn => include_str!("../kernels/gdn.cu"),
            Module::Glue => include_str!("../kernels/glue.cu"),
            Module::Attn => include_str!("../kernels/attention.cu"),
            Module::Conv => include_str!("../kernels/conv.cu"),
            Module::GemvQuant(_) => include_str!("../kernels/gemv_quant.cu"),
            Module::Topk => include_str!("../kernels/topk.cu"),
            Module::Gemm => include_str!("../kernels/gemm.cu"),
        }
    }

    /// The file the module is compiled from (several modules may share one).
    pub fn file_name(self) -> &'static str {
        match self {
            Module::GemvQuant(_) => "gemv_quant",
            m => m.name(),
        }
    }

    /// What NVRTC compiles: the prelude, the module's defines, then the file.
    pub fn source(self) -> String {
        let defines = match self {
            Module::GemvQuant(f) => {
                format!("#define QGEMV_ONLY QF_{}\n", f.tag().to_ascii_uppercase())
            }
            _ => String::new(),
        };
        format!(
            "{PRELUDE}\n{defines}#line 1 \"{}.cu\"\n{}",
            self.file_name(),
            self.file_source()
        )
    }

    /// Every `extern "C"` kernel the Rust side may launch from this module.
    pub fn kernel_names(self) -> Vec<String> {
        match self {
            Module::Norm => vec!["rms_norm_f32".into()],
            Module::Act => vec!["swiglu_f32".into()],
            Module::Rope => vec!["rope_neox_f32".into(), "rope_neox_table_f32".into()],
            Module::Gemv => crate::ops::all_gemv_kernels(),
            Module::Gdn => vec!["gdn_step_f32".into(), "gdn_tree_verify_f32".into()],
            Module::Glue => [
                "embed_f32",
                "embed_bf16",
                "pack_bf16_tiles",
                "embed_f16",
                "add_f32",
                "scale_f32",
                "split_q_gate_f32",
                "sigmoid_mul_f32",
                "gdn_split_qkv_f32",
                "gdn_conv_split_qkv_f32",
                "gdn_gate_beta_f32",
                "rms_norm_gated_f32",
                "gather_rows_f32",
                "kv_store_f32",
                "split_cols_f32",
                "swiglu_pair_f32",
                "add_rms_norm_f32",
                "attn_prep_f32",
            ]
            .map(String::from)
            .to_vec(),
            Module::Attn => crate::attention::kernel_names(),
            Module::Conv => vec!["conv1d_tree_f32".into()],
            Module::GemvQuant(f) => crate::quant::kernels_of(f),
            Module::Topk => crate::topk::KERNELS.map(String::from).to_vec(),
            Module::Gemm => crate::gemm::KERNELS.map(String::from).to_vec(),
        }
    }
}

/// 64-bit FNV-1a.
pub fn fnv1a64(bytes: &[u8], mut h: u64) -> u64 {
    for &b in bytes {
        h ^= b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

pub const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;

/// Cache key of one compilation: hash of source, options and NVRTC version (16 hex digits).
/// Parts are length-prefixed so that moving text from one part to the next changes the key.
pub fn source_hash(source: &str, options: &[String], nvrtc_version: (i32, i32)) -> String {
    let mut h = FNV_OFFSET;
    let mut part = |b: &[u8]| {
        h = fnv1a64(&(b.len() as u64).to_le_bytes(), h);
        h = fnv1a64(b, h);
    };
    part(source.as_bytes());
    for o in options {
        part(o.as_bytes());
    }
    part(format!("nvrtc {}.{}", nvrtc_version.0, nvrtc_version.1).as_bytes());
    format!("{h:016x}")
}

/// The cache folder from the values of `XDG_CACHE_HOME` and `HOME`: `$XDG_CACHE_HOME/yomi/kernels`
/// when that is an absolute path (the XDG rule), else `$HOME/.cache/yomi/kernels`, else none.
pub fn cache_dir_from(xdg_cache_home: Option<OsString>, home: Option<OsString>) -> Option<PathBuf> {
    let xdg = xdg_cache_home
        .map(PathBuf::from)
        .filter(|p| p.is_absolute());
    let base = xdg.or_else(|| {
        home.map(PathBuf::from)
            .filter(|p| p.is_absolute())
            .map(|h| h.join(".cache"))
    })?;
    Some(base.join("yomi").join("kernels"))
}

/// File name of a cached module.
pub fn cache_file_name(module: Module, hash: &str, arch: &str) -> String {
    format!("{}-{hash}-{arch}.ptx", module.name())
}

/// `sm_XY` for compute capability X.Y.
pub fn arch_for(major: i32, minor: i32) -> String {
    format!("sm_{major}{minor}")
}

/// NVRTC options used for every module.
pub fn compile_options(arch: &str) -> Vec<String> {
    vec![
        format!("--gpu-architecture={arch}"),
        "--std=c++17".to_string(),
        "-lineinfo".to_string(),
    ]
}

/// NVRTC's version; errors (no panic) when the library is missing.
pub fn nvrtc_version() -> Result<(i32, i32)> {
    crate::guard("nvrtcVersion", || {
        if !crate::nvrtc_present() {
            return Err(CudaError::NoNvrtc);
        }
        let (mut major, mut minor) = (0, 0);
        // SAFETY: two out-pointers to live integers.
        let r = unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) };
        if r != cudarc::nvrtc::sys::nvrtcResult::NVRTC_SUCCESS {
            return Err(CudaError::driver("nvrtcVersion", r));
        }
        Ok((major, minor))
    })
}

/// Compiles one module to PTX text for `arch`, with no cache. A rejected source gives
/// [`CudaError::Compile`] carrying NVRTC's log.
pub fn compile_module(module: Module, arch: &str) -> Result<String> {
    compile_source(module, &module.source(), arch)
}

fn compile_source(module: Module, source: &str, arch: &str) -> Result<String> {
    crate::guard("nvrtc compile", || {
        if !crate::nvrtc_present() {
            return Err(CudaError::NoNvrtc);
        }
        let opts = cudarc::nvrtc::CompileOptions {
            options: compile_options(arch),
            name: Some(format!("{}.cu", module.name())),
            ..Default::default()
        };
        match cudarc::nvrtc::compile_ptx_with_opts(source, opts) {
            Ok(ptx) => Ok(ptx.to_src()),
            Err(cudarc::nvrtc::CompileError::CompileError { nvrtc, log, .. }) => {
                Err(CudaError::Compile {
                    module: module.name(),
                    arch: arch.to_string(),
                    log: format!("{nvrtc:?}\n{}", log.to_string_lossy()),
                })
            }
            Err(e) => Err(CudaError::Compile {
                module: module.name(),
                arch: arch.to_string(),
                log: format!("{e:?}"),
            }),
        }
    })
}

/// PTX of one module for `arch` and where it came from.
pub struct Compiled {
    pub ptx: String,
    pub hash: String,
    pub cache_path: Option<PathBuf>,
    pub from_cache: bool,
    /// Time spent in NVRTC, or reading the cache.
    pub millis: f64,
}

/// PTX for `module` on `arch`: from the cache folder when a file for this exact key is there,
/// else compiled and written there (atomically, by rename; a cache that cannot be written is
/// not an error).
pub fn load_or_compile(module: Module, arch: &str, dir: Option<&Path>) -> Result<Compiled> {
    let t0 = Instant::now();
    let source = module.source();
    let hash = source_hash(&source, &compile_options(arch), nvrtc_version()?);
    let path = dir.map(|d| d.join(cache_file_name(module, &hash, arch)));
    if let Some(p) = &path
        && let Ok(ptx) = std::fs::read_to_string(p)
        && ptx.contains(".target")
    {
        return Ok(Compiled {
            ptx,
            hash,
            cache_path: path,
            from_cache: true,
            millis: t0.elapsed().as_secs_f64() * 1e3,
        });
    }
    let ptx = compile_source(module, &source, arch)?;
    if let Some(p) = &path {
        let _ = write_atomic(p, &ptx);
    }
    Ok(Compiled {
        ptx,
        hash,
        cache_path: path,
        from_cache: false,
        millis: t0.elapsed().as_secs_f64() * 1e3,
    })
}

/// [`load_or_compile`] for each of `modules` on up to `threads` threads at once (NVRTC
/// compiles separate programs concurrently; a first run's minute of compiling is bounded by
/// the largest module instead of the sum). Modules start largest source first, so the longest
/// compiles overlap the rest. `done(finished, total, module)` is called on this thread as each
/// module is ready, in the order they finish; the result keeps `modules`' order, or is the
/// first module's error.
pub fn load_or_compile_all(
    modules: &[Module],
    arch: &str,
    dir: Option<&Path>,
    threads: usize,
    done: &mut dyn FnMut(usize, usize, Module),
) -> Result<Vec<Compiled>> {
    let mut order: Vec<usize> = (0..modules.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(modules[i].file_source().len()));
    let next = std::sync::atomic::AtomicUsize::new(0);
    let (tx, rx) = std::sync::mpsc::channel();
    let mut out: Vec<Option<Result<Compiled>>> = (0..modules.len()).map(|_| None).collect();
    std::thread::scope(|scope| {
        for _ in 0..threads.clamp(1, modules.len().max(1)) {
            let (tx, next, order) = (tx.clone(), &next, &order);
            scope.spawn(move || {
                loop {
                    let k = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some(&i) = order.get(k) else { break };
                    if tx
                        .send((i, load_or_compile(modules[i], arch, dir)))
                        .is_err()
                    {
                        break;
                    }
                }
            });
        }
        drop(tx);
        for (finished, (i, r)) in rx.iter().enumerate() {
            done(finished + 1, modules.len(), modules[i]);
            out[i] = Some(r);
        }
    });
    out.into_iter()
        .map(|r| {
            r.unwrap_or_else(|| Err(CudaError::Invalid("a kernel compile thread stopped".into())))
        })
        .collect()
}

fn write_atomic(path: &Path, text: &str) -> std::io::Result<()> {
    if let Some(d) = path.parent() {
        std::fs::create_dir_all(d)?;
    }
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv1a64_known_vectors() {
        assert_eq!(fnv1a64(b"", FNV_OFFSET), 0xcbf29ce484222325);
        assert_eq!(fnv1a64(b"a", FNV_OFFSET), 0xaf63dc4c8601ec8c);
        assert_eq!(fnv1a64(b"foobar", FNV_OFFSET), 0x85944171f73967e8);
    }

    #[test]
    fn source_hash_depends_on_source_options_and_version() {
        let o90 = compile_options("sm_90");
        let o80 = compile_options("sm_80");
        let src = Module::Gemv.source();
        let h = source_hash(&src, &o90, (13, 0));
        assert_eq!(h.len(), 16);
        assert!(h.chars().all(|c| c.is_ascii_hexdigit()));
        assert_eq!(h, source_hash(&src, &o90, (13, 0)), "stable");
        assert_ne!(h, source_hash(&src, &o80, (13, 0)), "arch");
        assert_ne!(h, source_hash(&src, &o90, (13, 1)), "nvrtc version");
        assert_ne!(h, source_hash(&format!("{src} "), &o90, (13, 0)), "source");
        // Part boundaries count: "ab" + "c" differs from "a" + "bc".
        assert_ne!(
            source_hash("ab", &["c".into()], (1, 0)),
            source_hash("a", &["bc".into()], (1, 0))
        );
        // Every module hashes differently.
        let mut all: Vec<String> = Module::ALL
            .iter()
            .map(|m| source_hash(&m.source(), &o90, (13, 0)))
            .collect();
        all.sort();
        all.dedup();
        assert_eq!(all.len(), Module::ALL.len());
    }

    #[test]
    fn cache_dir_follows_xdg_then_home() {
        let p = cache_dir_from(Some("/x/cache".into()), Some("/home/u".into())).unwrap();
        assert_eq!(p, PathBuf::from("/x/cache/yomi/kernels"));
        // A relative or empty XDG_CACHE_HOME is ignored (XDG base-directory rule).
        for bad in ["", "rel/cache"] {
            let p = cache_dir_from(Some(bad.into()), Some("/home/u".into())).unwrap();
            assert_eq!(p, PathBuf::from("/home/u/.cache/yomi/kernels"));
        }
        let p = cache_dir_from(None, Some("/root".into())).unwrap();
        assert_eq!(p, PathBuf::from("/root/.cache/yomi/kernels"));
        assert_eq!(cache_dir_from(None, None), None);
        assert_eq!(cache_dir_from(None, Some("".into())), None);
        assert_eq!(
            cache_file_name(Module::Gdn, "0123456789abcdef", "sm_90"),
            "gdn-0123456789abcdef-sm_90.ptx"
        );
        assert_eq!(arch_for(9, 0), "sm_90");
        assert_eq!(arch_for(8, 6), "sm_86");
    }

    /// Every kernel the Rust side launches is defined in its file, and every file states its math
    /// in a header comment.
    #[test]
    fn launched_kernels_exist_in_the_sources() {
        for m in Module::ALL {
            let src = m.file_source();
            assert!(
                src.starts_with("//"),
                "{}.cu has no header comment",
                m.name()
            );
            for k in m.kernel_names() {
                let defined = src.contains(&format!("void {k}("))
                    || src.contains(&format!("void\n    {k}("))
                    || src.contains(&format!("    {k}("))
                    || src.contains(&format!("GEMM_KERNEL({k}, "))
                    || gemv_macro_defines(src, &k)
                    || attn_macro_defines(src, &k)
                    || crate::quant::macro_defines(src, &k);
                assert!(defined, "kernel {k} not found in {}.cu", m.name());
            }
        }
    }

    /// The PDL contract of `src/launch.rs`: every kernel's first statement is `grid_dep_begin()`
    /// (let the next kernel start, then wait for the previous one), or `grid_dep_trigger()` for
    /// the kernels that load weights before they wait, whose body must then call
    /// `grid_dep_wait()`. A kernel that skipped the wait could read a previous kernel's output
    /// before it is written once launches overlap.
    #[test]
    fn every_kernel_keeps_the_pdl_contract() {
        let mut kernels = 0;
        for m in Module::ALL {
            let src = m.file_source();
            for (at, _) in src.match_indices("__global__") {
                let body = &src[at..];
                let open = body.find('{').expect("kernel without a body");
                let first =
                    body[open + 1..].trim_start_matches(|c: char| c.is_whitespace() || c == '\\');
                let line = &src[..at].lines().count() + 1;
                if first.starts_with("grid_dep_trigger();") {
                    // The wait lives in the body function the kernel calls; the only such
                    // kernels are the tensor-core GEMVs, whose body waits after its first loads.
                    assert!(
                        src.contains("grid_dep_wait();"),
                        "{}.cu:{line}: triggers but never waits",
                        m.name()
                    );
                } else {
                    assert!(
                        first.starts_with("grid_dep_begin();"),
                        "{}.cu:{line}: a kernel that does not start with grid_dep_begin()",
                        m.name()
                    );
                }
                kernels += 1;
            }
        }
        assert!(kernels >= 30, "only {kernels} kernels found");
    }

    /// `attn_partial_hd<HD>_f32` is stamped out by `ATT_PARTIAL_KERNEL(HC, HD)` and
    /// `attn_mma_hd<HD>_d<DS>_f32` by `ATT_MMA_KERNEL(HD, DS)`.
    fn attn_macro_defines(src: &str, name: &str) -> bool {
        if let Some((hd, ds)) = name
            .strip_prefix("attn_mma_hd")
            .and_then(|r| r.strip_suffix("_f32"))
            .and_then(|r| r.split_once("_d"))
        {
            return src
                .lines()
                .any(|l| l == format!("ATT_MMA_KERNEL({hd}, {ds})"));
        }
        name.strip_prefix("attn_partial_hd")
            .and_then(|r| r.strip_suffix("_f32"))
            .is_some_and(|hd| {
                src.lines().any(|l| {
                    l.starts_with("ATT_PARTIAL_KERNEL(") && l.ends_with(&format!(", {hd})"))
                })
            })
    }

    /// The GEMV kernels are stamped out by macros: `gemv_<dtype>_t<T>_r<R>_u<U>`,
    /// `gemv_bf16_tc_w<W>_m<MT>_n<NT>_u<U>` and `gemv_bf16_tc_swiglu_w<W>_m<MT>_n<NT>_u<U>`.
    fn gemv_macro_defines(src: &str, name: &str) -> bool {
        if let Some(rest) = name.strip_prefix("gemv_bf16_tc_swiglu_w") {
            let (w, rest) = rest.split_once("_m").unwrap();
            let (m, rest) = rest.split_once("_n").unwrap();
            let (nt, u) = rest.split_once("_u").unwrap();
            return src.contains(&format!("GEMV_TC_SWIGLU_KERNEL({w}, {m}, {nt}, {u})"));
        }
        if let Some(rest) = name.strip_prefix("gemv_bf16_tc_w") {
            let (w, rest) = rest.split_once("_m").unwrap();
            let (m, rest) = rest.split_once("_n").unwrap();
            let (nt, u) = rest.split_once("_u").unwrap();
            return src.contains(&format!("GEMV_TC_KERNEL({w}, {m}, {nt}, {u})"))
                || (src.contains(&format!("GEMV_TC_WARPS({w})"))
                    && src.contains(&format!("GEMV_TC_KERNEL(W, {m}, {nt}, {u})")));
        }
        let Some(rest) = name.strip_prefix("gemv_") else {
            return false;
        };
        let (dtype, tail) = rest.split_once('_').unwrap();
        src.contains(&format!("GEMV_KERNEL({name},"))
            || (src.contains(&format!("GEMV_DTYPE({dtype},"))
                && src.contains(&format!("gemv_##D##_{tail},")))
    }

    /// A source NVRTC rejects is an error carrying the compiler's log. Also compiles every real
    /// module for sm_90 and checks the entry points. Needs libnvrtc: `.ci/run` installs the
    /// NVRTC 13.0 wheel and runs `cargo test -p yomi-cuda -- --ignored nvrtc`.
    #[test]
    #[ignore = "needs NVRTC (pip nvidia-cuda-nvrtc==13.0.*); run with --ignored nvrtc"]
    fn nvrtc_compiles_every_module() {
        assert!(
            crate::nvrtc_present(),
            "libnvrtc not found on the library path"
        );
        for m in Module::ALL {
            let ptx = compile_module(m, "sm_90").unwrap_or_else(|e| panic!("{e}"));
            assert!(ptx.contains(".target sm_90"));
            for k in m.kernel_names() {
                assert!(
                    ptx.contains(&format!(".entry {k}(")),
                    "{k} missing from the PTX"
                );
            }
            // A format's module holds that format's kernels only.
            if let Module::GemvQuant(f) = m {
                for other in QuantFormat::ALL.into_iter().filter(|&o| o != f) {
                    let stray = format!(".entry gemv_{}_", other.tag());
                    assert!(!ptx.contains(&stray), "{}: {stray}", m.name());
                }
            }
        }
        let e = compile_source(
            Module::Norm,
            "extern \"C\" __global__ void f() { undeclared_thing(); }",
            "sm_90",
        )
        .unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("undeclared_thing"), "{msg}");
    }

    /// Every module compiled on several threads at once is the PTX one thread compiles, the
    /// progress counts each module once, and a second call reads them all from the cache.
    /// Prints the sum of the modules' compile times against the wall time.
    #[test]
    #[ignore = "needs NVRTC (pip nvidia-cuda-nvrtc==13.0.*); run with --ignored nvrtc"]
    fn nvrtc_compiles_modules_in_parallel() {
        assert!(
            crate::nvrtc_present(),
            "libnvrtc not found on the library path"
        );
        let dir = std::env::temp_dir().join(format!("yomi-kpar-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
        let mut seen = Vec::new();
        let t0 = Instant::now();
        let all = load_or_compile_all(
            &Module::ALL,
            "sm_90",
            Some(&dir),
            threads,
            &mut |n, total, m| {
                assert_eq!(total, Module::ALL.len());
                seen.push((n, m));
            },
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let wall = t0.elapsed().as_secs_f64() * 1e3;
        let sum: f64 = all.iter().map(|c| c.millis).sum();
        println!(
            "RESULT {} modules on {threads} threads: {wall:.0} ms wall, {sum:.0} ms summed",
            all.len()
        );
        assert_eq!(seen.len(), Module::ALL.len());
        assert!(seen.iter().enumerate().all(|(i, &(n, _))| n == i + 1));
        for (m, c) in Module::ALL.iter().zip(&all) {
            println!("RESULT module {}: {:.0} ms", m.name(), c.millis);
            assert!(!c.from_cache);
            assert!(seen.iter().any(|&(_, s)| s == *m));
            let one = compile_module(*m, "sm_90").unwrap_or_else(|e| panic!("{e}"));
            assert!(c.ptx == one, "{}: the parallel compile differs", m.name());
        }
        let again = load_or_compile_all(
            &Module::ALL,
            "sm_90",
            Some(&dir),
            threads,
            &mut |_, _, _| {},
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert!(again.iter().all(|c| c.from_cache));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    #[ignore = "needs NVRTC (pip nvidia-cuda-nvrtc==13.0.*); run with --ignored nvrtc"]
    fn nvrtc_cache_round_trip() {
        assert!(
            crate::nvrtc_present(),
            "libnvrtc not found on the library path"
        );
        let dir = std::env::temp_dir().join(format!("yomi-kcache-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let a = load_or_compile(Module::Act, "sm_90", Some(&dir)).unwrap();
        assert!(!a.from_cache);
        let b = load_or_compile(Module::Act, "sm_90", Some(&dir)).unwrap();
        assert!(b.from_cache);
        assert_eq!(a.ptx, b.ptx);
        assert_eq!(a.cache_path, b.cache_path);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
