//! Layer-major prefill: a chain of more than [`MAX_ROWS`] rows whose logits are wanted for its
//! last row or none (a prefill chunk) runs as chunk passes of up to [`CHUNK_ROWS`] rows instead
//! of one whole-model sub-pass per 32 rows. A chunk pass runs each layer over all its rows: the
//! norms, projections, MLP and residual adds take every row at once (so `CudaDevice::linear`
//! reads each weight once per chunk, through the tensor-core GEMM for bf16 weights), and only
//! the mixers' cores go piece by piece, 32 rows at a time, in order: the same kernels, inputs
//! and state hand-over as consecutive sub-passes (K/V rows of earlier pieces in the cache, the
//! GDN final state `fin` and last conv window carried on). A chain longer than one chunk runs
//! as consecutive chunk passes, each continuing from the previous one the same way; the pass
//! is left pending exactly as after sub-passes (commit takes `fin` and the last piece's window).
//!
//! [`crate::CudaOptions::chunk`] false (`YOMI_CUDA_CHUNK=0`) keeps the sub-passes, the reference.

use anyhow::{Result, bail};
use cudarc::driver::CudaSlice;
use yomi_models::{HiddenTaps, LogitRows, ModelConfig};

use super::CudaModel;
use super::forward::{PassInputs, Piece, TapSink};
use super::state::{CudaState, MAX_ROWS, RowBuffers, RowNeeds};
use super::weights::{DevMixer, DevWeights, GateUp, Proj};
use crate::device::CudaDevice;

/// The most rows one chunk pass takes, and the prefill pass the engine is asked for
/// (`Accelerator::prefill_rows`). Its buffers at Qwen3.5-9B shapes (hidden 4096, fused GDN
/// in-projection 12352 wide, intermediate 12288): h, x, y, proj, mlp_g, o, gdn_o ≈ 360 MB, plus
/// the GEMM's scratch on the device (bf16 planes of x ≈ 100 MB, the unpacked gate|up ≈ 200 MB).
/// The cuBLAS GEMM runs at 246 TFLOP/s with 512 rows and 333 with 2048 (H200, hi + lo planes).
pub const CHUNK_ROWS: usize = 2048;
const _: () = assert!(CHUNK_ROWS.is_multiple_of(MAX_ROWS));

/// A chunk pass's own buffers, allocated at a state's first chunk pass (never inside a graph
/// capture: graphs only replay passes of at most MAX_ROWS rows).
pub(super) struct ChunkBuffers {
    /// Token ids and positions, [CHUNK_ROWS].
    pub ids: CudaSlice<i32>,
    pub pos: CudaSlice<i32>,
    /// Cache rows before each piece, [CHUNK_ROWS / MAX_ROWS].
    pub committed: CudaSlice<i32>,
    /// Ancestor bits of a chain of MAX_ROWS rows (row i: rows 0..=i), set once.
    pub anc: CudaSlice<u64>,
    pub act: RowBuffers,
}

impl ChunkBuffers {
    fn new(dev: &CudaDevice, cfg: &ModelConfig, w: &DevWeights) -> Result<Self> {
        let bits: Vec<u64> = (0..MAX_ROWS).map(|i| u64::MAX >> (63 - i)).collect();
        Ok(ChunkBuffers {
            ids: dev.alloc_zeros::<i32>(CHUNK_ROWS)?,
            pos: dev.alloc_zeros::<i32>(CHUNK_ROWS)?,
            committed: dev.alloc_zeros::<i32>(CHUNK_ROWS / MAX_ROWS)?,
            anc: dev.upload(&bits)?,
            act: RowBuffers::new(dev, cfg, CHUNK_ROWS, row_needs(w))?,
        })
    }
}

/// The row buffers the weights' storage needs: the widest fused projection, and the split
/// projections' buffers only where some layer has split ones.
fn row_needs(w: &DevWeights) -> RowNeeds {
    let mut need = RowNeeds {
        proj_width: 0,
        attn_split: false,
        gdn_split: false,
        mlp_split: false,
    };
    let fused = |p: &Proj, width: &mut usize, split: &mut bool| match p {
        Proj::Fused { w, .. } => *width = (*width).max(w.rows),
        Proj::Split(_) => *split = true,
    };
    for l in &w.layers {
        match &l.mixer {
            DevMixer::Attention(a) => fused(&a.qkv, &mut need.proj_width, &mut need.attn_split),
            DevMixer::Gdn(g) => fused(&g.in_proj, &mut need.proj_width, &mut need.gdn_split),
        }
        if let GateUp::Proj(p) = &l.gate_up {
            fused(p, &mut need.proj_width, &mut need.mlp_split);
        }
    }
    need
}

/// The pieces of a chunk pass of `n` rows that starts `off` rows into its chain: MAX_ROWS rows
/// each (the last one the rest), piece j in committed-length slot j.
fn chunk_pieces(off: usize, n: usize) -> impl Iterator<Item = Piece> {
    (0..n).step_by(MAX_ROWS).map(move |row| Piece {
        row,
        off: off + row,
        n: (n - row).min(MAX_ROWS),
        slot: row / MAX_ROWS,
    })
}

impl CudaModel {
    /// A chain of `tokens` after `committed` rows as chunk passes of at most `chunk_rows` rows
    /// (a multiple of MAX_ROWS, at most CHUNK_ROWS), the logits of `which` (Last or None) into
    /// `logits` (already sized by the caller; None: not copied back). Leaves the chain pending
    /// as consecutive sub-passes would.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn run_chunked(
        &self,
        st: &mut CudaState,
        committed: usize,
        tokens: &[u32],
        which: LogitRows,
        mut logits: Option<&mut Vec<f32>>,
        chunk_rows: usize,
        mut taps: Option<&mut HiddenTaps>,
    ) -> Result<()> {
        let t = tokens.len();
        if chunk_rows == 0 || chunk_rows > CHUNK_ROWS || !chunk_rows.is_multiple_of(MAX_ROWS) {
            bail!(
                "a chunk pass takes a positive multiple of {MAX_ROWS} rows up to {CHUNK_ROWS}, \
                 not {chunk_rows}"
            );
        }
        if which == LogitRows::All {
            bail!("chunk passes give logits of the last row or none, not of every row");
        }
        if st.chunk.is_none() {
            st.chunk = Some(ChunkBuffers::new(&self.dev, &self.cfg, &self.w)?);
        }
        let mut off = 0;
        while off < t {
            let n = (t - off).min(chunk_rows);
            let mut sink = taps.as_deref_mut().map(|tp| TapSink {
                taps: tp,
                row0: off,
            });
            self.chunk_pass(
                st,
                committed,
                off,
                &tokens[off..off + n],
                t,
                which,
                sink.as_mut(),
            )?;
            let sub = super::forward::Sub {
                committed,
                off,
                n,
                chain: true,
            };
            self.download_logits(st, sub, t, which, logits.as_deref_mut())?;
            // As after each sub-pass: the rows of the last piece (its windows are in pwin).
            st.pend_rows = (n - 1) % MAX_ROWS + 1;
            off += n;
        }
        st.pend_multi = t > MAX_ROWS;
        Ok(())
    }

    /// One chunk pass: `tokens` (at most CHUNK_ROWS) are rows off.. of a chain of `total` rows
    /// after `committed`; every layer over all of them, the mixers' cores per piece, and the
    /// LM head on the chain's last row when `which` is Last and it is in this chunk (into
    /// logits row 0, where `download_logits` and the top-k ranking read it). `taps` as in
    /// [`CudaModel::run_layers`].
    #[allow(clippy::too_many_arguments)]
    fn chunk_pass(
        &self,
        st: &mut CudaState,
        committed: usize,
        off: usize,
        tokens: &[u32],
        total: usize,
        which: LogitRows,
        taps: Option<&mut TapSink<'_>>,
    ) -> Result<()> {
        let n = tokens.len();
        if n == 0 || n > CHUNK_ROWS {
            bail!("a chunk pass takes 1..={CHUNK_ROWS} rows, not {n}");
        }
        let dev = &*self.dev;
        let CudaState {
            layers,
            buf,
            chunk,
            capacity,
            ..
        } = st;
        let ch = chunk
            .as_mut()
            .ok_or_else(|| anyhow::anyhow!("chunk buffers missing"))?;
        let pieces: Vec<Piece> = chunk_pieces(off, n).collect();
        let host = &mut buf.host_i32;
        host.clear();
        host.extend(tokens.iter().map(|&x| x as i32));
        dev.upload_into(host, &mut ch.ids.slice_mut(0..n))?;
        host.clear();
        host.extend((0..n).map(|i| (committed + off + i) as i32));
        dev.upload_into(host, &mut ch.pos.slice_mut(0..n))?;
        host.clear();
        host.extend(pieces.iter().map(|p| (committed + p.off) as i32));
        dev.upload_into(host, &mut ch.committed.slice_mut(0..pieces.len()))?;
        let inp = PassInputs {
            rows: n,
            pieces: &pieces,
            ids: &ch.ids,
            pos: &ch.pos,
            committed: &ch.committed,
            // A chain's pieces all read the parents [−1, 0, 1, …] and bits of a chain prefix.
            parents: &buf.chain_parents,
            anc: &ch.anc,
            chain: true,
        };
        self.run_layers(layers, *capacity, &mut ch.act, &mut buf.piece, &inp, taps)?;
        if which == LogitRows::Last && off + n == total {
            let h_sz = self.cfg.hidden_size;
            self.head(
                &ch.act.h.slice((n - 1) * h_sz..n * h_sz),
                1,
                &mut buf.rows,
                &mut buf.logits,
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_cover_a_chunk_in_order() {
        for (off, n) in [(0, 1), (0, 32), (0, 33), (64, 100), (512, 512), (96, 7)] {
            let p: Vec<Piece> = chunk_pieces(off, n).collect();
            assert_eq!(p.len(), n.div_ceil(MAX_ROWS));
            let mut row = 0;
            for (j, q) in p.iter().enumerate() {
                assert_eq!((q.row, q.off, q.slot), (row, off + row, j));
                assert!(q.n >= 1 && q.n <= MAX_ROWS);
                // Only the last piece may be short (a later piece's GDN window carry reads
                // the previous piece's row MAX_ROWS − 1).
                assert!(q.n == MAX_ROWS || j + 1 == p.len());
                row += q.n;
            }
            assert_eq!(row, n);
        }
    }
}
