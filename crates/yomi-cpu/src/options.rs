//! The process-wide settings of the CPU kernels: [`CpuOptions`], installed once by
//! [`configure`] before the first kernel dispatch, read by every dispatch through [`options`].
//!
//! Why a process-wide value rather than an argument: the kernels (and the instruction set they
//! run) are chosen once per process and cached, so a setting that changed later would apply to
//! some dispatches and not others. A program that never calls [`configure`] (tests, examples,
//! other embedders) gets [`CpuOptions::default`], the everyday behaviour. This crate reads no
//! environment: the `yomi` binary fills these from its `YOMI_*` variables (see its
//! `settings.rs`).

use std::sync::OnceLock;

use crate::isa_cap::IsaLevel;
use crate::quant::Precision;

/// How the CPU kernels dispatch. `Default` is what the `yomi` binary does with no `YOMI_*`
/// variable set.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CpuOptions {
    /// Ceiling on the instruction sets every runtime dispatch of this crate may use (see
    /// [`crate::isa_cap`]; a level the CPU lacks stays unused). Default [`IsaLevel::Avx512`]:
    /// no ceiling. (`YOMI_CPU_ISA`.)
    pub isa_cap: IsaLevel,
    /// How activations are quantized for the integer dot products of [`crate::quant::Kernel::best`]
    /// and [`crate::quant::Kernel::new`] (unless [`crate::quant::set_precision`] overrides it).
    /// Default [`Precision::Int8x2`]. (`YOMI_QUANT_ACT`.)
    pub quant_act: Precision,
    /// Whether the quantized kernels tile T > 1 activation rows (each unpacked weight block
    /// shared by a tile of rows) or dot each row on its own (same bits; kept to measure the
    /// tiling against). Default true. (`YOMI_QUANT_ROWS`.)
    pub quant_row_tiling: bool,
    /// Whether the packed kernels run 5 or more activation rows on the Intel AMX tiles where the
    /// CPU and the OS allow it (same bits). Default true. (`YOMI_QUANT_AMX`.)
    pub amx: bool,
}

impl Default for CpuOptions {
    fn default() -> Self {
        CpuOptions {
            isa_cap: IsaLevel::Avx512,
            quant_act: Precision::Int8x2,
            quant_row_tiling: true,
            amx: true,
        }
    }
}

static OPTIONS: OnceLock<CpuOptions> = OnceLock::new();

/// [`configure`] came after the options were fixed (by an earlier [`configure`] with other
/// values, or by a kernel dispatch that read the defaults).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AlreadyConfigured {
    /// The options in force.
    pub current: CpuOptions,
}

impl std::fmt::Display for AlreadyConfigured {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the CPU kernel options were already fixed ({:?}); configure them before the first \
             kernel dispatch",
            self.current
        )
    }
}

impl std::error::Error for AlreadyConfigured {}

/// Installs the process-wide options. Call it once, before any kernel runs; an error (and no
/// change) when other options are already in force. Configuring the same values again is fine.
pub fn configure(opts: CpuOptions) -> Result<(), AlreadyConfigured> {
    match OPTIONS.set(opts) {
        Ok(()) => Ok(()),
        Err(_) => {
            let current = *options();
            if current == opts {
                Ok(())
            } else {
                Err(AlreadyConfigured { current })
            }
        }
    }
}

/// The options in force: those of [`configure`], else (fixing them) the defaults.
pub fn options() -> &'static CpuOptions {
    OPTIONS.get_or_init(CpuOptions::default)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Unconfigured, the defaults are in force (the tests of this crate never configure other
    /// values: the options are process-wide) and configuring other values then fails.
    #[test]
    fn defaults_are_fixed_once_read() {
        assert_eq!(configure(CpuOptions::default()), Ok(()));
        assert_eq!(*options(), CpuOptions::default());
        let other = CpuOptions {
            amx: false,
            ..CpuOptions::default()
        };
        assert_eq!(
            configure(other),
            Err(AlreadyConfigured {
                current: CpuOptions::default()
            })
        );
        assert_eq!(*options(), CpuOptions::default());
    }
}
