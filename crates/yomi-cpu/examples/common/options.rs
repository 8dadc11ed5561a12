//! The CPU switches of the `yomi` binary for this crate's example programs and benches:
//! `YOMI_CPU_ISA`, `YOMI_QUANT_ACT`, `YOMI_QUANT_ROWS` and `YOMI_QUANT_AMX`, read here as the
//! binary reads them (their meaning: `crates/yomi-cli/src/settings.rs`) and installed with
//! `yomi_cpu::configure` before the first kernel runs. The library reads no environment.

use yomi_cpu::CpuOptions;
use yomi_cpu::isa_cap::IsaLevel;
use yomi_cpu::quant::Precision;

/// Reads the switches and configures the CPU kernels; panics on a value the binary refuses.
pub fn configure_from_env() {
    let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
    let bad = |name: &str, v: &str, want: &str| -> ! { panic!("{name}={v:?}: expected {want}") };
    let mut o = CpuOptions::default();
    if let Some(v) = var("YOMI_CPU_ISA") {
        o.isa_cap = IsaLevel::from_name(&v)
            .unwrap_or_else(|| bad("YOMI_CPU_ISA", &v, "portable, avx2, avx-vnni or avx512"));
    }
    if let Some(v) = var("YOMI_QUANT_ACT") {
        o.quant_act = Precision::from_name(v.trim())
            .unwrap_or_else(|| bad("YOMI_QUANT_ACT", &v, "int8 or int8x2"));
    }
    if let Some(v) = var("YOMI_QUANT_ROWS") {
        o.quant_row_tiling = match v.trim() {
            "tiled" => true,
            "per-row" => false,
            _ => bad("YOMI_QUANT_ROWS", &v, "tiled or per-row"),
        };
    }
    if let Some(v) = var("YOMI_QUANT_AMX") {
        o.amx = match v.trim() {
            "on" => true,
            "off" => false,
            _ => bad("YOMI_QUANT_AMX", &v, "on or off"),
        };
    }
    yomi_cpu::configure(o).expect("configure the CPU kernels");
}
