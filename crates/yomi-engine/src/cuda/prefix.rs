//! Copies of a device state's committed prefix for the engine's prefix cache, in the host
//! state's layouts (`yomi_models::state`): attention K/V rows per layer and KV head
//! [rows, head_dim] f32, and per Gated DeltaNet layer S [Hv, dk, dv] then the conv window
//! [K−1, conv_dim]. The device keeps both in the same element type and order (K/V rows
//! [capacity, n_kv, hd]), so a copy is a transfer plus a (de)interleave of the heads on the
//! host, and an entry cached from either backend reads the same.

use std::ops::Range;

use anyhow::{Result, bail, ensure};

use super::CudaModel;
use yomi_models::state::LayerState;

use super::state::CudaState;

impl CudaModel {
    /// Appends the committed S and conv window of every GDN layer to `out`.
    pub(super) fn read_recurrent_to(&self, st: &CudaState, out: &mut Vec<f32>) -> Result<()> {
        for l in &st.layers {
            if let LayerState::Gdn(g) = l {
                for buf in [&g.s, &g.conv] {
                    let at = out.len();
                    out.resize(at + buf.len(), 0.0);
                    self.dev.download_into(buf, &mut out[at..])?;
                }
            }
        }
        Ok(())
    }

    /// Appends committed attention rows `rows` to `k[a][h]` / `v[a][h]`.
    pub(super) fn read_kv_rows_to(
        &self,
        st: &CudaState,
        rows: Range<usize>,
        k: &mut [Vec<Vec<f32>>],
        v: &mut [Vec<Vec<f32>>],
    ) -> Result<()> {
        let (n_kv, hd) = (self.cfg.num_kv_heads, self.cfg.head_dim);
        let w = n_kv * hd;
        ensure!(
            rows.end <= st.capacity,
            "rows up to {} of a state of {}",
            rows.end,
            st.capacity
        );
        let mut host = vec![0.0f32; rows.len() * w];
        let mut a = 0;
        for l in &st.layers {
            let LayerState::Attention(kv) = l else {
                continue;
            };
            let (Some(dk), Some(dv)) = (&kv.k, &kv.v) else {
                bail!("a K/V cache that was never allocated");
            };
            ensure!(
                a < k.len() && a < v.len(),
                "K/V rows for {} attention layers",
                k.len()
            );
            for (src, dst) in [(dk, &mut k[a]), (dv, &mut v[a])] {
                ensure!(dst.len() == n_kv, "{} KV heads, not {n_kv}", dst.len());
                self.dev
                    .download_into(&src.slice(rows.start * w..rows.end * w), &mut host)?;
                for (h, d) in dst.iter_mut().enumerate() {
                    d.reserve_exact(rows.len() * hd);
                    for r in host.chunks_exact(w) {
                        d.extend_from_slice(&r[h * hd..(h + 1) * hd]);
                    }
                }
            }
            a += 1;
        }
        Ok(())
    }

    /// Writes attention rows `rows` from `k[a][h]` / `v[a][h]` (row r at r·hd) and, when given,
    /// every GDN layer's S and conv window; nothing is pending afterwards.
    pub(super) fn write_prefix_from(
        &self,
        st: &mut CudaState,
        rows: Range<usize>,
        k: &[Vec<&[f32]>],
        v: &[Vec<&[f32]>],
        recurrent: Option<&[f32]>,
    ) -> Result<()> {
        let (n_kv, hd) = (self.cfg.num_kv_heads, self.cfg.head_dim);
        let w = n_kv * hd;
        ensure!(
            rows.end <= st.capacity,
            "rows up to {} of a state of {}",
            rows.end,
            st.capacity
        );
        let mut host = vec![0.0f32; rows.len() * w];
        let (mut a, mut off) = (0, 0);
        for l in &mut st.layers {
            match l {
                LayerState::Attention(kv) => {
                    if rows.is_empty() {
                        continue;
                    }
                    let (Some(dk), Some(dv)) = (&mut kv.k, &mut kv.v) else {
                        bail!("a K/V cache that was never allocated");
                    };
                    ensure!(
                        a < k.len() && a < v.len(),
                        "K/V rows for {} attention layers",
                        k.len()
                    );
                    for (src, dst) in [(&k[a], dk), (&v[a], dv)] {
                        ensure!(src.len() == n_kv, "{} KV heads, not {n_kv}", src.len());
                        for (h, s) in src.iter().enumerate() {
                            ensure!(
                                s.len() >= rows.end * hd,
                                "a head of {} values for {} rows",
                                s.len(),
                                rows.end
                            );
                            for (i, r) in rows.clone().enumerate() {
                                host[i * w + h * hd..i * w + (h + 1) * hd]
                                    .copy_from_slice(&s[r * hd..(r + 1) * hd]);
                            }
                        }
                        self.dev
                            .upload_into(&host, &mut dst.slice_mut(rows.start * w..rows.end * w))?;
                    }
                    a += 1;
                }
                LayerState::Gdn(g) => {
                    let Some(r) = recurrent else {
                        bail!("a model with recurrent layers resumes only from a snapshot");
                    };
                    g.pend_rows = 0;
                    g.pend_multi = false;
                    for dst in [&mut g.s, &mut g.conv] {
                        let n = dst.len();
                        ensure!(
                            off + n <= r.len(),
                            "a recurrent snapshot of {} values",
                            r.len()
                        );
                        self.dev.upload_into(&r[off..off + n], dst)?;
                        off += n;
                    }
                }
            }
        }
        if let Some(r) = recurrent {
            ensure!(
                off == r.len(),
                "a recurrent snapshot of {} values for {off}",
                r.len()
            );
        }
        st.logit_rows = 0;
        Ok(())
    }
}
