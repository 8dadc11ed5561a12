//! A ceiling on the instruction sets the CPU kernels dispatch to: [`CpuOptions::isa_cap`]
//! (`portable`, `avx2`, `avx-vnni` or `avx512`; the `yomi` binary's `YOMI_CPU_ISA`) keeps every
//! runtime dispatch of this crate at or below that level, whatever the CPU has. Default: no
//! ceiling. (A process-wide option set once by [`crate::configure`] rather than an argument: the
//! kernels are chosen once per process and cached, so a ceiling set later would apply to some
//! dispatches and not others.)
//!
//! Why: an AVX-512 machine can then run the AVX2 kernels that AVX2-only CPUs (Zen 3, older
//! Intel) run, to measure them or to reproduce a report from such a machine; and a platform
//! with a broken or slow wide path can be kept off it. The AVX2, AVX-VNNI and AVX-512 kernels
//! compute the same bits (each is tested against its portable twin), so a ceiling changes the
//! speed, not the output; the portable level may differ in f32 rounding where the SIMD paths use
//! fused multiply-adds.
//!
//! The ceiling only narrows the choice: a level the CPU lacks stays unused. Tests that compare
//! every supported kernel with its twin ask the CPU directly and ignore the ceiling.
//!
//! [`CpuOptions::isa_cap`]: crate::CpuOptions::isa_cap

/// Instruction-set levels, in the order each includes the ones before it (for dispatch).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum IsaLevel {
    /// Plain Rust (what LLVM vectorises for the baseline x86-64 target).
    Portable,
    /// AVX2 + FMA + F16C.
    Avx2,
    /// AVX-VNNI: the VEX-encoded `vpdpbusd` on 256-bit registers.
    AvxVnni,
    /// AVX-512 (F, BW, VL, DQ, VNNI; and AMX where the quantized kernels find it).
    Avx512,
}

impl IsaLevel {
    pub const ALL: [IsaLevel; 4] = [
        IsaLevel::Portable,
        IsaLevel::Avx2,
        IsaLevel::AvxVnni,
        IsaLevel::Avx512,
    ];

    /// The level's name (what `YOMI_CPU_ISA` takes).
    pub const fn name(self) -> &'static str {
        match self {
            IsaLevel::Portable => "portable",
            IsaLevel::Avx2 => "avx2",
            IsaLevel::AvxVnni => "avx-vnni",
            IsaLevel::Avx512 => "avx512",
        }
    }

    /// Parses [`IsaLevel::name`] (case-insensitive, surrounding spaces ignored).
    pub fn from_name(s: &str) -> Option<IsaLevel> {
        let s = s.trim().to_ascii_lowercase();
        IsaLevel::ALL.into_iter().find(|l| l.name() == s)
    }
}

impl std::fmt::Display for IsaLevel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The ceiling: [`crate::CpuOptions::isa_cap`] of the options in force ([`IsaLevel::Avx512`],
/// no ceiling, unless configured).
pub fn cap() -> IsaLevel {
    crate::options().isa_cap
}

/// Whether dispatch may use `level` (the CPU must still support it).
pub fn allows(level: IsaLevel) -> bool {
    level <= cap()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_order() {
        for l in IsaLevel::ALL {
            assert_eq!(IsaLevel::from_name(l.name()), Some(l));
            assert_eq!(
                IsaLevel::from_name(&format!(" {} ", l.name().to_uppercase())),
                Some(l)
            );
        }
        assert_eq!(IsaLevel::from_name("sse4"), None);
        assert!(IsaLevel::Portable < IsaLevel::Avx2);
        assert!(IsaLevel::Avx2 < IsaLevel::AvxVnni);
        assert!(IsaLevel::AvxVnni < IsaLevel::Avx512);
    }
}
