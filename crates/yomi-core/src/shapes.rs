//! Shapes shared by every backend's kernels.

/// Gated DeltaNet sizes of one layer: Hk key/query heads of dk, Hv value heads of dv (value
/// head h reads key head h / (Hv/Hk)); the recurrent state is [Hv, dk, dv] f32.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GdnShape {
    pub hk: usize,
    pub hv: usize,
    pub dk: usize,
    pub dv: usize,
}

impl GdnShape {
    /// Floats in one layer's recurrent state.
    pub fn state_len(&self) -> usize {
        self.hv * self.dk * self.dv
    }
}
