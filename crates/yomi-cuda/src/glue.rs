//! The small ops of a whole-model pass (kernels/glue.cu): embedding gather, residual add, the
//! attention output gate, Gated DeltaNet input preparation and gated norm. Shapes are checked on
//! the host; each op is one launch on the device's stream.

use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut, LaunchConfig};

use crate::attention::AttnDims;
use crate::conv::{ConvLens, check_conv};
use crate::device::CudaDevice;
use crate::error::{Result, ensure};
use crate::guard;
use crate::kernels::Module;
use crate::ops::{DeviceMatrix, WeightDtype, as_i32, dptr, dptr_mut, launch_err};

/// The decay and write-strength inputs of [`CudaDevice::gdn_split_qkv_gate`]: b_raw and a_raw
/// rows `stride` values apart, the per-head −exp(A) and dt bias [Hv], outputs g, β [T, Hv].
pub struct GdnGateArgs<'a> {
    pub braw: &'a dyn DevicePtr<f32>,
    pub araw: &'a dyn DevicePtr<f32>,
    pub stride: usize,
    pub neg_exp_a: &'a CudaSlice<f32>,
    pub dt_bias: &'a CudaSlice<f32>,
    pub g: &'a mut dyn DevicePtrMut<f32>,
    pub beta: &'a mut dyn DevicePtrMut<f32>,
}

/// The conv operands of [`CudaDevice::gdn_conv_split_qkv_gate`], as
/// [`CudaDevice::conv1d_tree_strided`] takes them: the T pre-conv rows `m`, `m_stride` values
/// apart ((T − 1)·m_stride + C values); the conv width `kernel` (K); the committed window
/// `state` [K−1, C] the rows continue; the weights `w` [C, K]; the tree's `parents` `[T]` (−1
/// for the root, parent < row); and `windows` [T, K−1, C], each row's own last K−1 inputs.
pub struct GdnConvArgs<'a> {
    pub m: &'a dyn DevicePtr<f32>,
    pub m_stride: usize,
    pub kernel: usize,
    pub state: &'a dyn DevicePtr<f32>,
    pub w: &'a CudaSlice<f32>,
    pub parents: &'a dyn DevicePtr<i32>,
    pub windows: &'a mut dyn DevicePtrMut<f32>,
}

/// Largest key head of `gdn_conv_split_qkv_f32` (its shared buffer, `GDN_CONV_MAX_DK`).
const GDN_CONV_MAX_DK: usize = 256;

/// Checks the g/β operands against T rows; their Hv (0 without them).
fn check_gate(gate: Option<&GdnGateArgs<'_>>, t: usize) -> Result<usize> {
    let Some(gb) = gate else {
        return Ok(0);
    };
    let hv = gb.neg_exp_a.len();
    let src_len = if t == 0 { 0 } else { (t - 1) * gb.stride + hv };
    ensure!(
        hv > 0
            && gb.stride >= hv
            && gb.dt_bias.len() == hv
            && gb.braw.len() == src_len
            && gb.araw.len() == src_len
            && gb.g.len() == t * hv
            && gb.beta.len() == t * hv,
        "gdn_split_qkv: g/β inputs do not fit T = {t}, Hv = {hv}, stride {}",
        gb.stride
    );
    Ok(hv)
}

/// The g/β kernel parameters in order: b_raw, a_raw, their row stride (a `long long`, passed as
/// its 8 bytes like the pointers), −exp(A), dt bias, g, β. All zero without them: the kernels
/// read a null b_raw as "no g/β block".
fn gate_ptrs(gate: Option<GdnGateArgs<'_>>, st: &cudarc::driver::CudaStream) -> [u64; 7] {
    match gate {
        Some(gb) => [
            dptr(gb.braw, st),
            dptr(gb.araw, st),
            gb.stride as u64,
            dptr(gb.neg_exp_a, st),
            dptr(gb.dt_bias, st),
            dptr_mut(gb.g, st),
            dptr_mut(gb.beta, st),
        ],
        None => [0; 7],
    }
}

/// Threads per row of `add_rms_norm_f32`: one per 16-byte chunk of the row (at most 1024, at
/// least a warp), so a hidden size up to 8192 is read in one round trip of two chunks per
/// thread at most; rows that are not whole chunks take 256 threads and the scalar loop.
fn add_norm_block(n: usize) -> u32 {
    if n.is_multiple_of(4) {
        (n / 4).div_ceil(32).clamp(1, 32) as u32 * 32
    } else {
        256
    }
}

/// The inputs of [`CudaDevice::attn_prep`]: q (with gates), k and v rows, each with its row
/// stride in values (a fused projection's views share its full width), the optional per-head
/// norm weights, positions [T], RoPE inverse frequencies and the committed length [1].
pub struct AttnPrepSources<'a> {
    pub q: (&'a dyn DevicePtr<f32>, usize),
    pub k: (&'a dyn DevicePtr<f32>, usize),
    pub v: (&'a dyn DevicePtr<f32>, usize),
    pub q_norm: Option<&'a CudaSlice<f32>>,
    pub k_norm: Option<&'a CudaSlice<f32>>,
    pub pos: &'a dyn DevicePtr<i32>,
    pub inv_freq: &'a CudaSlice<f32>,
    pub committed: &'a dyn DevicePtr<i32>,
}

fn grid_1d(n: u64) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (n.div_ceil(256) as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    }
}

impl CudaDevice {
    /// `out[i, :] = table[ids[i], :]` as f32 for the T = ids.len() rows (ids must be < rows;
    /// the caller checks them against the vocabulary before uploading).
    pub fn embed(
        &self,
        table: &DeviceMatrix,
        ids: &impl DevicePtr<i32>,
        out: &mut impl DevicePtrMut<f32>,
    ) -> Result<()> {
        let t = ids.len();
        ensure!(
            out.len() == t * table.cols,
            "embed: out has {} values, not [T={t}, H={}]",
            out.len(),
            table.cols
        );
        if t == 0 {
            return Ok(());
        }
        let name = match table.dtype {
            WeightDtype::F32 => "embed_f32",
            WeightDtype::Bf16 => "embed_bf16",
            WeightDtype::F16 => "embed_f16",
            WeightDtype::Quant(_) => return self.dequantize_rows(table, ids, out),
        };
        let f = self.func(Module::Glue, name)?;
        let h = as_i32(table.cols, "H")?;
        let cfg = LaunchConfig {
            grid_dim: (t as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        guard("embed", || {
            let st = self.stream();
            let tp = table
                .data_ptr(st)
                .ok_or_else(|| crate::error::CudaError::Invalid("embed: quantized table".into()))?;
            let (ip, op) = (dptr(ids, st), dptr_mut(out, st));
            let mut b = self.launch(&f);
            b.arg(&tp).arg(&ip).arg(&op).arg(&h);
            // SAFETY: argument types match the embed kernels; lengths checked above.
            unsafe { b.launch(cfg) }.map_err(launch_err(name))
        })
    }

    /// bf16 bits `raw` [rows, cols] row-major → a new buffer in the tile layout
    /// ([`crate::ops::bf16_tile_index`]), padding zeroed. Runs once per matrix at upload.
    pub(crate) fn pack_bf16_tiles(
        &self,
        raw: &CudaSlice<u16>,
        rows: usize,
        cols: usize,
    ) -> Result<CudaSlice<u16>> {
        ensure!(
            raw.len() == rows * cols,
            "pack_bf16_tiles: {} values, not {rows}×{cols}",
            raw.len()
        );
        let len = crate::ops::bf16_tiles_len(rows, cols);
        let mut dst = self.alloc_zeros::<u16>(len.max(1))?;
        if len == 0 {
            return Ok(dst);
        }
        let f = self.func(Module::Glue, "pack_bf16_tiles")?;
        let (n_i, k_i) = (as_i32(rows, "rows")?, as_i32(cols, "cols")?);
        guard("pack_bf16_tiles", || {
            let mut b = self.launch(&f);
            b.arg(raw).arg(&mut dst).arg(&n_i).arg(&k_i);
            // SAFETY: argument types match `pack_bf16_tiles`; dst holds the padded layout.
            unsafe { b.launch(grid_1d((len / 8) as u64)) }.map_err(launch_err("pack_bf16_tiles"))
        })?;
        Ok(dst)
    }

    /// The attention layer's inputs in one launch (`attn_prep_f32`): per row and head, q (RMS
    /// normed by `q_norm` when given, then RoPE) into `q`, the gate rows into `gate` (gated
    /// attention: the q source holds [q | gate] per head), and k (normed, RoPE) and v stored at
    /// cache rows committed + t. Sources are row-strided views, so a fused projection's output
    /// is read in place.
    #[allow(clippy::too_many_arguments)]
    pub fn attn_prep(
        &self,
        t: usize,
        dims: AttnDims,
        rot: usize,
        eps: f32,
        src: &AttnPrepSources<'_>,
        q: &mut (impl DevicePtrMut<f32> + ?Sized),
        gate: Option<&mut (dyn DevicePtrMut<f32> + '_)>,
        k_cache: &mut CudaSlice<f32>,
        v_cache: &mut CudaSlice<f32>,
    ) -> Result<()> {
        let AttnDims {
            n_heads: nh,
            n_kv: nkv,
            head_dim: hd,
        } = dims;
        let gated = gate.is_some();
        let qw = nh * hd * if gated { 2 } else { 1 };
        let kvw = nkv * hd;
        ensure!(
            t > 0 && nh > 0 && nkv > 0 && (1..=256).contains(&hd),
            "attn_prep: T = {t}, {nh}/{nkv} heads of {hd} (head_dim must be 1..=256)"
        );
        ensure!(
            rot.is_multiple_of(2) && rot <= hd && src.inv_freq.len() >= rot / 2,
            "attn_prep: rot = {rot} must be even, ≤ {hd}, with rot/2 inverse frequencies"
        );
        for (name, (v, stride), w) in [("q", src.q, qw), ("k", src.k, kvw), ("v", src.v, kvw)] {
            ensure!(
                stride >= w && v.len() >= (t - 1) * stride + w,
                "attn_prep: {name} source has {} values, not {t} rows of {w} at stride {stride}",
                v.len()
            );
        }
        ensure!(
            q.len() == t * nh * hd,
            "attn_prep: q has {} values, not [T={t}, {nh}, {hd}]",
            q.len()
        );
        if let Some(g) = &gate {
            ensure!(g.len() == t * nh * hd, "attn_prep: gate is not [T, H, hd]");
        }
        ensure!(
            k_cache.len() == v_cache.len() && k_cache.len().is_multiple_of(kvw),
            "attn_prep: caches of {} and {} values are not [capacity, {kvw}]",
            k_cache.len(),
            v_cache.len()
        );
        for (name, w) in [("q_norm", src.q_norm), ("k_norm", src.k_norm)] {
            if let Some(w) = w {
                ensure!(
                    w.len() == hd,
                    "attn_prep: {name} has {} values, not {hd}",
                    w.len()
                );
            }
        }
        ensure!(
            src.pos.len() >= t && src.committed.len() >= 1,
            "attn_prep: positions or committed length missing"
        );
        let f = self.func(Module::Glue, "attn_prep_f32")?;
        let ints = [
            as_i32(nh, "heads")?,
            as_i32(nkv, "kv heads")?,
            as_i32(hd, "head_dim")?,
            as_i32(rot, "rot")?,
            i32::from(gated),
            as_i32(k_cache.len() / kvw, "capacity")?,
        ];
        let strides = [src.q.1 as i64, src.k.1 as i64, src.v.1 as i64];
        let cfg = LaunchConfig {
            grid_dim: (t as u32, (nh + 2 * nkv) as u32, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let null: u64 = 0;
        guard("attn_prep", || {
            let st = self.stream();
            let (qs, ks, vs) = (dptr(src.q.0, st), dptr(src.k.0, st), dptr(src.v.0, st));
            let qp = dptr_mut(q, st);
            let gp = gate.map_or(0, |g| dptr_mut(g, st));
            let qn = src.q_norm.map_or(0, |w| dptr(w, st));
            let kn = src.k_norm.map_or(0, |w| dptr(w, st));
            let (pp, fp, cp) = (
                dptr(src.pos, st),
                dptr(src.inv_freq, st),
                dptr(src.committed, st),
            );
            let mut b = self.launch(&f);
            b.arg(&qs)
                .arg(&strides[0])
                .arg(&ks)
                .arg(&strides[1])
                .arg(&vs)
                .arg(&strides[2])
                .arg(&qp)
                .arg(if gated { &gp } else { &null })
                .arg(&mut *k_cache)
                .arg(&mut *v_cache)
                .arg(&qn)
                .arg(&kn)
                .arg(&pp)
                .arg(&fp)
                .arg(&cp);
            for v in &ints {
                b.arg(v);
            }
            b.arg(&eps);
            // SAFETY: argument types match `attn_prep_f32`; every source holds T strided rows,
            // q/gate hold [T, H, hd], and K/V rows past the cache are dropped by the kernel.
            unsafe { b.launch(cfg) }.map_err(launch_err("attn_prep_f32"))
        })
    }

    /// `y *= s` element-wise.
    pub fn scale_inplace(&self, y: &mut impl DevicePtrMut<f32>, s: f32) -> Result<()> {
        let n = y.len() as i64;
        if n == 0 {
            return Ok(());
        }
        let f = self.func(Module::Glue, "scale_f32")?;
        guard("scale", || {
            let st = self.stream();
            let yp = dptr_mut(y, st);
            let mut b = self.launch(&f);
            b.arg(&yp).arg(&s).arg(&n);
            // SAFETY: argument types match `scale_f32`.
            unsafe { b.launch(grid_1d(n as u64)) }.map_err(launch_err("scale_f32"))
        })
    }

    /// `y += x` element-wise.
    pub fn add_inplace(
        &self,
        y: &mut impl DevicePtrMut<f32>,
        x: &impl DevicePtr<f32>,
    ) -> Result<()> {
        ensure!(
            y.len() == x.len(),
            "add: y has {} values, x {}",
            y.len(),
            x.len()
        );
        let n = y.len() as i64;
        if n == 0 {
            return Ok(());
        }
        let f = self.func(Module::Glue, "add_f32")?;
        guard("add", || {
            let st = self.stream();
            let (yp, xp) = (dptr_mut(y, st), dptr(x, st));
            let mut b = self.launch(&f);
            b.arg(&yp).arg(&xp).arg(&n);
            // SAFETY: argument types match `add_f32`; lengths checked.
            unsafe { b.launch(grid_1d(n as u64)) }.map_err(launch_err("add_f32"))
        })
    }

    /// Splits the gated-attention q projection qf [rows, 2·hd] (per head: hd query values, then
    /// hd gate values) into q and gate [rows, hd].
    pub fn split_q_gate(
        &self,
        qf: &impl DevicePtr<f32>,
        hd: usize,
        q: &mut impl DevicePtrMut<f32>,
        gate: &mut impl DevicePtrMut<f32>,
    ) -> Result<()> {
        ensure!(
            hd > 0 && qf.len() == 2 * q.len() && q.len() == gate.len() && q.len() % hd == 0,
            "split_q_gate: qf {} values, q {}, gate {}, hd {hd}",
            qf.len(),
            q.len(),
            gate.len()
        );
        let n = q.len() as i64;
        if n == 0 {
            return Ok(());
        }
        let f = self.func(Module::Glue, "split_q_gate_f32")?;
        let hd_i = as_i32(hd, "hd")?;
        guard("split_q_gate", || {
            let st = self.stream();
            let (fp, qp, gp) = (dptr(qf, st), dptr_mut(q, st), dptr_mut(gate, st));
            let mut b = self.launch(&f);
            b.arg(&fp).arg(&qp).arg(&gp).arg(&n).arg(&hd_i);
            // SAFETY: argument types match `split_q_gate_f32`; lengths checked.
            unsafe { b.launch(grid_1d(n as u64)) }.map_err(launch_err("split_q_gate_f32"))
        })
    }

    /// `o *= sigmoid(gate)` element-wise (the attention output gate).
    pub fn sigmoid_mul(
        &self,
        o: &mut impl DevicePtrMut<f32>,
        gate: &impl DevicePtr<f32>,
    ) -> Result<()> {
        ensure!(
            o.len() == gate.len(),
            "sigmoid_mul: o has {} values, gate {}",
            o.len(),
            gate.len()
        );
        let n = o.len() as i64;
        if n == 0 {
            return Ok(());
        }
        let f = self.func(Module::Glue, "sigmoid_mul_f32")?;
        guard("sigmoid_mul", || {
            let st = self.stream();
            let (op, gp) = (dptr_mut(o, st), dptr(gate, st));
            let mut b = self.launch(&f);
            b.arg(&op).arg(&gp).arg(&n);
            // SAFETY: argument types match `sigmoid_mul_f32`; lengths checked.
            unsafe { b.launch(grid_1d(n as u64)) }.map_err(launch_err("sigmoid_mul_f32"))
        })
    }

    /// Gated DeltaNet inputs from the conv output mc [T, 2·Hk·dk + vd] ([q | k | v] per row):
    /// q, k [T, Hk·dk] l2-normed per head (eps inside the root), q then scaled by `qscale`;
    /// v [T, vd] copied.
    #[allow(clippy::too_many_arguments)]
    pub fn gdn_split_qkv(
        &self,
        mc: &impl DevicePtr<f32>,
        t: usize,
        hk: usize,
        dk: usize,
        vd: usize,
        qscale: f32,
        eps: f32,
        q: &mut impl DevicePtrMut<f32>,
        k: &mut impl DevicePtrMut<f32>,
        v: &mut impl DevicePtrMut<f32>,
    ) -> Result<()> {
        self.gdn_split_qkv_gate(mc, t, hk, dk, vd, qscale, eps, q, k, v, None)
    }

    /// [`CudaDevice::gdn_split_qkv`] that also computes g and β
    /// ([`CudaDevice::gdn_gate_beta_strided`], the same operations) in the same launch.
    #[allow(clippy::too_many_arguments)]
    pub fn gdn_split_qkv_gate(
        &self,
        mc: &impl DevicePtr<f32>,
        t: usize,
        hk: usize,
        dk: usize,
        vd: usize,
        qscale: f32,
        eps: f32,
        q: &mut impl DevicePtrMut<f32>,
        k: &mut impl DevicePtrMut<f32>,
        v: &mut impl DevicePtrMut<f32>,
        gate: Option<GdnGateArgs<'_>>,
    ) -> Result<()> {
        let kd = hk * dk;
        ensure!(
            mc.len() == t * (2 * kd + vd),
            "gdn_split_qkv: mc has {} values, not [T={t}, {}]",
            mc.len(),
            2 * kd + vd
        );
        ensure!(
            q.len() == t * kd && k.len() == t * kd && v.len() == t * vd,
            "gdn_split_qkv: q/k must be [T={t}, {kd}] and v [T={t}, {vd}]"
        );
        let hv = check_gate(gate.as_ref(), t)?;
        if t == 0 {
            return Ok(());
        }
        let f = self.func(Module::Glue, "gdn_split_qkv_f32")?;
        let vblocks = vd.div_ceil(128 * 8);
        let extra = usize::from(gate.is_some());
        let cfg = LaunchConfig {
            grid_dim: (t as u32, (2 * hk + vblocks + extra) as u32, 1),
            block_dim: (128, 1, 1),
            shared_mem_bytes: 0,
        };
        let dims = [as_i32(hk, "hk")?, as_i32(dk, "dk")?, as_i32(vd, "vd")?];
        let hv_i = as_i32(hv, "hv")?;
        guard("gdn_split_qkv", || {
            let st = self.stream();
            let (mp, qp, kp, vp) = (
                dptr(mc, st),
                dptr_mut(q, st),
                dptr_mut(k, st),
                dptr_mut(v, st),
            );
            let gp = gate_ptrs(gate, st);
            let mut b = self.launch(&f);
            b.arg(&mp).arg(&qp).arg(&kp).arg(&vp);
            for d in &dims {
                b.arg(d);
            }
            b.arg(&qscale).arg(&eps);
            for p in &gp {
                b.arg(p);
            }
            b.arg(&hv_i);
            // SAFETY: argument types match `gdn_split_qkv_f32`; shapes checked, and the g/β
            // block runs only with all of its pointers set.
            unsafe { b.launch(cfg) }.map_err(launch_err("gdn_split_qkv_f32"))
        })
    }

    /// Causal tree conv1d and the q/k/v split (+ g/β) in one launch (`gdn_conv_split_qkv_f32`):
    /// bit-identical to [`CudaDevice::conv1d_tree_strided`] into a [T, C] buffer followed by
    /// [`CudaDevice::gdn_split_qkv_gate`] on it, C = 2·Hk·dk + vd, except that the conv output
    /// itself is not stored (only q, k, v, the windows and g/β are). dk ≤ 256.
    #[allow(clippy::too_many_arguments)]
    pub fn gdn_conv_split_qkv_gate(
        &self,
        conv: GdnConvArgs<'_>,
        t: usize,
        hk: usize,
        dk: usize,
        vd: usize,
        qscale: f32,
        eps: f32,
        q: &mut impl DevicePtrMut<f32>,
        k: &mut impl DevicePtrMut<f32>,
        v: &mut impl DevicePtrMut<f32>,
        gate: Option<GdnGateArgs<'_>>,
    ) -> Result<()> {
        let kd = hk * dk;
        let c = 2 * kd + vd;
        ensure!(
            hk > 0 && (1..=GDN_CONV_MAX_DK).contains(&dk),
            "gdn_conv_split_qkv: {hk} key heads of {dk} (dk must be 1..={GDN_CONV_MAX_DK})"
        );
        let lens = ConvLens {
            m: conv.m.len(),
            state: conv.state.len(),
            w: conv.w.len(),
            parents: conv.parents.len(),
            // No conv output buffer: its values go straight into q, k and v.
            out: t * c,
            windows: conv.windows.len(),
        };
        check_conv(lens, t, c, conv.kernel, conv.m_stride)?;
        ensure!(
            q.len() == t * kd && k.len() == t * kd && v.len() == t * vd,
            "gdn_conv_split_qkv: q/k must be [T={t}, {kd}] and v [T={t}, {vd}]"
        );
        let hv = check_gate(gate.as_ref(), t)?;
        let f = self.func(Module::Glue, "gdn_conv_split_qkv_f32")?;
        // One v value per thread (the kernel's header says why).
        let vblocks = vd.div_ceil(128);
        let extra = usize::from(gate.is_some());
        let cfg = LaunchConfig {
            grid_dim: (t as u32, (2 * hk + vblocks + extra) as u32, 1),
            block_dim: (128, 1, 1),
            shared_mem_bytes: 0,
        };
        let (ms, kw) = (conv.m_stride as i64, conv.kernel as i32);
        let dims = [as_i32(hk, "hk")?, as_i32(dk, "dk")?, as_i32(vd, "vd")?];
        let hv_i = as_i32(hv, "hv")?;
        guard("gdn_conv_split_qkv", || {
            let st = self.stream();
            let (mp, sp, pp, wp) = (
                dptr(conv.m, st),
                dptr(conv.state, st),
                dptr(conv.parents, st),
                dptr_mut(conv.windows, st),
            );
            let (qp, kp, vp) = (dptr_mut(q, st), dptr_mut(k, st), dptr_mut(v, st));
            let gp = gate_ptrs(gate, st);
            let mut b = self.launch(&f);
            b.arg(&mp)
                .arg(&ms)
                .arg(&sp)
                .arg(conv.w)
                .arg(&pp)
                .arg(&wp)
                .arg(&kw)
                .arg(&qp)
                .arg(&kp)
                .arg(&vp);
            for d in &dims {
                b.arg(d);
            }
            b.arg(&qscale).arg(&eps);
            for p in &gp {
                b.arg(p);
            }
            b.arg(&hv_i);
            // SAFETY: argument types match `gdn_conv_split_qkv_f32`; the conv operands checked
            // as conv1d_tree's, q/k/v and g/β as gdn_split_qkv_gate's, dk within the kernel's
            // shared buffer, and the g/β block runs only with all of its pointers set.
            unsafe { b.launch(cfg) }.map_err(launch_err("gdn_conv_split_qkv_f32"))
        })
    }

    /// Per (row, value head): `beta = sigmoid(b_raw)`, `g = neg_exp_a[h] · softplus(a_raw +
    /// dt_bias[h])` (softplus linear above 20, as torch's). braw, araw, g, beta [T, Hv].
    #[allow(clippy::too_many_arguments)]
    pub fn gdn_gate_beta(
        &self,
        braw: &impl DevicePtr<f32>,
        araw: &impl DevicePtr<f32>,
        neg_exp_a: &CudaSlice<f32>,
        dt_bias: &CudaSlice<f32>,
        g: &mut impl DevicePtrMut<f32>,
        beta: &mut impl DevicePtrMut<f32>,
    ) -> Result<()> {
        self.gdn_gate_beta_strided(braw, araw, neg_exp_a.len(), neg_exp_a, dt_bias, g, beta)
    }

    /// [`CudaDevice::gdn_gate_beta`] with the rows of b_raw and a_raw `stride` values apart
    /// (each holds (T − 1)·stride + Hv values), so a fused projection's output is read in place.
    #[allow(clippy::too_many_arguments)]
    pub fn gdn_gate_beta_strided(
        &self,
        braw: &impl DevicePtr<f32>,
        araw: &impl DevicePtr<f32>,
        stride: usize,
        neg_exp_a: &CudaSlice<f32>,
        dt_bias: &CudaSlice<f32>,
        g: &mut impl DevicePtrMut<f32>,
        beta: &mut impl DevicePtrMut<f32>,
    ) -> Result<()> {
        let hv = neg_exp_a.len();
        let n = g.len();
        let t = n / hv.max(1);
        let src_len = if t == 0 { 0 } else { (t - 1) * stride + hv };
        ensure!(
            hv > 0
                && stride >= hv
                && dt_bias.len() == hv
                && n % hv == 0
                && braw.len() == src_len
                && araw.len() == src_len
                && beta.len() == n,
            "gdn_gate_beta: braw {}, araw {}, g {n}, beta {} values for Hv = {hv}, stride {stride}",
            braw.len(),
            araw.len(),
            beta.len()
        );
        if n == 0 {
            return Ok(());
        }
        let f = self.func(Module::Glue, "gdn_gate_beta_f32")?;
        let (n_i, hv_i, s_i) = (as_i32(n, "n")?, as_i32(hv, "hv")?, stride as i64);
        guard("gdn_gate_beta", || {
            let st = self.stream();
            let (bp, ap, gp, betap) = (
                dptr(braw, st),
                dptr(araw, st),
                dptr_mut(g, st),
                dptr_mut(beta, st),
            );
            let mut b = self.launch(&f);
            b.arg(&bp)
                .arg(&ap)
                .arg(neg_exp_a)
                .arg(dt_bias)
                .arg(&gp)
                .arg(&betap)
                .arg(&n_i)
                .arg(&hv_i)
                .arg(&s_i);
            // SAFETY: argument types match `gdn_gate_beta_f32`; lengths checked.
            unsafe { b.launch(grid_1d(n as u64)) }.map_err(launch_err("gdn_gate_beta_f32"))
        })
    }

    /// Gated RMSNorm per head of n = w.len() values: `o = o / sqrt(mean(o²) + eps) · w ·
    /// silu(z)`; o, z [rows, n].
    pub fn rms_norm_gated(
        &self,
        o: &mut impl DevicePtrMut<f32>,
        z: &impl DevicePtr<f32>,
        w: &CudaSlice<f32>,
        eps: f32,
    ) -> Result<()> {
        ensure!(
            z.len() == o.len(),
            "rms_norm_gated: o {} values, z {}",
            o.len(),
            z.len()
        );
        // Packed z: each head is a row of its own.
        self.rms_norm_gated_strided(o, z, 1, w.len(), w, eps)
    }

    /// [`CudaDevice::rms_norm_gated`] with z's rows (T of them, `heads` heads of n values each)
    /// `z_stride` values apart ((T − 1)·z_stride + heads·n values), so a fused projection's
    /// output is read in place; o is [T·heads, n].
    pub fn rms_norm_gated_strided(
        &self,
        o: &mut impl DevicePtrMut<f32>,
        z: &impl DevicePtr<f32>,
        heads: usize,
        z_stride: usize,
        w: &CudaSlice<f32>,
        eps: f32,
    ) -> Result<()> {
        let n = w.len();
        ensure!(
            n > 0 && heads > 0 && o.len().is_multiple_of(n * heads) && z_stride >= heads * n,
            "rms_norm_gated: o {} values, head size {n}, {heads} heads per row, z stride {z_stride}",
            o.len()
        );
        let rows = o.len() / n;
        let t = rows / heads;
        ensure!(
            t == 0 || z.len() == (t - 1) * z_stride + heads * n,
            "rms_norm_gated: z has {} values, not {t} rows of {} at stride {z_stride}",
            z.len(),
            heads * n
        );
        if rows == 0 {
            return Ok(());
        }
        let f = self.func(Module::Glue, "rms_norm_gated_f32")?;
        let (n_i, h_i, zs) = (as_i32(n, "n")?, as_i32(heads, "heads")?, z_stride as i64);
        let cfg = LaunchConfig {
            grid_dim: (rows as u32, 1, 1),
            block_dim: (128, 1, 1),
            shared_mem_bytes: 0,
        };
        guard("rms_norm_gated", || {
            let st = self.stream();
            let (op, zp) = (dptr_mut(o, st), dptr(z, st));
            let mut b = self.launch(&f);
            b.arg(&op)
                .arg(&zp)
                .arg(w)
                .arg(&n_i)
                .arg(&eps)
                .arg(&h_i)
                .arg(&zs);
            // SAFETY: argument types match `rms_norm_gated_f32`; lengths checked.
            unsafe { b.launch(cfg) }.map_err(launch_err("rms_norm_gated_f32"))
        })
    }

    /// `dst[j, :] = src[idx[j], :]` for the idx.len() rows of `len` values (src and dst must
    /// not overlap; every idx must be a row of src — the callers pass checked tree rows).
    pub fn gather_rows(
        &self,
        src: &impl DevicePtr<f32>,
        idx: &impl DevicePtr<i32>,
        len: usize,
        dst: &mut impl DevicePtrMut<f32>,
    ) -> Result<()> {
        let n = idx.len();
        ensure!(
            len > 0 && dst.len() == n * len && src.len() % len == 0,
            "gather_rows: src {} values, dst {}, {n} rows of {len}",
            src.len(),
            dst.len()
        );
        if n == 0 {
            return Ok(());
        }
        let f = self.func(Module::Glue, "gather_rows_f32")?;
        let len_i = as_i32(len, "len")?;
        let cfg = LaunchConfig {
            grid_dim: (n as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        guard("gather_rows", || {
            let st = self.stream();
            let (sp, ip, dp) = (dptr(src, st), dptr(idx, st), dptr_mut(dst, st));
            let mut b = self.launch(&f);
            b.arg(&sp).arg(&dp).arg(&ip).arg(&len_i);
            // SAFETY: argument types match `gather_rows_f32`; lengths checked.
            unsafe { b.launch(cfg) }.map_err(launch_err("gather_rows_f32"))
        })
    }

    /// Writes the T = src.len() / stride pending K (or V) rows into the cache after the
    /// `committed` rows, reading `committed` from device memory (graph-safe).
    pub fn kv_store(
        &self,
        src: &impl DevicePtr<f32>,
        stride: usize,
        committed: &impl DevicePtr<i32>,
        cache: &mut CudaSlice<f32>,
    ) -> Result<()> {
        ensure!(
            stride > 0 && src.len().is_multiple_of(stride) && cache.len().is_multiple_of(stride),
            "kv_store: src {} values, cache {}, stride {stride}",
            src.len(),
            cache.len()
        );
        let t = src.len() / stride;
        if t == 0 {
            return Ok(());
        }
        let f = self.func(Module::Glue, "kv_store_f32")?;
        let (t_i, s_i, cap_i) = (
            as_i32(t, "T")?,
            as_i32(stride, "stride")?,
            as_i32(cache.len() / stride, "capacity")?,
        );
        guard("kv_store", || {
            let st = self.stream();
            let (sp, cp) = (dptr(src, st), dptr(committed, st));
            let mut b = self.launch(&f);
            b.arg(&sp)
                .arg(&mut *cache)
                .arg(&cp)
                .arg(&t_i)
                .arg(&s_i)
                .arg(&cap_i);
            // SAFETY: argument types match `kv_store_f32`; rows past the cache are dropped.
            unsafe { b.launch(grid_1d((t * stride) as u64)) }.map_err(launch_err("kv_store_f32"))
        })
    }

    /// Splits a fused projection src [n, total] into up to four contiguous pieces: piece p
    /// starts at column `offsets[p]` and goes to `dests[p]` [n, width] (the width comes from
    /// the destination).
    pub fn split_cols(
        &self,
        src: &impl DevicePtr<f32>,
        n: usize,
        offsets: &[usize],
        dests: &mut [&mut dyn DevicePtrMut<f32>],
    ) -> Result<()> {
        ensure!(
            n > 0
                && src.len().is_multiple_of(n)
                && dests.len() <= 4
                && offsets.len() == dests.len(),
            "split_cols: {} values for {n} rows, {} offsets for {} pieces (at most 4)",
            src.len(),
            offsets.len(),
            dests.len()
        );
        let total = src.len() / n;
        let st = self.stream();
        let mut args = [(0u64, 0i32, 0i32); 4];
        for ((slot, &off), dst) in args.iter_mut().zip(offsets).zip(dests.iter_mut()) {
            let w = dst.len() / n;
            ensure!(
                dst.len() == n * w && w > 0 && off + w <= total,
                "split_cols: piece at column {off} of width {w} does not fit {total} columns"
            );
            *slot = (
                dst.device_ptr_mut(st).0,
                as_i32(off, "offset")?,
                as_i32(w, "width")?,
            );
        }
        let f = self.func(Module::Glue, "split_cols_f32")?;
        let (n_i, t_i) = (as_i32(n, "n")?, as_i32(total, "total")?);
        guard("split_cols", || {
            let sp = dptr(src, st);
            let mut b = self.launch(&f);
            b.arg(&sp).arg(&n_i).arg(&t_i);
            for a in &args {
                b.arg(&a.0).arg(&a.1).arg(&a.2);
            }
            // SAFETY: argument types match `split_cols_f32`; every piece fits its destination
            // and the source's columns (checked above); unused pieces are null.
            unsafe { b.launch(grid_1d((n * total) as u64)) }.map_err(launch_err("split_cols_f32"))
        })
    }

    /// SwiGLU over a fused gate|up projection gu [n, 2·inter] (per row: inter gate values, then
    /// inter up values) into out [n, inter].
    pub fn swiglu_pair(
        &self,
        gu: &impl DevicePtr<f32>,
        n: usize,
        inter: usize,
        out: &mut impl DevicePtrMut<f32>,
    ) -> Result<()> {
        ensure!(
            gu.len() == 2 * n * inter && out.len() == n * inter,
            "swiglu_pair: gate|up has {} values, out {}, for [{n}, {inter}]",
            gu.len(),
            out.len()
        );
        if n * inter == 0 {
            return Ok(());
        }
        let f = self.func(Module::Glue, "swiglu_pair_f32")?;
        let (n_i, i_i) = (as_i32(n, "n")?, as_i32(inter, "inter")?);
        guard("swiglu_pair", || {
            let st = self.stream();
            let (gp, op) = (dptr(gu, st), dptr_mut(out, st));
            let mut b = self.launch(&f);
            b.arg(&gp).arg(&op).arg(&n_i).arg(&i_i);
            // SAFETY: argument types match `swiglu_pair_f32`; lengths checked.
            unsafe { b.launch(grid_1d((n * inter) as u64)) }.map_err(launch_err("swiglu_pair_f32"))
        })
    }

    /// Residual add then RMSNorm per row of n = w.len() values: `h += y; x = norm(h) · w`.
    pub fn add_rms_norm(
        &self,
        h: &mut impl DevicePtrMut<f32>,
        y: &impl DevicePtr<f32>,
        w: &CudaSlice<f32>,
        eps: f32,
        x: &mut impl DevicePtrMut<f32>,
    ) -> Result<()> {
        let n = w.len();
        ensure!(
            n > 0 && h.len().is_multiple_of(n) && y.len() == h.len() && x.len() == h.len(),
            "add_rms_norm: h {} values, y {}, x {}, row {n}",
            h.len(),
            y.len(),
            x.len()
        );
        let rows = h.len() / n;
        if rows == 0 {
            return Ok(());
        }
        let f = self.func(Module::Glue, "add_rms_norm_f32")?;
        let n_i = as_i32(n, "n")?;
        let cfg = LaunchConfig {
            grid_dim: (rows as u32, 1, 1),
            block_dim: (add_norm_block(n), 1, 1),
            shared_mem_bytes: 0,
        };
        guard("add_rms_norm", || {
            let st = self.stream();
            let (hp, yp, xp) = (dptr_mut(h, st), dptr(y, st), dptr_mut(x, st));
            let mut b = self.launch(&f);
            b.arg(&hp).arg(&yp).arg(w).arg(&xp).arg(&n_i).arg(&eps);
            // SAFETY: argument types match `add_rms_norm_f32`; lengths checked.
            unsafe { b.launch(cfg) }.map_err(launch_err("add_rms_norm_f32"))
        })
    }
}
