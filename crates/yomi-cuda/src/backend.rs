//! The CUDA implementation of the backend op set (`yomi_core::backend`), so the architecture
//! files of `yomi-models` run on the GPU as they run on the CPU.
//!
//! - Activations are device buffers ([`DevBuf`]) that grow and never shrink. A fused
//!   projection (the rows of several matrices stacked into one, see [`Stack`]) writes all its
//!   outputs in one launch, side by side per row; the buffers of its second and later pieces
//!   then *view* the first one's rows (a device address, a row stride and a width), and the
//!   kernels that read projections take strided rows. A view is valid until the buffer that
//!   owns the memory is written again, which the model code only does after the view's reader.
//! - The pass's rows (ids, positions, tree, committed length) are uploaded by
//!   [`Backend::set_rows`] before the pass; during the pass nothing moves between host and
//!   device unless hidden states are tapped, so a pass can be captured as a CUDA graph. Any
//!   growth of a buffer bumps [`Cuda::epoch`]: graphs captured before it are stale.
//! - Chains longer than [`MAX_ROWS`] (prefill) run their mixer cores in pieces of that many
//!   rows, in order; each attention piece sees the K/V rows of the pieces before it, each GDN
//!   piece starts from the previous piece's final state and last conv window. Such a chain can
//!   only be committed whole. A tree must fit one piece.
//! - Ops cannot return errors through the trait: the first failure is kept ([`Cuda::take_error`])
//!   and every op after it does nothing.

use std::cell::{Cell, RefCell};
use std::sync::Arc;

use anyhow::{Context, Result, anyhow, bail, ensure};
use cudarc::driver::sys::CUdeviceptr;
use cudarc::driver::{
    CudaSlice, CudaStream, CudaView, CudaViewMut, DevicePtr, DevicePtrMut, DeviceSlice, SyncOnDrop,
};
use yomi_core::backend::{AttnCore, AttnHeads, Backend, BlockMask, GdnParams, RotaryFill};
use yomi_core::{GdnShape, TreeBatch};

use crate::attention::{AttnDims, AttnScratch};
use crate::device::CudaDevice;
use crate::ops::{DeviceMatrix, GateUpMatrix, GdnDeviceRows};
use crate::{GdnConvArgs, GdnGateArgs};

/// Rows of one mixer-core piece (the GEMV, tree attention and GDN verify kernels' limit).
pub const MAX_ROWS: usize = 32;

/// The GDN q/k l2-norm epsilon (inside the root), as on the CPU.
const L2_EPS: f32 = 1e-6;

/// Device memory that is not a `CudaSlice` of its own: rows of another buffer, handed to the
/// kernels as their `DevicePtr` arguments. The stream is the device's only stream, so no event
/// is recorded (cudarc's event tracking is off, see `device.rs`).
struct Raw<'a> {
    ptr: CUdeviceptr,
    len: usize,
    stream: &'a Arc<CudaStream>,
}

impl DeviceSlice<f32> for Raw<'_> {
    fn len(&self) -> usize {
        self.len
    }
    fn stream(&self) -> &Arc<CudaStream> {
        self.stream
    }
}

impl DevicePtr<f32> for Raw<'_> {
    fn device_ptr<'a>(&'a self, _stream: &'a CudaStream) -> (CUdeviceptr, SyncOnDrop<'a>) {
        (self.ptr, SyncOnDrop::Sync(None))
    }
}

impl DevicePtrMut<f32> for Raw<'_> {
    fn device_ptr_mut<'a>(&'a mut self, _stream: &'a CudaStream) -> (CUdeviceptr, SyncOnDrop<'a>) {
        (self.ptr, SyncOnDrop::Sync(None))
    }
}

/// Where a view's rows are: `width` values per row, rows `stride` values apart from `ptr`.
#[derive(Clone, Copy, Debug)]
struct Strided {
    ptr: CUdeviceptr,
    stride: usize,
    width: usize,
}

/// Rows of f32 activations on the device (see the module header).
#[derive(Default)]
pub struct DevBuf {
    mem: Option<CudaSlice<f32>>,
    /// Set while the values are rows of a fused projection's output (this buffer's own memory
    /// or another's).
    view: Option<Strided>,
}

impl DevBuf {
    /// Values this buffer's own memory holds.
    pub fn capacity(&self) -> usize {
        self.mem.as_ref().map_or(0, |m| m.len())
    }

    /// The first `n` packed values, for copies back to the host.
    pub fn packed(&self, n: usize) -> Result<CudaView<'_, f32>> {
        ensure!(
            self.view.is_none(),
            "a strided buffer read as packed values"
        );
        match &self.mem {
            Some(m) if m.len() >= n => Ok(m.slice(0..n)),
            _ => bail!("a buffer of {} values read for {n}", self.capacity()),
        }
    }
}

/// The matrices of several projections of one input, stacked row-wise into one (one launch
/// computes them all, their outputs side by side per row), or the MLP's gate and up
/// interleaved for the GEMV's SwiGLU epilogue.
pub enum StackKind {
    Rows(DeviceMatrix),
    GateUp(GateUpMatrix),
}

pub struct Stack {
    pub kind: StackKind,
    /// The stacked biases (zeros for pieces without one), when any piece has a bias.
    pub bias: Option<CudaSlice<f32>>,
    /// Output rows of each piece, in order.
    pub widths: Vec<usize>,
}

/// A weight matrix on the device: its own, or piece `i` of a [`Stack`] (read only together
/// with the stack's other pieces, by the ops that fuse them).
// One per weight matrix, built once: the variants' size difference does not matter.
#[allow(clippy::large_enum_variant)]
pub enum DevLinear {
    Own(DeviceMatrix),
    Part(Arc<Stack>, usize),
}

impl DevLinear {
    fn own(&self) -> Result<&DeviceMatrix> {
        match self {
            DevLinear::Own(m) => Ok(m),
            DevLinear::Part(..) => bail!("a piece of a fused projection used on its own"),
        }
    }

    fn dims(&self) -> (usize, usize) {
        match self {
            DevLinear::Own(m) => (m.rows, m.cols),
            DevLinear::Part(s, i) => (
                s.widths[*i],
                match &s.kind {
                    StackKind::Rows(m) => m.cols,
                    StackKind::GateUp(g) => g.cols(),
                },
            ),
        }
    }

    /// The stack whose pieces `ws` are, all of them in order.
    fn whole_stack<'a>(ws: &[&'a DevLinear]) -> Option<&'a Arc<Stack>> {
        let DevLinear::Part(s0, 0) = ws.first()? else {
            return None;
        };
        let all = ws.len() == s0.widths.len()
            && ws
                .iter()
                .enumerate()
                .all(|(i, w)| matches!(w, DevLinear::Part(s, j) if Arc::ptr_eq(s, s0) && *j == i));
        all.then_some(s0)
    }
}

/// One attention layer's K/V cache on the device, [capacity, n_kv, hd] each (None: its
/// allocation failed, and the backend holds that error).
pub struct DevKv {
    pub k: Option<CudaSlice<f32>>,
    pub v: Option<CudaSlice<f32>>,
    pub capacity: usize,
}

/// One gated-delta-rule layer's state on the device.
pub struct DevGdn {
    /// Committed recurrent state [Hv, dk, dv].
    pub s: CudaSlice<f32>,
    /// Committed conv state [K−1, C].
    pub conv: CudaSlice<f32>,
    /// State after the last row of the pending chain.
    pub fin: CudaSlice<f32>,
    /// Second state buffer: piece ping-pong and commit replay target.
    pub spare: CudaSlice<f32>,
    /// The conv window a later piece starts from (the previous piece's last row's).
    pub carry: CudaSlice<f32>,
    /// Pending per-row values of the last piece: k [R, Hk·dk], v [R, Hv·dv], g, β [R, Hv],
    /// conv windows [R, K−1, C].
    pub pk: CudaSlice<f32>,
    pub pv: CudaSlice<f32>,
    pub pg: CudaSlice<f32>,
    pub pb: CudaSlice<f32>,
    pub pwin: CudaSlice<f32>,
    /// Rows of the pending pass's last piece, and whether the pending chain has more than one
    /// (a commit reads them). Set by the executor before each pass, not by the op: a replayed
    /// CUDA graph runs no host code.
    pub pend_rows: usize,
    pub pend_multi: bool,
}

impl DevGdn {
    /// A zeroed state for `shape`, conv width `kernel`.
    pub fn new(dev: &CudaDevice, shape: GdnShape, kernel: usize) -> Result<Self> {
        let z = |n: usize| -> Result<CudaSlice<f32>> { Ok(dev.alloc_zeros::<f32>(n.max(1))?) };
        let GdnShape { hk, hv, dk, dv } = shape;
        let (kd, vd) = (hk * dk, hv * dv);
        let sl = hv * dk * dv;
        let wl = (kernel - 1) * (2 * kd + vd);
        Ok(DevGdn {
            s: z(sl)?,
            conv: z(wl)?,
            fin: z(sl)?,
            spare: z(sl)?,
            carry: z(wl)?,
            pk: z(MAX_ROWS * kd)?,
            pv: z(MAX_ROWS * vd)?,
            pg: z(MAX_ROWS * hv)?,
            pb: z(MAX_ROWS * hv)?,
            pwin: z(MAX_ROWS * wl)?,
            pend_rows: 0,
            pend_multi: false,
        })
    }
}

impl DevKv {
    pub fn new(dev: &CudaDevice, n_kv: usize, head_dim: usize, capacity: usize) -> Result<Self> {
        let n = (capacity * n_kv * head_dim).max(1);
        Ok(DevKv {
            k: Some(dev.alloc_zeros::<f32>(n)?),
            v: Some(dev.alloc_zeros::<f32>(n)?),
            capacity,
        })
    }

    fn kv(&mut self) -> Result<(&mut CudaSlice<f32>, &mut CudaSlice<f32>)> {
        match (&mut self.k, &mut self.v) {
            (Some(k), Some(v)) => Ok((k, v)),
            _ => bail!("a K/V cache that was never allocated"),
        }
    }
}

/// A pass's rows on the device (see [`Backend::set_rows`]).
pub struct RowBufs {
    pub ids: CudaSlice<i32>,
    pub pos: CudaSlice<i32>,
    /// Parents of the first piece's rows (a chain's pieces all read this prefix).
    pub parents: CudaSlice<i32>,
    /// Ancestor bits of the first piece's rows, from its first row.
    pub anc: CudaSlice<u64>,
    /// Cache rows before each piece.
    pub slots: CudaSlice<i32>,
}

#[derive(Default)]
pub struct DevRows {
    pub t: usize,
    pub chain: bool,
    /// The rows continue a pending chain (the executor's segments of a long chain): the GDN
    /// cores start from its final state and last conv window, not from the committed ones.
    pub cont: bool,
    bufs: Option<RowBufs>,
    host_i32: Vec<i32>,
    host_u64: Vec<u64>,
}

impl DevRows {
    fn bufs(&self) -> Result<&RowBufs> {
        self.bufs
            .as_ref()
            .ok_or_else(|| anyhow!("a pass ran before its rows were set"))
    }

    /// The pieces of the pass: (first row, rows).
    fn pieces(&self) -> impl Iterator<Item = (usize, usize)> + use<> {
        let t = self.t;
        (0..t)
            .step_by(MAX_ROWS)
            .map(move |r0| (r0, (t - r0).min(MAX_ROWS)))
    }
}

/// Working space of the mixer cores and the commit, shared by a state's layers.
#[derive(Default)]
struct Shared {
    /// q normed and rotated, and the output gate rows, of one piece.
    q: Option<CudaSlice<f32>>,
    gate: Option<CudaSlice<f32>>,
    attn: Option<(AttnDims, usize, AttnScratch)>,
    /// The GDN conv output (unfused path) and q after its norm, of one piece.
    gdn_mc: Option<CudaSlice<f32>>,
    gdn_q: Option<CudaSlice<f32>>,
    /// The commit replay: accepted row indices (and the host list they hold), the parents of a
    /// chain, the compacted k, v, g, β and the replay's output.
    accepted: Option<CudaSlice<i32>>,
    accepted_host: Vec<usize>,
    /// Host staging of the upload.
    accepted_i32: Vec<i32>,
    chain_parents: Option<CudaSlice<i32>>,
    ck: Option<CudaSlice<f32>>,
    cv: Option<CudaSlice<f32>>,
    cg: Option<CudaSlice<f32>>,
    cb: Option<CudaSlice<f32>>,
    co: Option<CudaSlice<f32>>,
    /// Token ids of [`Backend::embed`] (host tokens, not a pass's rows).
    ids: Option<CudaSlice<i32>>,
    /// A bidirectional block's committed length and ancestor bits (every row sees every row),
    /// and the host staging of the bits.
    block_committed: Option<CudaSlice<i32>>,
    block_anc: Option<CudaSlice<u64>>,
    block_host: Vec<u64>,
}

/// The CUDA backend of one sequence state: the device, the model's rotary frequencies and the
/// state's working space.
pub struct Cuda {
    dev: Arc<CudaDevice>,
    inv_freq: Arc<CudaSlice<f32>>,
    shared: RefCell<Shared>,
    err: RefCell<Option<anyhow::Error>>,
    epoch: Cell<u64>,
}

/// Grows `slot` to at least `n` values (zeroed when new), bumping `epoch`.
fn grow<'a, T: cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits>(
    dev: &CudaDevice,
    epoch: &Cell<u64>,
    slot: &'a mut Option<CudaSlice<T>>,
    n: usize,
) -> Result<&'a mut CudaSlice<T>> {
    if slot.as_ref().is_none_or(|s| s.len() < n) {
        *slot = Some(dev.alloc_zeros::<T>(n.max(1))?);
        epoch.set(epoch.get() + 1);
    }
    Ok(slot.as_mut().expect("set above"))
}

impl Cuda {
    pub fn new(dev: Arc<CudaDevice>, inv_freq: Arc<CudaSlice<f32>>) -> Self {
        Cuda {
            dev,
            inv_freq,
            shared: RefCell::default(),
            err: RefCell::new(None),
            epoch: Cell::new(0),
        }
    }

    pub fn device(&self) -> &Arc<CudaDevice> {
        &self.dev
    }

    /// Bumped whenever a buffer is (re)allocated: a graph captured at another epoch points at
    /// freed memory.
    pub fn epoch(&self) -> u64 {
        self.epoch.get()
    }

    /// The first error an op met since the last call, if any.
    pub fn take_error(&self) -> Option<anyhow::Error> {
        self.err.borrow_mut().take()
    }

    /// Runs one op unless an earlier one failed; keeps its error.
    fn run(&self, what: &str, f: impl FnOnce() -> Result<()>) {
        if self.err.borrow().is_some() {
            return;
        }
        if let Err(e) = f() {
            *self.err.borrow_mut() = Some(e.context(format!("CUDA op {what}")));
        }
    }

    fn unsupported(&self, what: &str) {
        self.run(what, || bail!("not implemented on CUDA yet"));
    }

    fn stream(&self) -> &Arc<CudaStream> {
        self.dev.stream()
    }

    /// `buf` sized for `n` packed values it is about to be written with.
    fn out<'b>(&self, buf: &'b mut DevBuf, n: usize) -> Result<CudaViewMut<'b, f32>> {
        buf.view = None;
        Ok(grow(&self.dev, &self.epoch, &mut buf.mem, n)?.slice_mut(0..n))
    }

    /// The first `n` packed values of `buf`.
    fn inp<'b>(&self, buf: &'b DevBuf, n: usize) -> Result<CudaView<'b, f32>> {
        buf.packed(n)
    }

    /// The first `n` packed values of `buf`, which an op updates in place.
    fn in_place<'b>(&self, buf: &'b mut DevBuf, n: usize) -> Result<CudaViewMut<'b, f32>> {
        ensure!(buf.view.is_none(), "a strided buffer updated in place");
        let have = buf.capacity();
        match &mut buf.mem {
            Some(m) if have >= n => Ok(m.slice_mut(0..n)),
            _ => bail!("a buffer of {have} values updated for {n}"),
        }
    }

    /// Rows `r0 .. r0 + n` of `buf`, `width` values each: its own packed rows or the rows of
    /// the projection it views; with the row stride.
    fn rows<'b>(
        &'b self,
        buf: &'b DevBuf,
        r0: usize,
        n: usize,
        width: usize,
    ) -> Result<(Raw<'b>, usize)> {
        let s = match buf.view {
            Some(v) => {
                ensure!(
                    v.width == width,
                    "a projection piece of {} values read as {width}",
                    v.width
                );
                v
            }
            None => {
                let m = buf
                    .mem
                    .as_ref()
                    .ok_or_else(|| anyhow!("an empty buffer read"))?;
                ensure!(
                    m.len() >= (r0 + n) * width,
                    "a buffer of {} values read for {} rows of {width}",
                    m.len(),
                    r0 + n
                );
                let (p, _) = m.device_ptr(self.stream());
                Strided {
                    ptr: p,
                    stride: width,
                    width,
                }
            }
        };
        let len = if n == 0 {
            0
        } else {
            (n - 1) * s.stride + width
        };
        Ok((
            Raw {
                ptr: s.ptr + (r0 * s.stride * 4) as u64,
                len,
                stream: self.stream(),
            },
            s.stride,
        ))
    }

    /// Makes the attention scratch fit `dims` over a cache of `capacity` rows.
    fn size_attn_scratch(&self, sh: &mut Shared, dims: AttnDims, capacity: usize) -> Result<()> {
        if sh
            .attn
            .as_ref()
            .is_none_or(|(d, cap, _)| *d != dims || *cap != capacity)
        {
            sh.attn = Some((
                dims,
                capacity,
                AttnScratch::new(&self.dev, MAX_ROWS, dims, capacity)?,
            ));
            self.epoch.set(self.epoch.get() + 1);
        }
        Ok(())
    }

    /// Copies `t` packed rows of `k`, `v` ([t, n_kv·hd]) to cache rows `at ..`.
    fn store_kv(
        &self,
        cache: &mut DevKv,
        at: usize,
        t: usize,
        heads: AttnHeads,
        k: &DevBuf,
        v: &DevBuf,
    ) -> Result<()> {
        let w = heads.n_kv * heads.head_dim;
        ensure!(
            at + t <= cache.capacity,
            "{at} + {t} K/V rows exceed the cache's {} rows",
            cache.capacity
        );
        let (kv, vv) = (self.inp(k, t * w)?, self.inp(v, t * w)?);
        let (kc, vc) = cache.kv()?;
        self.dev
            .copy(&kv, &mut kc.slice_mut(at * w..(at + t) * w))?;
        self.dev
            .copy(&vv, &mut vc.slice_mut(at * w..(at + t) * w))?;
        Ok(())
    }

    /// Uploads `accepted` for the commit replay unless the device already holds that list.
    fn upload_accepted(&self, sh: &mut Shared, accepted: &[usize]) -> Result<()> {
        if sh.accepted.is_some() && sh.accepted_host == accepted {
            return Ok(());
        }
        ensure!(
            accepted.len() <= MAX_ROWS,
            "{} accepted rows: a replayed commit takes at most {MAX_ROWS}",
            accepted.len()
        );
        sh.accepted_i32.clear();
        sh.accepted_i32.extend(accepted.iter().map(|&a| a as i32));
        let buf = grow(&self.dev, &self.epoch, &mut sh.accepted, MAX_ROWS)?;
        self.dev
            .upload_into(&sh.accepted_i32, &mut buf.slice_mut(0..accepted.len()))?;
        sh.accepted_host.clear();
        sh.accepted_host.extend_from_slice(accepted);
        Ok(())
    }
}

impl Backend for Cuda {
    type Buf = DevBuf;
    type Linear = DevLinear;
    type Vector = CudaSlice<f32>;
    type KvCache = DevKv;
    type GdnState = DevGdn;
    type Rows = DevRows;

    fn linear_dims(&self, w: &DevLinear) -> (usize, usize) {
        w.dims()
    }

    fn vector_len(&self, v: &CudaSlice<f32>) -> usize {
        v.len()
    }

    fn set_rows(
        &self,
        rows: &mut DevRows,
        tokens: &[u32],
        tree: &TreeBatch,
        committed: usize,
        rotary: Option<RotaryFill<'_>>,
    ) {
        // The rotary values come from the positions and the model's frequencies on the device.
        let offset = rotary.map_or(0, |r| r.offset);
        self.run("set_rows", || {
            let t = tokens.len();
            let chain = tree.is_chain();
            ensure!(
                tree.len() == t,
                "{t} tokens but the tree has {} rows",
                tree.len()
            );
            ensure!(
                chain || t <= MAX_ROWS,
                "a tree pass on CUDA takes at most {MAX_ROWS} rows, not {t}"
            );
            let first = t.min(MAX_ROWS);
            let pieces = t.div_ceil(MAX_ROWS);
            if rows.bufs.as_ref().is_none_or(|b| b.ids.len() < t) {
                let n = t.max(MAX_ROWS);
                rows.bufs = Some(RowBufs {
                    ids: self.dev.alloc_zeros(n)?,
                    pos: self.dev.alloc_zeros(n)?,
                    parents: self.dev.alloc_zeros(MAX_ROWS)?,
                    anc: self.dev.alloc_zeros(MAX_ROWS)?,
                    slots: self.dev.alloc_zeros(n.div_ceil(MAX_ROWS))?,
                });
                self.epoch.set(self.epoch.get() + 1);
            }
            let DevRows {
                bufs,
                host_i32: h,
                host_u64: h64,
                ..
            } = rows;
            let b = bufs.as_mut().expect("made above");
            let dev = &self.dev;
            h.clear();
            h.extend(tokens.iter().map(|&x| x as i32));
            dev.upload_into(h, &mut b.ids.slice_mut(0..t))?;
            h.clear();
            h.extend((0..t).map(|i| (offset + committed + tree.depth(i) as usize) as i32));
            dev.upload_into(h, &mut b.pos.slice_mut(0..t))?;
            h.clear();
            h.extend_from_slice(&tree.parents()[..first]);
            dev.upload_into(h, &mut b.parents.slice_mut(0..first))?;
            h64.clear();
            for i in 0..first {
                let mut bits = 0u64;
                for j in 0..=i {
                    if tree.is_ancestor_or_self(j, i) {
                        bits |= 1 << j;
                    }
                }
                h64.push(bits);
            }
            dev.upload_into(h64, &mut b.anc.slice_mut(0..first))?;
            h.clear();
            h.extend((0..pieces).map(|p| (committed + p * MAX_ROWS) as i32));
            dev.upload_into(h, &mut b.slots.slice_mut(0..pieces))?;
            rows.t = t;
            rows.chain = chain;
            Ok(())
        });
    }

    fn embed_rows(&self, table: &DevLinear, rows: &DevRows, out: &mut DevBuf) {
        self.run("embed", || {
            let m = table.own()?;
            let t = rows.t;
            let ids = rows.bufs()?.ids.slice(0..t);
            self.dev.embed(m, &ids, &mut self.out(out, t * m.cols)?)?;
            Ok(())
        });
    }

    fn embed(&self, table: &DevLinear, tokens: &[u32], out: &mut DevBuf) {
        self.run("embed", || {
            let m = table.own()?;
            let t = tokens.len();
            let mut sh = self.shared.borrow_mut();
            let ids = grow(&self.dev, &self.epoch, &mut sh.ids, t)?;
            let host: Vec<i32> = tokens.iter().map(|&x| x as i32).collect();
            self.dev.upload_into(&host, &mut ids.slice_mut(0..t))?;
            self.dev
                .embed(m, &ids.slice(0..t), &mut self.out(out, t * m.cols)?)?;
            Ok(())
        });
    }

    fn fill_from_host(&self, out: &mut DevBuf, n: usize, fill: &mut dyn FnMut(&mut [f32])) {
        self.run("fill_from_host", || {
            let mut host = vec![0.0f32; n];
            fill(&mut host);
            self.dev.upload_into(&host, &mut self.out(out, n)?)?;
            Ok(())
        });
    }

    fn read_rows(&self, buf: &DevBuf, row0: usize, n: usize, width: usize, out: &mut [f32]) {
        self.run("read_rows", || {
            let all = buf.packed((row0 + n) * width)?;
            self.dev
                .download_into(&all.slice(row0 * width..(row0 + n) * width), out)?;
            Ok(())
        });
    }

    fn add_inplace(&self, h: &mut DevBuf, add: &DevBuf, n: usize) {
        self.run("add_inplace", || {
            let a = self.inp(add, n)?;
            self.dev.add_inplace(&mut self.in_place(h, n)?, &a)?;
            Ok(())
        });
    }

    fn rms_norm_rows(
        &self,
        x: &DevBuf,
        row0: usize,
        n: usize,
        w: &CudaSlice<f32>,
        eps: f32,
        out: &mut DevBuf,
    ) {
        self.run("rms_norm_rows", || {
            let width = w.len();
            let all = self.inp(x, (row0 + n) * width)?;
            self.dev.rms_norm(
                &all.slice(row0 * width..(row0 + n) * width),
                w,
                eps,
                &mut self.out(out, n * width)?,
            )?;
            Ok(())
        });
    }

    fn rms_norm_groups_inplace(&self, x: &mut DevBuf, n: usize, w: &CudaSlice<f32>, eps: f32) {
        self.run("rms_norm_groups_inplace", || {
            self.dev
                .rms_norm_inplace(&mut self.in_place(x, n)?, w, eps)?;
            Ok(())
        });
    }

    fn linear_at(
        &self,
        x: &DevBuf,
        row0: usize,
        t: usize,
        w: &DevLinear,
        bias: Option<&CudaSlice<f32>>,
        y: &mut DevBuf,
    ) {
        self.run("linear", || {
            let m = w.own()?;
            let all = self.inp(x, (row0 + t) * m.cols)?;
            self.dev.linear(
                &all.slice(row0 * m.cols..(row0 + t) * m.cols),
                t,
                m,
                bias,
                &mut self.out(y, t * m.rows)?,
            )?;
            Ok(())
        });
    }

    fn add_norm(
        &self,
        h: &mut DevBuf,
        add: Option<&DevBuf>,
        norm: &CudaSlice<f32>,
        eps: f32,
        t: usize,
        x: &mut DevBuf,
    ) {
        self.run("add_norm", || {
            let n = t * norm.len();
            let mut hv = self.in_place(h, n)?;
            match add {
                Some(a) => {
                    let a = self.inp(a, n)?;
                    self.dev
                        .add_rms_norm(&mut hv, &a, norm, eps, &mut self.out(x, n)?)?
                }
                None => self.dev.rms_norm(&hv, norm, eps, &mut self.out(x, n)?)?,
            }
            Ok(())
        });
    }

    fn add_norm_linears(
        &self,
        h: &mut DevBuf,
        add: Option<&DevBuf>,
        norm: &CudaSlice<f32>,
        eps: f32,
        t: usize,
        x: &mut DevBuf,
        ws: &[&DevLinear],
        biases: &[Option<&CudaSlice<f32>>],
        outs: &mut [&mut DevBuf],
    ) {
        self.add_norm(h, add, norm, eps, t, x);
        self.run("add_norm_linears", || {
            ensure!(
                ws.len() == outs.len() && ws.len() == biases.len(),
                "{} weights, {} biases, {} outputs",
                ws.len(),
                biases.len(),
                outs.len()
            );
            let cols = norm.len();
            let xv = self.inp(x, t * cols)?;
            if let Some(stack) = DevLinear::whole_stack(ws) {
                let StackKind::Rows(m) = &stack.kind else {
                    bail!("gate|up interleaved for SwiGLU read as separate projections");
                };
                let total = m.rows;
                let (first, rest) = outs
                    .split_first_mut()
                    .ok_or_else(|| anyhow!("no outputs"))?;
                self.dev.linear(
                    &xv,
                    t,
                    m,
                    stack.bias.as_ref(),
                    &mut self.out(first, t * total)?,
                )?;
                let base = first
                    .mem
                    .as_ref()
                    .expect("sized above")
                    .device_ptr(self.stream())
                    .0;
                let mut col = 0;
                for (i, o) in std::iter::once(&mut **first)
                    .chain(rest.iter_mut().map(|o| &mut **o))
                    .enumerate()
                {
                    let width = stack.widths[i];
                    o.view = Some(Strided {
                        ptr: base + (col * 4) as u64,
                        stride: total,
                        width,
                    });
                    col += width;
                }
                return Ok(());
            }
            for ((w, b), o) in ws.iter().zip(biases).zip(outs.iter_mut()) {
                let m = w.own()?;
                self.dev
                    .linear(&xv, t, m, *b, &mut self.out(o, t * m.rows)?)?;
            }
            Ok(())
        });
    }

    fn add_norm_mlp(
        &self,
        h: &mut DevBuf,
        add: Option<&DevBuf>,
        norm: &CudaSlice<f32>,
        eps: f32,
        t: usize,
        x: &mut DevBuf,
        [gate, up, down]: [&DevLinear; 3],
        g: &mut DevBuf,
        u: &mut DevBuf,
        z: &mut DevBuf,
    ) {
        self.add_norm(h, add, norm, eps, t, x);
        self.run("mlp", || {
            let xv = self.inp(x, t * norm.len())?;
            let (inter, _) = gate.dims();
            match DevLinear::whole_stack(&[gate, up]).map(|s| &s.kind) {
                // GEMV with the SwiGLU epilogue: no [t, 2I] round trip.
                Some(StackKind::GateUp(gu)) => {
                    self.dev
                        .linear_swiglu(&xv, t, gu, None, &mut self.out(g, t * inter)?)?
                }
                Some(StackKind::Rows(m)) => {
                    self.dev
                        .linear(&xv, t, m, None, &mut self.out(u, t * 2 * inter)?)?;
                    let uv = self.inp(u, t * 2 * inter)?;
                    self.dev
                        .swiglu_pair(&uv, t, inter, &mut self.out(g, t * inter)?)?;
                }
                None => {
                    let (gm, um) = (gate.own()?, up.own()?);
                    self.dev
                        .linear(&xv, t, gm, None, &mut self.out(g, t * inter)?)?;
                    self.dev
                        .linear(&xv, t, um, None, &mut self.out(u, t * inter)?)?;
                    let uv = self.inp(u, t * inter)?;
                    self.dev.swiglu(&mut self.in_place(g, t * inter)?, &uv)?;
                }
            }
            let dm = down.own()?;
            let gv = self.inp(g, t * inter)?;
            self.dev
                .linear(&gv, t, dm, None, &mut self.out(z, t * dm.rows)?)?;
            Ok(())
        });
    }

    fn swiglu_inplace(&self, gate: &mut DevBuf, up: &DevBuf, n: usize) {
        self.run("swiglu", || {
            let uv = self.inp(up, n)?;
            self.dev.swiglu(&mut self.in_place(gate, n)?, &uv)?;
            Ok(())
        });
    }

    fn split_query_gate(
        &self,
        qg: &DevBuf,
        rows: usize,
        hd: usize,
        q: &mut DevBuf,
        gate: &mut DevBuf,
    ) {
        self.run("split_query_gate", || {
            let src = self.inp(qg, rows * 2 * hd)?;
            self.dev.split_q_gate(
                &src,
                hd,
                &mut self.out(q, rows * hd)?,
                &mut self.out(gate, rows * hd)?,
            )?;
            Ok(())
        });
    }

    fn copy(&self, src: &DevBuf, n: usize, dst: &mut DevBuf) {
        self.run("copy", || {
            let s = self.inp(src, n)?;
            self.dev.copy(&s, &mut self.out(dst, n)?)?;
            Ok(())
        });
    }

    fn rope_inplace(
        &self,
        x: &mut DevBuf,
        t: usize,
        heads: usize,
        head_dim: usize,
        rot_dim: usize,
        cos_sin: &DevBuf,
    ) {
        // A model's own layers rotate from positions (`attention_core`); a host table is a
        // drafter's (DFlash: its own θ, its own positions).
        self.run("rope_inplace", || {
            let cs = self.inp(cos_sin, t * rot_dim)?;
            self.dev.rope_neox_table(
                &mut self.in_place(x, t * heads * head_dim)?,
                t,
                heads,
                head_dim,
                rot_dim,
                &cs,
            )?;
            Ok(())
        });
    }

    fn attention(
        &self,
        _: &mut DevKv,
        _: usize,
        _: &TreeBatch,
        _: AttnHeads,
        _: &DevBuf,
        _: &DevBuf,
        _: &DevBuf,
        _: &mut DevBuf,
    ) {
        self.unsupported("attention over a host tree (use attention_core)");
    }

    fn attention_core(
        &self,
        cache: &mut DevKv,
        rows: &DevRows,
        c: AttnCore<'_, Self>,
        qg: &mut DevBuf,
        k: &mut DevBuf,
        v: &DevBuf,
        _q: &mut DevBuf,
        _gate: &mut DevBuf,
        o: &mut DevBuf,
    ) {
        self.run("attention_core", || {
            let AttnHeads {
                n_heads: nh,
                n_kv: nkv,
                head_dim: hd,
            } = c.heads;
            let dims = AttnDims {
                n_heads: nh,
                n_kv: nkv,
                head_dim: hd,
            };
            let qw = nh * hd * if c.gated { 2 } else { 1 };
            let kvw = nkv * hd;
            let b = rows.bufs()?;
            let t = rows.t;
            let mut sh = self.shared.borrow_mut();
            let sh = &mut *sh;
            grow(&self.dev, &self.epoch, &mut sh.q, MAX_ROWS * nh * hd)?;
            grow(&self.dev, &self.epoch, &mut sh.gate, MAX_ROWS * nh * hd)?;
            self.size_attn_scratch(sh, dims, cache.capacity)?;
            let (Some(qs), Some(gs), Some((_, _, scratch))) =
                (&mut sh.q, &mut sh.gate, &mut sh.attn)
            else {
                unreachable!("made above")
            };
            let capacity = cache.capacity;
            let (kc, vc) = cache.kv()?;
            let mut ov = self.out(o, t * nh * hd)?;
            for (pi, (r0, n)) in rows.pieces().enumerate() {
                let qn = n * nh * hd;
                let (qv, q_stride) = self.rows(qg, r0, n, qw)?;
                let (kv, k_stride) = self.rows(k, r0, n, kvw)?;
                let (vv, v_stride) = self.rows(v, r0, n, kvw)?;
                let pos = b.pos.slice(r0..r0 + n);
                let committed = b.slots.slice(pi..pi + 1);
                let sources = crate::AttnPrepSources {
                    q: (&qv, q_stride),
                    k: (&kv, k_stride),
                    v: (&vv, v_stride),
                    q_norm: c.q_norm,
                    k_norm: c.k_norm,
                    pos: &pos,
                    inv_freq: &self.inv_freq,
                    committed: &committed,
                };
                let mut gate_out = gs.slice_mut(0..if c.gated { qn } else { 0 });
                self.dev.attn_prep(
                    n,
                    dims,
                    c.rot_dim,
                    c.eps,
                    &sources,
                    &mut qs.slice_mut(0..qn),
                    c.gated
                        .then_some(&mut gate_out as &mut dyn cudarc::driver::DevicePtrMut<f32>),
                    kc,
                    vc,
                )?;
                let gate_view = gs.slice(0..qn);
                let o0 = r0 * nh * hd;
                self.dev.attention_tree_gated(
                    &qs.slice(0..qn),
                    kc,
                    vc,
                    &committed,
                    n,
                    &b.anc.slice(0..n),
                    1,
                    dims,
                    1.0 / (hd as f32).sqrt(),
                    capacity,
                    scratch,
                    c.gated
                        .then_some(&gate_view as &dyn cudarc::driver::DevicePtr<f32>),
                    &mut ov.slice_mut(o0..o0 + qn),
                )?;
            }
            Ok(())
        });
    }

    fn new_kv_cache(&self, heads: AttnHeads, capacity: usize) -> DevKv {
        match DevKv::new(&self.dev, heads.n_kv, heads.head_dim, capacity) {
            Ok(c) => c,
            Err(e) => {
                self.run("new_kv_cache", || Err(e));
                DevKv {
                    k: None,
                    v: None,
                    capacity: 0,
                }
            }
        }
    }

    fn write_kv(
        &self,
        cache: &mut DevKv,
        at: usize,
        t: usize,
        heads: AttnHeads,
        k: &DevBuf,
        v: &DevBuf,
    ) {
        self.run("write_kv", || self.store_kv(cache, at, t, heads, k, v));
    }

    fn attention_block(
        &self,
        cache: &mut DevKv,
        committed: usize,
        t: usize,
        heads: AttnHeads,
        mask: BlockMask,
        q: &DevBuf,
        k: &DevBuf,
        v: &DevBuf,
        o: &mut DevBuf,
    ) {
        self.run("attention_block", || {
            // The block's K/V after the committed rows (pending: the next block overwrites
            // them), then tree attention in which every block row is every row's ancestor
            // (causal: every earlier row). A window would hide committed rows, which the tree
            // kernel always shows.
            ensure!(
                (1..=MAX_ROWS).contains(&t),
                "a block of {t} rows (1 to {MAX_ROWS} on CUDA)"
            );
            ensure!(
                mask.window.is_none(),
                "sliding-window drafter layers do not run on CUDA"
            );
            self.store_kv(cache, committed, t, heads, k, v)?;
            let AttnHeads {
                n_heads: nh,
                n_kv: nkv,
                head_dim: hd,
            } = heads;
            let dims = AttnDims {
                n_heads: nh,
                n_kv: nkv,
                head_dim: hd,
            };
            let mut sh = self.shared.borrow_mut();
            let sh = &mut *sh;
            self.size_attn_scratch(sh, dims, cache.capacity)?;
            let all = (1u64 << t) - 1;
            sh.block_host.clear();
            sh.block_host.extend((0..t).map(|i| {
                if mask.causal {
                    u64::MAX >> (63 - i)
                } else {
                    all
                }
            }));
            let anc = grow(&self.dev, &self.epoch, &mut sh.block_anc, MAX_ROWS)?;
            self.dev
                .upload_into(&sh.block_host, &mut anc.slice_mut(0..t))?;
            let at = grow(&self.dev, &self.epoch, &mut sh.block_committed, 1)?;
            self.dev
                .upload_into(&[committed as i32], &mut at.slice_mut(0..1))?;
            let (Some((_, _, scratch)), Some(anc), Some(at)) =
                (&mut sh.attn, &sh.block_anc, &sh.block_committed)
            else {
                unreachable!("made above")
            };
            let capacity = cache.capacity;
            let (kc, vc) = cache.kv()?;
            let qv = self.inp(q, t * nh * hd)?;
            self.dev.attention_tree(
                &qv,
                kc,
                vc,
                &at.slice(0..1),
                t,
                &anc.slice(0..t),
                1,
                dims,
                1.0 / (hd as f32).sqrt(),
                capacity,
                scratch,
                &mut self.out(o, t * nh * hd)?,
            )?;
            Ok(())
        });
    }

    fn scale_inplace(&self, x: &mut DevBuf, n: usize, s: f32) {
        self.run("scale_inplace", || {
            self.dev.scale_inplace(&mut self.in_place(x, n)?, s)?;
            Ok(())
        });
    }

    fn sigmoid_gate_inplace(&self, o: &mut DevBuf, gate: &DevBuf, n: usize) {
        self.run("sigmoid_gate", || {
            let gv = self.inp(gate, n)?;
            self.dev.sigmoid_mul(&mut self.in_place(o, n)?, &gv)?;
            Ok(())
        });
    }

    fn gated_delta_rule(
        &self,
        st: &mut DevGdn,
        p: GdnParams<'_, Self>,
        rows: &DevRows,
        qkv: &mut DevBuf,
        b: &DevBuf,
        a: &DevBuf,
        _scratch: [&mut DevBuf; 2],
        o: &mut DevBuf,
    ) {
        self.run("gated_delta_rule", || {
            let GdnShape { hk, hv, dk, dv } = p.shape;
            let kc = p.conv_kernel;
            let (kd, vd) = (hk * dk, hv * dv);
            let c = 2 * kd + vd;
            let wl = (kc - 1) * c;
            let t = rows.t;
            let rb = rows.bufs()?;
            let fused = self.dev.options().fuse;
            let mut sh = self.shared.borrow_mut();
            let sh = &mut *sh;
            let gq = grow(&self.dev, &self.epoch, &mut sh.gdn_q, MAX_ROWS * kd)?;
            // The unfused path's conv output (`CudaOptions::fuse` false, for comparisons).
            let mut mc = if fused {
                None
            } else {
                Some(grow(&self.dev, &self.epoch, &mut sh.gdn_mc, MAX_ROWS * c)?)
            };
            let mut ov = self.out(o, t * vd)?;
            let DevGdn {
                s,
                conv,
                fin,
                spare,
                carry,
                pk,
                pv,
                pg,
                pb,
                pwin,
                ..
            } = st;
            let parents_all = &rb.parents;
            let qscale = 1.0 / (dk as f32).sqrt();
            let shape = p.shape;
            for (r0, n) in rows.pieces() {
                let cont = r0 > 0 || rows.cont;
                let (mv, ms) = self.rows(qkv, r0, n, c)?;
                let (bv, bs) = self.rows(b, r0, n, hv)?;
                let (av, as_) = self.rows(a, r0, n, hv)?;
                // A later piece of a chain starts from the previous (full) piece's last conv
                // window.
                if cont {
                    self.dev
                        .copy(&pwin.slice((MAX_ROWS - 1) * wl..MAX_ROWS * wl), carry)?;
                }
                let conv_state: &CudaSlice<f32> = if cont { carry } else { conv };
                let parents = parents_all.slice(0..n);
                let (mut gout, mut bout) = (pg.slice_mut(0..n * hv), pb.slice_mut(0..n * hv));
                // Both kernels read b and a at one stride (a fused projection's or both packed).
                ensure!(bs == as_, "b and a rows of different strides ({bs}, {as_})");
                let gate = GdnGateArgs {
                    braw: &bv,
                    araw: &av,
                    stride: bs,
                    neg_exp_a: p.neg_exp_a,
                    dt_bias: p.dt_bias,
                    g: &mut gout,
                    beta: &mut bout,
                };
                if let Some(mcb) = mc.as_deref_mut() {
                    self.dev.conv1d_tree_strided(
                        &mv,
                        c,
                        ms,
                        kc,
                        conv_state,
                        p.conv,
                        &parents,
                        n,
                        &mut mcb.slice_mut(0..n * c),
                        &mut pwin.slice_mut(0..n * wl),
                    )?;
                    self.dev.gdn_split_qkv_gate(
                        &mcb.slice(0..n * c),
                        n,
                        hk,
                        dk,
                        vd,
                        qscale,
                        L2_EPS,
                        &mut gq.slice_mut(0..n * kd),
                        &mut pk.slice_mut(0..n * kd),
                        &mut pv.slice_mut(0..n * vd),
                        Some(gate),
                    )?;
                } else {
                    // Conv, q/k norms, v and g/β in one launch, bit-identical to the unfused
                    // pair above; the conv output never goes to memory.
                    self.dev.gdn_conv_split_qkv_gate(
                        GdnConvArgs {
                            m: &mv,
                            m_stride: ms,
                            kernel: kc,
                            state: conv_state,
                            w: p.conv,
                            parents: &parents,
                            windows: &mut pwin.slice_mut(0..n * wl),
                        },
                        n,
                        hk,
                        dk,
                        vd,
                        qscale,
                        L2_EPS,
                        &mut gq.slice_mut(0..n * kd),
                        &mut pk.slice_mut(0..n * kd),
                        &mut pv.slice_mut(0..n * vd),
                        Some(gate),
                    )?;
                }
                let (q, k, v, gg, bb) = (
                    gq.slice(0..n * kd),
                    pk.slice(0..n * kd),
                    pv.slice(0..n * vd),
                    pg.slice(0..n * hv),
                    pb.slice(0..n * hv),
                );
                let gr = GdnDeviceRows {
                    q: &q,
                    k: &k,
                    v: &v,
                    g: &gg,
                    beta: &bb,
                };
                let o0 = r0 * vd;
                let mut op = ov.slice_mut(o0..o0 + n * vd);
                // Buffers are copied, never swapped: a captured graph keeps their addresses.
                if !cont && n == 1 && dk.is_multiple_of(32) && dk <= 256 {
                    // One row (a decode step): the step kernel streams S₀ → fin at the
                    // bandwidth instead of the solve's phases.
                    self.dev.gdn_step(shape, &gr, s, fin, &mut op)?;
                } else if !cont {
                    // Only a chain's final state can be committed (the commit copies it); a
                    // tree's commit replays the accepted rows, so its final state is not
                    // computed.
                    let f = if rows.chain { Some(&mut *fin) } else { None };
                    self.dev
                        .gdn_tree_verify(shape, n, &gr, &parents, s, &mut op, f)?;
                } else {
                    // Continue from the previous piece's final state.
                    self.dev
                        .gdn_tree_verify(shape, n, &gr, &parents, fin, &mut op, Some(spare))?;
                    self.dev.copy(spare, fin)?;
                }
            }
            Ok(())
        });
    }

    fn gated_rms_norm_inplace(
        &self,
        o: &mut DevBuf,
        z: &DevBuf,
        n: usize,
        w: &CudaSlice<f32>,
        eps: f32,
    ) {
        self.run("gated_rms_norm", || {
            let dv = w.len();
            ensure!(
                dv > 0 && n.is_multiple_of(dv),
                "{n} values in groups of {dv}"
            );
            // Packed z: every group a row of its own; a projection's view: its rows' heads.
            let (heads, width) = match z.view {
                Some(v) => (v.width / dv, v.width),
                None => (1, dv),
            };
            let rows_n = n / (heads * dv);
            let (zv, zs) = self.rows(z, 0, rows_n, width)?;
            self.dev
                .rms_norm_gated_strided(&mut self.in_place(o, n)?, &zv, heads, zs, w, eps)?;
            Ok(())
        });
    }

    fn commit_kv(&self, cache: &mut DevKv, committed: usize, accepted: &[usize]) {
        self.run("commit_kv", || {
            let capacity = cache.capacity.max(1);
            let (kc, vc) = cache.kv()?;
            let stride = kc.len() / capacity;
            for (i, &a) in accepted.iter().enumerate() {
                if a != i {
                    // Sources increase and a ≥ i: copying in order never clobbers a later
                    // source.
                    for c in [&mut *kc, &mut *vc] {
                        let (src, dst) = (committed + a, committed + i);
                        let (mut lo, hi) = c.split_at_mut(src * stride);
                        self.dev.copy(
                            &hi.slice(0..stride),
                            &mut lo.slice_mut(dst * stride..(dst + 1) * stride),
                        )?;
                    }
                }
            }
            Ok(())
        });
    }

    fn commit_gdn(&self, st: &mut DevGdn, shape: GdnShape, accepted: &[usize], whole: bool) {
        self.run("commit_gdn", || {
            let n = accepted.len();
            if n == 0 {
                return Ok(());
            }
            ensure!(
                !st.pend_multi || whole,
                "a pass of more than {MAX_ROWS} rows can only be committed whole on CUDA"
            );
            let GdnShape { hk, hv, dk, dv } = shape;
            let (kd, vd) = (hk * dk, hv * dv);
            let wl = st.pwin.len() / MAX_ROWS;
            // Row of the pending buffers that holds the last accepted row's conv window.
            let last = if st.pend_multi {
                st.pend_rows - 1
            } else {
                accepted[n - 1]
            };
            // Copies, not swaps: captured graphs keep the buffers' addresses.
            if whole {
                self.dev.copy(&st.fin, &mut st.s)?;
            } else {
                // Replay: the accepted rows, compacted, form a chain from S; its final state
                // becomes S.
                let mut sh = self.shared.borrow_mut();
                let sh = &mut *sh;
                self.upload_accepted(sh, accepted)?;
                if sh.chain_parents.is_none() {
                    let chain: Vec<i32> = (0..MAX_ROWS as i32).map(|i| i - 1).collect();
                    sh.chain_parents = Some(self.dev.upload(&chain)?);
                    self.epoch.set(self.epoch.get() + 1);
                }
                let e = &self.epoch;
                grow(&self.dev, e, &mut sh.ck, MAX_ROWS * kd)?;
                grow(&self.dev, e, &mut sh.cv, MAX_ROWS * vd)?;
                grow(&self.dev, e, &mut sh.cg, MAX_ROWS * hv)?;
                grow(&self.dev, e, &mut sh.cb, MAX_ROWS * hv)?;
                grow(&self.dev, e, &mut sh.co, MAX_ROWS * vd)?;
                let (Some(idx), Some(cp), Some(ck), Some(cv), Some(cg), Some(cb), Some(co)) = (
                    &sh.accepted,
                    &sh.chain_parents,
                    &mut sh.ck,
                    &mut sh.cv,
                    &mut sh.cg,
                    &mut sh.cb,
                    &mut sh.co,
                ) else {
                    unreachable!("made above")
                };
                let idx = idx.slice(0..n);
                let t = MAX_ROWS;
                for (src, len, dst) in [
                    (&st.pk, kd, &mut *ck),
                    (&st.pv, vd, &mut *cv),
                    (&st.pg, hv, &mut *cg),
                    (&st.pb, hv, &mut *cb),
                ] {
                    self.dev.gather_rows(
                        &src.slice(0..t * len),
                        &idx,
                        len,
                        &mut dst.slice_mut(0..n * len),
                    )?;
                }
                let (k, v, g, b) = (
                    ck.slice(0..n * kd),
                    cv.slice(0..n * vd),
                    cg.slice(0..n * hv),
                    cb.slice(0..n * hv),
                );
                let rows = GdnDeviceRows {
                    q: &k,
                    k: &k,
                    v: &v,
                    g: &g,
                    beta: &b,
                };
                self.dev.gdn_tree_verify(
                    shape,
                    n,
                    &rows,
                    &cp.slice(0..n),
                    &st.s,
                    &mut co.slice_mut(0..n * vd),
                    Some(&mut st.spare),
                )?;
                self.dev.copy(&st.spare, &mut st.s)?;
            }
            self.dev
                .copy(&st.pwin.slice(last * wl..(last + 1) * wl), &mut st.conv)
                .context("the conv window")?;
            Ok(())
        });
    }
}
