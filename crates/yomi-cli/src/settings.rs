//! Every environment variable `yomi` reads, read once at start-up ([`Settings::from_env`], in
//! `main`, before any command runs) into typed options for the crates: the libraries read no
//! environment. Apart from `YOMI_API_KEY` and the Hugging Face cache and hub (`HF_*`) these are
//! switches for measuring, not for everyday use (README, "Switches for measuring"); unset or
//! empty means the default, and a value outside those listed stops `yomi` with a one-line
//! error.
//!
//! | variable | values (default first) | meaning | option |
//! |---|---|---|---|
//! | `YOMI_CPU_ISA` | unset, `avx512`, `avx-vnni`, `avx2`, `portable` | a ceiling on the instruction sets of every CPU kernel (unset: none), e.g. to measure on an AVX-512 machine what an AVX2-only CPU runs; same output, other speed | [`yomi_cpu::CpuOptions::isa_cap`] |
//! | `YOMI_QUANT_ACT` | `int8x2`, `int8` | activations of the quantized CPU kernels: two int8 planes (~16 bits) or one | [`yomi_cpu::CpuOptions::quant_act`] |
//! | `YOMI_QUANT_ROWS` | `tiled`, `per-row` | the quantized CPU kernels share each weight block between a tile of activation rows, or dot each row on its own (same bits) | [`yomi_cpu::CpuOptions::quant_row_tiling`] |
//! | `YOMI_QUANT_AMX` | `on`, `off` | the packed CPU kernels run 5 or more activation rows on the Intel AMX tiles where the CPU and Linux allow it (same bits) | [`yomi_cpu::CpuOptions::amx`] |
//! | `YOMI_QUANT_PACK` | `on`, `off` | Q8_0/Q4_0/Q4_1 weights regrouped 16 rows at a time for the CPU's packed kernels, or kept in GGML row order | [`yomi_engine::EngineOptions::quant_pack`] |
//! | `YOMI_PASS_THREADS` | unset, a count ≥ 1 | every CPU pass on this many threads (unset: each size of pass on the count that measures fastest) | [`yomi_engine::EngineOptions::pass_threads`] |
//! | `YOMI_PASS_TRACE` | `0`, `1` | print each verify pass's rows and time to stderr: on the CPU with its threads (`pass rows=T threads=N us=…`), on a GPU `pass rows=T device us=…` | [`yomi_engine::EngineOptions::pass_trace`] |
//! | `YOMI_CUDA_TOPK` | `1`, `0` | rank each logits row on the GPU and copy back its 64 most likely tokens, or copy full logits back | [`yomi_cuda::CudaOptions::topk`] |
//! | `YOMI_CUDA_GRAPHS` | `1`, `0` | replay passes of up to 32 rows as CUDA graphs | [`yomi_cuda::CudaOptions::graphs`] |
//! | `YOMI_CUDA_FUSE` | `1`, `0` | fused projections on the GPU (and with them the SwiGLU epilogue of the bf16 gate\|up GEMV and the GDN conv folded into the q/k/v split) | [`yomi_cuda::CudaOptions::fuse`] |
//! | `YOMI_CUDA_PDL` | `0`, `1` | programmatic dependent launch (compute capability 9.0 and later) | [`yomi_cuda::CudaOptions::pdl`] |
//! | `YOMI_CUDA_ATTN_MMA` | `1`, a row count, `0` | passes of at least that many rows run attention on the tensor cores; `0` keeps it on the CUDA cores | [`yomi_cuda::CudaOptions::attn_mma_from`] |
//! | `YOMI_CUDA_CUBLAS` | `1`, `0` | GEMMs (linear layers of more than 32 rows) through cuBLAS when libcublas loads, or yomi's own tensor-core GEMM | [`yomi_cuda::CudaOptions::cublas`] |
//! | `YOMI_CUDA_GEMM_LO` | `1`, `0` | the GEMMs keep the activations' low bf16 plane (~16 bits), or drop it (bf16 activations, faster, relative error about 1.5e-3) | [`yomi_cuda::CudaOptions::gemm_lo`] |
//! | `YOMI_CUDA_GEMM` | `1`, `0` | linear layers of more than 32 rows as GEMMs, or as 32-row GEMVs | [`yomi_cuda::CudaOptions::gemm`] |
//! | `YOMI_CUDA_CHUNK` | `1`, `0` | prompts through the GPU in passes of up to 2048 tokens (each weight read once per pass), or in the engine's own 256-token passes | [`yomi_cuda::CudaOptions::chunk`] |
//! | `XDG_CACHE_HOME`, `HOME` | paths | the compiled GPU kernels are cached in `$XDG_CACHE_HOME/yomi/kernels` (when absolute), else `$HOME/.cache/yomi/kernels`, else not at all | [`yomi_cuda::CudaOptions::kernel_cache_dir`] |
//! | `YOMI_API_KEY` | unset, a key | the bearer token of `serve` (required on `/v1/*`) and `bench` (sent) when `--api-key` is not given | [`Settings::api_key`] |
//! | `HF_HUB_CACHE`, `HF_HOME` (and `XDG_CACHE_HOME`, `HOME`) | paths | the Hugging Face cache that `--model hf:ORG/NAME` reads and `yomi pull` writes, as `huggingface_hub` finds it: `$HF_HUB_CACHE`, else `$HF_HOME/hub`, else `$XDG_CACHE_HOME/huggingface/hub`, else `$HOME/.cache/huggingface/hub` | [`Settings::hf_cache`] |
//! | `HF_ENDPOINT` | `https://huggingface.co`, an `http(s)://` URL | the hub `yomi pull` downloads from (its HTTP client, ureq under `hf-hub`, also takes a proxy from `ALL_PROXY`/`HTTPS_PROXY`/`HTTP_PROXY` as every tool does) | [`Settings::hf_endpoint`] |
//! | `HF_TOKEN` | unset, a token | the access token `yomi pull` sends (unset: the cache's `../token` file, written by `hf auth login`, if any) | [`Settings::hf_token`] |

use std::ffi::OsString;
use std::path::PathBuf;

use anyhow::{Result, bail};
use yomi_cpu::CpuOptions;
use yomi_cpu::isa_cap::IsaLevel;
use yomi_cpu::quant::Precision;
use yomi_cuda::CudaOptions;

/// What the environment says, read once.
#[derive(Clone, Debug)]
pub struct Settings {
    /// The CPU kernels' process-wide options (installed by [`Settings::install`]).
    pub cpu: CpuOptions,
    /// `YOMI_QUANT_PACK`, for [`yomi_engine::EngineOptions::quant_pack`].
    pub quant_pack: bool,
    /// `YOMI_PASS_THREADS`, for [`yomi_engine::EngineOptions::pass_threads`].
    pub pass_threads: Option<usize>,
    /// `YOMI_PASS_TRACE`, for [`yomi_engine::EngineOptions::pass_trace`].
    pub pass_trace: bool,
    /// The CUDA backend's options (`YOMI_CUDA_*`, the kernel cache).
    pub cuda: CudaOptions,
    /// `YOMI_API_KEY`: the default of `serve`'s and `bench`'s `--api-key`.
    pub api_key: Option<String>,
    /// The Hugging Face hub cache (`HF_HUB_CACHE`, `HF_HOME`, …; None: no home to put it in).
    pub hf_cache: Option<PathBuf>,
    /// `HF_ENDPOINT`, without a trailing `/`.
    pub hf_endpoint: String,
    /// `HF_TOKEN`.
    pub hf_token: Option<String>,
}

impl Default for Settings {
    /// Every variable unset.
    fn default() -> Self {
        Settings {
            cpu: CpuOptions::default(),
            quant_pack: true,
            pass_threads: None,
            pass_trace: false,
            cuda: CudaOptions::default(),
            api_key: None,
            hf_cache: None,
            hf_endpoint: crate::hub::DEFAULT_ENDPOINT.to_string(),
            hf_token: None,
        }
    }
}

impl Settings {
    /// Reads every variable of the table above, each once.
    pub fn from_env() -> Result<Settings> {
        Self::from_lookup(|name| std::env::var_os(name))
    }

    /// [`Settings::from_env`] over any source of values (the tests' maps).
    fn from_lookup(get: impl Fn(&str) -> Option<OsString>) -> Result<Settings> {
        let var = |name: &str| -> Result<Option<String>> {
            match get(name) {
                None => Ok(None),
                Some(v) => match v.into_string() {
                    Ok(s) if s.trim().is_empty() => Ok(None),
                    Ok(s) => Ok(Some(s)),
                    Err(v) => bail!("{name}={v:?} is not UTF-8"),
                },
            }
        };
        let mut s = Settings::default();
        if let Some(v) = var("YOMI_CPU_ISA")? {
            s.cpu.isa_cap = IsaLevel::from_name(&v)
                .ok_or_else(|| bad("YOMI_CPU_ISA", &v, "portable, avx2, avx-vnni or avx512"))?;
        }
        if let Some(v) = var("YOMI_QUANT_ACT")? {
            s.cpu.quant_act = Precision::from_name(v.trim())
                .ok_or_else(|| bad("YOMI_QUANT_ACT", &v, "int8x2 or int8"))?;
        }
        if let Some(v) = var("YOMI_QUANT_ROWS")? {
            s.cpu.quant_row_tiling = word("YOMI_QUANT_ROWS", &v, "tiled", "per-row")?;
        }
        if let Some(v) = var("YOMI_QUANT_AMX")? {
            s.cpu.amx = word("YOMI_QUANT_AMX", &v, "on", "off")?;
        }
        if let Some(v) = var("YOMI_QUANT_PACK")? {
            s.quant_pack = word("YOMI_QUANT_PACK", &v, "on", "off")?;
        }
        if let Some(v) = var("YOMI_PASS_THREADS")? {
            let n = v.trim().parse::<usize>().ok().filter(|&n| n > 0);
            s.pass_threads = Some(n.ok_or_else(|| bad("YOMI_PASS_THREADS", &v, "a count ≥ 1"))?);
        }
        if let Some(v) = var("YOMI_PASS_TRACE")? {
            s.pass_trace = flag("YOMI_PASS_TRACE", &v)?;
        }
        let cuda_flags: [(&str, &mut bool); 8] = [
            ("YOMI_CUDA_TOPK", &mut s.cuda.topk),
            ("YOMI_CUDA_GRAPHS", &mut s.cuda.graphs),
            ("YOMI_CUDA_FUSE", &mut s.cuda.fuse),
            ("YOMI_CUDA_PDL", &mut s.cuda.pdl),
            ("YOMI_CUDA_CUBLAS", &mut s.cuda.cublas),
            ("YOMI_CUDA_GEMM_LO", &mut s.cuda.gemm_lo),
            ("YOMI_CUDA_GEMM", &mut s.cuda.gemm),
            ("YOMI_CUDA_CHUNK", &mut s.cuda.chunk),
        ];
        for (name, field) in cuda_flags {
            if let Some(v) = var(name)? {
                *field = flag(name, &v)?;
            }
        }
        if let Some(v) = var("YOMI_CUDA_ATTN_MMA")? {
            s.cuda.attn_mma_from = match v.trim().parse::<usize>() {
                Ok(0) => None,
                Ok(n) => Some(n),
                Err(_) => return Err(bad("YOMI_CUDA_ATTN_MMA", &v, "a row count (0: off)")),
            };
        }
        s.cuda.kernel_cache_dir =
            yomi_cuda::kernels::cache_dir_from(get("XDG_CACHE_HOME"), get("HOME"));
        s.api_key = var("YOMI_API_KEY")?;
        s.hf_cache = crate::hub::cache_dir_from(
            get("HF_HUB_CACHE"),
            get("HF_HOME"),
            get("XDG_CACHE_HOME"),
            get("HOME"),
        );
        if let Some(v) = var("HF_ENDPOINT")? {
            let url = v.trim().trim_end_matches('/');
            if !(url.starts_with("http://") || url.starts_with("https://")) || url.contains(' ') {
                return Err(bad("HF_ENDPOINT", &v, "an http:// or https:// URL"));
            }
            s.hf_endpoint = url.to_string();
        }
        s.hf_token = var("HF_TOKEN")?.map(|t| t.trim().to_string());
        Ok(s)
    }

    /// Installs the process-wide options (the CPU kernels'); before any kernel runs.
    pub fn install(&self) -> Result<()> {
        yomi_cpu::configure(self.cpu)?;
        Ok(())
    }
}

fn bad(name: &str, v: &str, want: &str) -> anyhow::Error {
    anyhow::anyhow!("{name}={v:?}: expected {want}")
}

/// A two-word switch: `on` gives true, `off` false (surrounding spaces ignored).
fn word(name: &str, v: &str, on: &str, off: &str) -> Result<bool> {
    match v.trim() {
        w if w == on => Ok(true),
        w if w == off => Ok(false),
        _ => Err(bad(name, v, &format!("{on} or {off}"))),
    }
}

/// A 0/1 switch (surrounding spaces ignored).
fn flag(name: &str, v: &str) -> Result<bool> {
    match v.trim() {
        "1" => Ok(true),
        "0" => Ok(false),
        _ => Err(bad(name, v, "0 or 1")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn read(vars: &[(&str, &str)]) -> Result<Settings> {
        let m: HashMap<String, OsString> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), OsString::from(v)))
            .collect();
        Settings::from_lookup(|k| m.get(k).cloned())
    }

    fn err(vars: &[(&str, &str)]) -> String {
        format!("{:#}", read(vars).expect_err("a bad value"))
    }

    #[test]
    fn nothing_set_is_every_default() {
        let s = read(&[]).unwrap();
        assert_eq!(s.cpu, CpuOptions::default());
        assert_eq!(s.cuda, CudaOptions::default());
        assert!(s.quant_pack && !s.pass_trace);
        assert_eq!(s.pass_threads, None);
        assert_eq!(s.api_key, None);
    }

    #[test]
    fn empty_is_unset() {
        let names = [
            "YOMI_CPU_ISA",
            "YOMI_QUANT_ACT",
            "YOMI_QUANT_ROWS",
            "YOMI_QUANT_AMX",
            "YOMI_QUANT_PACK",
            "YOMI_PASS_THREADS",
            "YOMI_PASS_TRACE",
            "YOMI_CUDA_TOPK",
            "YOMI_CUDA_GRAPHS",
            "YOMI_CUDA_FUSE",
            "YOMI_CUDA_PDL",
            "YOMI_CUDA_ATTN_MMA",
            "YOMI_CUDA_CUBLAS",
            "YOMI_CUDA_GEMM_LO",
            "YOMI_CUDA_GEMM",
            "YOMI_CUDA_CHUNK",
            "YOMI_API_KEY",
            "HF_ENDPOINT",
            "HF_TOKEN",
        ];
        let vars: Vec<(&str, &str)> = names.iter().map(|n| (*n, " ")).collect();
        let s = read(&vars).unwrap();
        assert_eq!(s.cpu, CpuOptions::default());
        assert_eq!(s.cuda, CudaOptions::default());
        assert!(s.quant_pack && !s.pass_trace);
        assert_eq!(s.pass_threads, None);
        assert_eq!(s.api_key, None);
    }

    #[test]
    fn engine_switches() {
        let s = read(&[
            ("YOMI_QUANT_PACK", "off"),
            ("YOMI_PASS_THREADS", " 3 "),
            ("YOMI_PASS_TRACE", "1"),
        ])
        .unwrap();
        assert!(!s.quant_pack && s.pass_trace);
        assert_eq!(s.pass_threads, Some(3));
        let s = read(&[("YOMI_QUANT_PACK", "on"), ("YOMI_PASS_TRACE", "0")]).unwrap();
        assert!(s.quant_pack && !s.pass_trace);
    }

    #[test]
    fn cpu_switches() {
        let s = read(&[
            ("YOMI_CPU_ISA", " AVX2 "),
            ("YOMI_QUANT_ACT", "int8"),
            ("YOMI_QUANT_ROWS", "per-row"),
            ("YOMI_QUANT_AMX", "off"),
            ("YOMI_API_KEY", "k"),
        ])
        .unwrap();
        assert_eq!(
            s.cpu,
            CpuOptions {
                isa_cap: IsaLevel::Avx2,
                quant_act: Precision::Int8,
                quant_row_tiling: false,
                amx: false,
            }
        );
        assert_eq!(s.api_key.as_deref(), Some("k"));
        let s = read(&[("YOMI_QUANT_ROWS", "tiled"), ("YOMI_QUANT_AMX", "on")]).unwrap();
        assert_eq!(s.cpu, CpuOptions::default());
    }

    #[test]
    fn cuda_switches() {
        let off: Vec<(&str, &str)> = [
            "YOMI_CUDA_TOPK",
            "YOMI_CUDA_GRAPHS",
            "YOMI_CUDA_FUSE",
            "YOMI_CUDA_CUBLAS",
            "YOMI_CUDA_GEMM_LO",
            "YOMI_CUDA_GEMM",
            "YOMI_CUDA_CHUNK",
            "YOMI_CUDA_ATTN_MMA",
        ]
        .iter()
        .map(|n| (*n, "0"))
        .chain([("YOMI_CUDA_PDL", "1")])
        .collect();
        let s = read(&off).unwrap();
        assert_eq!(
            s.cuda,
            CudaOptions {
                graphs: false,
                topk: false,
                fuse: false,
                pdl: true,
                attn_mma_from: None,
                cublas: false,
                gemm: false,
                gemm_lo: false,
                chunk: false,
                kernel_cache_dir: None,
            }
        );
        let s = read(&[("YOMI_CUDA_ATTN_MMA", " 8 "), ("YOMI_CUDA_GEMM", "1")]).unwrap();
        assert_eq!(s.cuda.attn_mma_from, Some(8));
        assert!(s.cuda.gemm);
    }

    /// `$XDG_CACHE_HOME/yomi/kernels` when absolute, else `$HOME/.cache/yomi/kernels`.
    #[test]
    fn kernel_cache_dir() {
        let dir = |vars: &[(&str, &str)]| read(vars).unwrap().cuda.kernel_cache_dir;
        assert_eq!(
            dir(&[("XDG_CACHE_HOME", "/x/cache"), ("HOME", "/home/u")]),
            Some("/x/cache/yomi/kernels".into())
        );
        assert_eq!(
            dir(&[("XDG_CACHE_HOME", "rel"), ("HOME", "/home/u")]),
            Some("/home/u/.cache/yomi/kernels".into())
        );
        assert_eq!(dir(&[]), None);
    }

    /// The Hugging Face cache and hub (hub::cache_dir_from has the cases of the cache).
    #[test]
    fn hugging_face() {
        let s = read(&[("HF_HOME", "/h"), ("HOME", "/u")]).unwrap();
        assert_eq!(s.hf_cache, Some("/h/hub".into()));
        assert_eq!(s.hf_endpoint, "https://huggingface.co");
        assert_eq!(s.hf_token, None);
        let s = read(&[
            ("HF_HUB_CACHE", "/c"),
            ("HF_ENDPOINT", "http://127.0.0.1:9/"),
            ("HF_TOKEN", "t"),
        ])
        .unwrap();
        assert_eq!(s.hf_cache, Some("/c".into()));
        assert_eq!(s.hf_endpoint, "http://127.0.0.1:9");
        assert_eq!(s.hf_token.as_deref(), Some("t"));
        assert_eq!(read(&[]).unwrap().hf_cache, None);
    }

    #[test]
    fn bad_values_are_one_line_errors() {
        for (name, value, want) in [
            (
                "YOMI_CPU_ISA",
                "sse4",
                "YOMI_CPU_ISA=\"sse4\": expected portable, avx2, avx-vnni or avx512",
            ),
            (
                "YOMI_QUANT_ACT",
                "int4",
                "YOMI_QUANT_ACT=\"int4\": expected int8x2 or int8",
            ),
            (
                "YOMI_QUANT_ROWS",
                "rows",
                "YOMI_QUANT_ROWS=\"rows\": expected tiled or per-row",
            ),
            (
                "YOMI_QUANT_AMX",
                "0",
                "YOMI_QUANT_AMX=\"0\": expected on or off",
            ),
            (
                "YOMI_QUANT_PACK",
                "no",
                "YOMI_QUANT_PACK=\"no\": expected on or off",
            ),
            (
                "YOMI_PASS_THREADS",
                "0",
                "YOMI_PASS_THREADS=\"0\": expected a count ≥ 1",
            ),
            (
                "YOMI_PASS_THREADS",
                "all",
                "YOMI_PASS_THREADS=\"all\": expected a count ≥ 1",
            ),
            (
                "YOMI_CUDA_GRAPHS",
                "off",
                "YOMI_CUDA_GRAPHS=\"off\": expected 0 or 1",
            ),
            (
                "YOMI_CUDA_ATTN_MMA",
                "yes",
                "YOMI_CUDA_ATTN_MMA=\"yes\": expected a row count (0: off)",
            ),
            (
                "YOMI_PASS_TRACE",
                "yes",
                "YOMI_PASS_TRACE=\"yes\": expected 0 or 1",
            ),
            (
                "HF_ENDPOINT",
                "hf.co",
                "HF_ENDPOINT=\"hf.co\": expected an http:// or https:// URL",
            ),
        ] {
            assert_eq!(err(&[(name, value)]), want);
        }
    }
}
