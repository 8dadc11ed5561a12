//! Causal depthwise conv1d with state and tree parents (the Gated DeltaNet short convolution) on
//! the device; math and shapes in `kernels/conv.cu`'s header.

use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut, LaunchConfig};

use crate::device::CudaDevice;
use crate::error::{Result, ensure};
use crate::guard;
use crate::kernels::Module;
use crate::ops::{as_i32, dptr, dptr_mut, launch_err};

/// Widest conv kernel (`CONV_MAXK`); every released model uses K = 4.
pub const CONV_MAX_K: usize = 8;

/// Buffer lengths of one conv call.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ConvLens {
    pub m: usize,
    pub state: usize,
    pub w: usize,
    pub parents: usize,
    pub out: usize,
    pub windows: usize,
}

/// Every host-side check of [`CudaDevice::conv1d_tree`].
pub(crate) fn check_conv(
    lens: ConvLens,
    t: usize,
    c: usize,
    k: usize,
    m_stride: usize,
) -> Result<()> {
    ensure!(
        (1..=CONV_MAX_K).contains(&k),
        "conv1d: K = {k}; the kernel takes 1..={CONV_MAX_K}"
    );
    ensure!(c > 0, "conv1d: C must be positive");
    // The grid's y is the row (at most 65535).
    ensure!(
        (1..=65535).contains(&t),
        "conv1d: T = {t} rows; the kernel takes 1..=65535"
    );
    as_i32(t * k.max(2) * c, "conv values")?;
    ensure!(
        m_stride >= c && t > 0 && lens.m == (t - 1) * m_stride + c,
        "conv1d: m has {} values, not T={t} rows of C={c} at stride {m_stride}",
        lens.m
    );
    ensure!(
        lens.state == (k - 1) * c,
        "conv1d: state has {} values, not [K-1={}, C={c}]",
        lens.state,
        k - 1
    );
    ensure!(
        lens.w == c * k,
        "conv1d: w has {} values, not [C={c}, K={k}]",
        lens.w
    );
    ensure!(
        lens.parents == t,
        "conv1d: {} parents for {t} rows",
        lens.parents
    );
    ensure!(
        lens.out == t * c,
        "conv1d: out has {} values, not [T={t}, C={c}]",
        lens.out
    );
    ensure!(
        lens.windows == t * (k - 1) * c,
        "conv1d: windows has {} values, not [T={t}, K-1={}, C={c}]",
        lens.windows,
        k - 1
    );
    Ok(())
}

impl CudaDevice {
    /// Tree conv1d (twin of `yomi_cpu::conv::conv1d_tree`): m [T, C] this pass's inputs, state
    /// [K−1, C] the committed last inputs (read only), w [C, K], parents `[T]` (−1 for the root,
    /// parent < row). Writes out [T, C] = silu(conv over each row's root path continued into the
    /// state) and windows [T, K−1, C], each row's own last K−1 inputs, oldest first (commit copies
    /// the last accepted row's window into the state). 1 ≤ K ≤ 8.
    #[allow(clippy::too_many_arguments)]
    pub fn conv1d_tree(
        &self,
        m: &impl DevicePtr<f32>,
        c: usize,
        k: usize,
        state: &impl DevicePtr<f32>,
        w: &CudaSlice<f32>,
        parents: &impl DevicePtr<i32>,
        t: usize,
        out: &mut impl DevicePtrMut<f32>,
        windows: &mut impl DevicePtrMut<f32>,
    ) -> Result<()> {
        self.conv1d_tree_strided(m, c, c, k, state, w, parents, t, out, windows)
    }

    /// [`CudaDevice::conv1d_tree`] with m's rows `m_stride` values apart (m holds
    /// (T − 1)·m_stride + C values), so a fused projection's output is read in place.
    #[allow(clippy::too_many_arguments)]
    pub fn conv1d_tree_strided(
        &self,
        m: &impl DevicePtr<f32>,
        c: usize,
        m_stride: usize,
        k: usize,
        state: &impl DevicePtr<f32>,
        w: &CudaSlice<f32>,
        parents: &impl DevicePtr<i32>,
        t: usize,
        out: &mut impl DevicePtrMut<f32>,
        windows: &mut impl DevicePtrMut<f32>,
    ) -> Result<()> {
        let lens = ConvLens {
            m: m.len(),
            state: state.len(),
            w: w.len(),
            parents: parents.len(),
            out: out.len(),
            windows: windows.len(),
        };
        check_conv(lens, t, c, k, m_stride)?;
        let f = self.func(Module::Conv, "conv1d_tree_f32")?;
        let (c_i, k_i, ms) = (as_i32(c, "C")?, k as i32, m_stride as i64);
        let cfg = LaunchConfig {
            grid_dim: (c.div_ceil(256) as u32, t as u32, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        guard("conv1d_tree", || {
            let st = self.stream();
            let (mp, sp, pp) = (dptr(m, st), dptr(state, st), dptr(parents, st));
            let (op, wp) = (dptr_mut(out, st), dptr_mut(windows, st));
            let mut b = self.launch(&f);
            b.arg(&mp)
                .arg(&sp)
                .arg(w)
                .arg(&pp)
                .arg(&op)
                .arg(&wp)
                .arg(&c_i)
                .arg(&k_i)
                .arg(&ms);
            // SAFETY: argument types match `conv1d_tree_f32`; lengths checked above.
            unsafe { b.launch(cfg) }.map_err(launch_err("conv1d_tree_f32"))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::CudaError;

    fn lens(t: usize, c: usize, k: usize) -> ConvLens {
        ConvLens {
            m: t * c,
            state: (k - 1) * c,
            w: c * k,
            parents: t,
            out: t * c,
            windows: t * (k - 1) * c,
        }
    }

    #[test]
    fn good_arguments_pass_and_bad_ones_are_clear_errors() {
        check_conv(lens(32, 8192, 4), 32, 8192, 4, 8192).unwrap();
        check_conv(lens(1, 64, 1), 1, 64, 1, 64).unwrap();
        check_conv(lens(7, 64, 8), 7, 64, 8, 64).unwrap();
        // Rows of m read in place from a wider buffer: (T − 1)·stride + C values.
        let strided = ConvLens {
            m: 6 * 100 + 64,
            ..lens(7, 64, 4)
        };
        check_conv(strided, 7, 64, 4, 100).unwrap();
        assert!(check_conv(strided, 7, 64, 4, 64).is_err());
        let ok = lens(7, 64, 4);
        let err = |l: ConvLens, t: usize, c: usize, k: usize| {
            let e = check_conv(l, t, c, k, c).unwrap_err();
            assert!(matches!(e, CudaError::Invalid(_)), "{e:?}");
            e.to_string()
        };
        assert!(err(ConvLens { m: 1, ..ok }, 7, 64, 4).contains("m has 1 values"));
        assert!(err(ConvLens { state: 256, ..ok }, 7, 64, 4).contains("state has 256"));
        assert!(err(ConvLens { w: 255, ..ok }, 7, 64, 4).contains("w has 255"));
        assert!(err(ConvLens { parents: 6, ..ok }, 7, 64, 4).contains("6 parents for 7 rows"));
        assert!(err(ConvLens { out: 0, ..ok }, 7, 64, 4).contains("out has 0"));
        assert!(err(ConvLens { windows: 7, ..ok }, 7, 64, 4).contains("windows has 7"));
        assert!(err(lens(7, 64, 4), 7, 64, 9).contains("K = 9"));
        assert!(err(lens(7, 64, 4), 7, 64, 0).contains("K = 0"));
        assert!(err(lens(0, 64, 4), 0, 64, 4).contains("T = 0"));
        assert!(err(lens(1, 0, 4), 1, 0, 4).contains("C must be positive"));
    }
}
