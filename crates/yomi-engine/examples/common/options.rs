//! The CPU and engine switches of the `yomi` binary for this crate's example programs:
//! `YOMI_CPU_ISA`, `YOMI_QUANT_ACT`, `YOMI_QUANT_ROWS`, `YOMI_QUANT_AMX` (installed with
//! `yomi_cpu::configure`), `YOMI_QUANT_PACK`, `YOMI_PASS_THREADS` and `YOMI_PASS_TRACE` (into
//! the [`EngineOptions`]), read here as the binary reads them (their meaning:
//! `crates/yomi-cli/src/settings.rs`). The libraries read no environment.

use yomi_engine::EngineOptions;

#[path = "../../../yomi-cpu/examples/common/options.rs"]
mod cpu;

/// Configures the CPU kernels and returns the engine options the switches give (the rest
/// default); panics on a value the binary refuses.
pub fn engine_options_from_env() -> EngineOptions {
    cpu::configure_from_env();
    let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
    let mut o = EngineOptions::default();
    if let Some(v) = var("YOMI_QUANT_PACK") {
        o.quant_pack = match v.trim() {
            "on" => true,
            "off" => false,
            _ => panic!("YOMI_QUANT_PACK={v:?}: expected on or off"),
        };
    }
    if let Some(v) = var("YOMI_PASS_THREADS") {
        let n = v.trim().parse::<usize>().ok().filter(|&n| n > 0);
        o.pass_threads =
            Some(n.unwrap_or_else(|| panic!("YOMI_PASS_THREADS={v:?}: expected a count ≥ 1")));
    }
    if let Some(v) = var("YOMI_PASS_TRACE") {
        o.pass_trace = match v.trim() {
            "1" => true,
            "0" => false,
            _ => panic!("YOMI_PASS_TRACE={v:?}: expected 0 or 1"),
        };
    }
    o
}
