//! Per-sequence state under the pending-suffix → commit contract (DESIGN §4).
//!
//! A forward pass leaves a **pending suffix** and changes nothing committed:
//! - attention: K/V of the T rows are written after the committed rows;
//! - Gated DeltaNet: the committed state S and conv state are only read; the pass keeps each
//!   row's k, v, g, β and conv window, and for a chain also the state after its last row.
//!
//! `Model::commit(state, accepted)` makes a root-anchored chain of rows permanent: K/V rows are
//! compacted down, GDN states take the chain's final state (whole chain) or replay the accepted
//! rows (any other path), and the conv state takes the last accepted row's window.

use yomi_core::TreeBatch;
use yomi_core::backend::Backend;
use yomi_cpu::backend::Cpu;

use crate::config::{LayerKind, ModelConfig};
use yomi_cpu::attention::KEY_TILE;
use yomi_cpu::kv_cache::{KvDtype, KvRows};
pub use yomi_cpu::layer_state::{AttnCache, GdnState};

/// One layer's sequence state, in the storage of the backend that runs the layer.
pub enum LayerState<B: Backend = Cpu> {
    Attention(B::KvCache),
    Gdn(B::GdnState),
}

/// What the last forward pass left pending (buffers reused from pass to pass).
pub struct Pending {
    pub tree: TreeBatch,
    /// Tokens of the pending rows.
    pub tokens: Vec<u32>,
    pub active: bool,
}

/// The recurrent part of a state at one committed length: every Gated DeltaNet layer's
/// recurrent state S and conv window, in layer order. A GDN state cannot be truncated, so a
/// prefix of a sequence can only be resumed from a snapshot taken at exactly that length.
#[derive(Clone, Debug, PartialEq)]
pub struct RecurrentSnapshot {
    len: usize,
    /// Per GDN layer: S, then the conv window.
    data: Vec<f32>,
}

impl RecurrentSnapshot {
    /// The committed length the snapshot was taken at.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it was taken at length 0.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Heap bytes held.
    pub fn size_bytes(&self) -> usize {
        self.data.len() * std::mem::size_of::<f32>()
    }

    /// The values: per GDN layer S, then the conv window ([`crate::Accelerator::read_recurrent`]'s
    /// layout).
    pub fn values(&self) -> &[f32] {
        &self.data
    }

    /// A snapshot at committed length `len` from values in [`RecurrentSnapshot::values`]' layout.
    pub fn from_values(len: usize, data: Vec<f32>) -> Self {
        RecurrentSnapshot { len, data }
    }
}

/// f32 rows per attention layer and KV head: `x[a][h]` is [rows, head_dim].
pub type HeadRows = Vec<Vec<Vec<f32>>>;

/// Committed attention K/V rows of a prefix, per attention layer and KV head ([rows, hd]
/// each), as copied out of a [`State`]. Attention K/V is prefix-shareable: the first n rows
/// serve any sequence that starts with the same n tokens.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct KvPrefix {
    rows: usize,
    /// [attention layer][KV head].
    k: Vec<Vec<KvRows>>,
    v: Vec<Vec<KvRows>>,
}

impl KvPrefix {
    /// Rows held.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Heap bytes held.
    pub fn size_bytes(&self) -> usize {
        self.k
            .iter()
            .chain(&self.v)
            .flatten()
            .map(KvRows::size_bytes)
            .sum()
    }

    /// The element type of the rows held (None when empty of layers).
    fn dtype(&self) -> Option<KvDtype> {
        self.k.first().and_then(|l| l.first()).map(KvRows::dtype)
    }

    /// A prefix of `rows` f32 rows from `k[a][h]` / `v[a][h]` ([rows, head_dim] per attention
    /// layer a and KV head h).
    pub fn from_f32(rows: usize, k: HeadRows, v: HeadRows) -> Self {
        let wrap = |x: Vec<Vec<Vec<f32>>>| -> Vec<Vec<KvRows>> {
            x.into_iter()
                .map(|l| l.into_iter().map(KvRows::F32).collect())
                .collect()
        };
        KvPrefix {
            rows,
            k: wrap(k),
            v: wrap(v),
        }
    }

    /// The rows as f32, `(k[a][h], v[a][h])` ([rows, head_dim] each).
    pub fn to_f32(&self) -> (HeadRows, HeadRows) {
        let unwrap = |x: &[Vec<KvRows>]| -> Vec<Vec<Vec<f32>>> {
            x.iter()
                .map(|l| l.iter().map(|r| r.to_f32(0..r.len())).collect())
                .collect()
        };
        (unwrap(&self.k), unwrap(&self.v))
    }

    /// Drops rows past `rows`.
    pub fn truncate(&mut self, rows: usize) {
        if rows >= self.rows {
            return;
        }
        for (k, v) in self.k.iter_mut().flatten().zip(self.v.iter_mut().flatten()) {
            let hd = k.len() / self.rows.max(1);
            k.truncate(rows * hd);
            v.truncate(rows * hd);
        }
        self.rows = rows;
    }
}

pub struct State {
    pub(crate) committed: usize,
    pub(crate) capacity: usize,
    pub(crate) layers: Vec<LayerState>,
    pub(crate) pending: Pending,
    /// Committed token ids (the prefix the state represents).
    pub(crate) tokens: Vec<u32>,
    pub(crate) scratch: crate::model::Scratch<Cpu>,
    /// The per-row inputs of the CPU's last pass.
    pub(crate) rows: yomi_cpu::backend::PassRows,
    /// The device state when the model runs on an accelerator (made on the first pass).
    pub(crate) accel: Option<Box<dyn crate::accel::AccelState>>,
    /// The device state must be zeroed before the next pass ([`State::reset`] has no device).
    pub(crate) accel_reset: bool,
    /// Made by a model with an accelerator ([`crate::Model::new_state`]): passes run there.
    pub(crate) on_device: bool,
    /// That accelerator, for the prefix copies of a device state (snapshots, K/V rows, resume).
    pub(crate) device: Option<std::sync::Arc<dyn crate::accel::Accelerator>>,
}

impl State {
    /// A fresh state for up to `capacity` tokens, with K/V caches of element type `kv`. The KV
    /// cache is allocated zeroed up front; the OS maps its pages lazily, so unused context
    /// costs no resident memory.
    pub fn new(cfg: &ModelConfig, capacity: usize, kv: KvDtype) -> Self {
        let layers = cfg
            .layer_kinds
            .iter()
            .map(|k| match k {
                LayerKind::Attention => LayerState::Attention(AttnCache::new(
                    kv,
                    cfg.num_kv_heads,
                    cfg.head_dim,
                    capacity,
                )),
                LayerKind::GatedDeltaNet => {
                    let g = cfg
                        .gdn
                        .expect("validated config: GDN layers have a GdnConfig");
                    let sl = g.num_value_heads * g.key_head_dim * g.value_head_dim;
                    LayerState::Gdn(GdnState {
                        s: vec![0.0; sl],
                        conv: vec![0.0; (g.conv_kernel - 1) * g.conv_dim()],
                        pend_final: vec![0.0; sl],
                        pend_k: Vec::new(),
                        pend_v: Vec::new(),
                        pend_g: Vec::new(),
                        pend_beta: Vec::new(),
                        pend_windows: Vec::new(),
                    })
                }
            })
            .collect();
        State {
            committed: 0,
            capacity,
            layers,
            pending: Pending {
                tree: TreeBatch::chain(0),
                tokens: Vec::new(),
                active: false,
            },
            tokens: Vec::with_capacity(capacity),
            scratch: Default::default(),
            rows: Default::default(),
            accel: None,
            accel_reset: false,
            on_device: false,
            device: None,
        }
    }

    /// Number of committed tokens.
    pub fn committed(&self) -> usize {
        self.committed
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// The committed token ids.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    pub fn pending(&self) -> Option<&Pending> {
        self.pending.active.then_some(&self.pending)
    }

    /// Forgets everything: back to an empty sequence (recurrent and conv states zeroed).
    pub fn reset(&mut self) {
        self.committed = 0;
        self.pending.active = false;
        self.tokens.clear();
        for l in &mut self.layers {
            if let LayerState::Gdn(g) = l {
                g.s.fill(0.0);
                g.conv.fill(0.0);
            }
        }
        self.accel_reset = self.accel.is_some();
    }

    /// Whether the state lives on a device (its model has an accelerator). Snapshots, K/V
    /// copies and resuming then go through the accelerator's prefix copies.
    pub fn is_accelerated(&self) -> bool {
        self.on_device
    }

    /// The accelerator of a device state, if it copies prefixes (else a clear error).
    fn prefix_device(&self) -> anyhow::Result<&std::sync::Arc<dyn crate::accel::Accelerator>> {
        match &self.device {
            Some(d) if d.supports_prefix_copies() => Ok(d),
            Some(d) => anyhow::bail!("{} does not copy prefixes", d.describe()),
            None => anyhow::bail!("a device state without its accelerator"),
        }
    }

    /// The device state, made (or lazily reset) now if no pass has done it yet.
    fn ready_device_state(&mut self) -> anyhow::Result<&mut dyn crate::accel::AccelState> {
        let dev = self.prefix_device()?.clone();
        if self.accel.is_none() {
            self.accel = Some(dev.new_state(self.capacity)?);
            self.accel_reset = false;
        }
        let ds = self.accel.as_deref_mut().expect("made above");
        if self.accel_reset {
            dev.reset(ds)?;
            self.accel_reset = false;
        }
        Ok(ds)
    }

    /// Whether the model has recurrent (Gated DeltaNet) layers, whose state can only be
    /// resumed from a [`RecurrentSnapshot`] taken at the exact length.
    pub fn has_recurrent_layers(&self) -> bool {
        self.layers.iter().any(|l| matches!(l, LayerState::Gdn(_)))
    }

    /// Bytes one token takes in the attention caches (K and V of every attention layer).
    pub fn kv_bytes_per_token(&self) -> usize {
        self.layers
            .iter()
            .map(|l| match l {
                LayerState::Attention(c) => c.row_bytes(),
                LayerState::Gdn(_) => 0,
            })
            .sum()
    }

    /// Bytes a [`RecurrentSnapshot`] of this state takes.
    pub fn recurrent_snapshot_bytes(&self) -> usize {
        let n: usize = self
            .layers
            .iter()
            .map(|l| match l {
                LayerState::Gdn(g) => g.s.len() + g.conv.len(),
                LayerState::Attention(_) => 0,
            })
            .sum();
        n * std::mem::size_of::<f32>()
    }

    /// Copies the committed recurrent and conv states (the pending suffix is ignored); from
    /// the device for a device state.
    pub fn snapshot_recurrent(&self) -> anyhow::Result<RecurrentSnapshot> {
        let n = self.recurrent_snapshot_bytes() / 4;
        let mut data = Vec::with_capacity(n);
        if self.on_device {
            match self.accel.as_deref() {
                // No pass ran since the state was made or reset: the states are zero.
                Some(ds) if !self.accel_reset => {
                    self.prefix_device()?.read_recurrent(ds, &mut data)?
                }
                _ => data.resize(n, 0.0),
            }
            if data.len() != n {
                anyhow::bail!("the device copied {} recurrent values, not {n}", data.len());
            }
        } else {
            for l in &self.layers {
                if let LayerState::Gdn(g) = l {
                    data.extend_from_slice(&g.s);
                    data.extend_from_slice(&g.conv);
                }
            }
        }
        Ok(RecurrentSnapshot {
            len: self.committed,
            data,
        })
    }

    /// Appends committed attention rows `kv.rows()..to` to `kv` (which must hold rows of this
    /// state's committed tokens, or be empty); from the device for a device state. Panics if
    /// `to` exceeds the committed length.
    pub fn append_kv(&self, kv: &mut KvPrefix, to: usize) -> anyhow::Result<()> {
        assert!(
            to <= self.committed,
            "only committed rows can be copied ({to} > {})",
            self.committed
        );
        let n_attn = self
            .layers
            .iter()
            .filter(|l| matches!(l, LayerState::Attention(_)))
            .count();
        let dtype = self.kv_dtype();
        let caches = || {
            self.layers.iter().filter_map(|l| match l {
                LayerState::Attention(c) => Some(c),
                LayerState::Gdn(_) => None,
            })
        };
        if kv.k.len() != n_attn || kv.dtype().is_some_and(|d| d != dtype) {
            assert_eq!(kv.rows, 0, "a K/V prefix from another model");
            kv.k = caches()
                .map(|c| vec![KvRows::empty(dtype); c.n_kv])
                .collect();
            kv.v = kv.k.clone();
        }
        if to <= kv.rows {
            return Ok(());
        }
        let from = kv.rows;
        if self.on_device {
            let ds = self
                .accel
                .as_deref()
                .filter(|_| !self.accel_reset)
                .ok_or_else(|| anyhow::anyhow!("committed rows without a device state"))?;
            let shape = |kv: &[Vec<KvRows>]| -> Vec<Vec<Vec<f32>>> {
                kv.iter().map(|l| vec![Vec::new(); l.len()]).collect()
            };
            let (mut k, mut v) = (shape(&kv.k), shape(&kv.v));
            self.prefix_device()?
                .read_kv_rows(ds, from..to, &mut k, &mut v)?;
            for (dst, src) in kv.k.iter_mut().zip(k).chain(kv.v.iter_mut().zip(v)) {
                for (d, s) in dst.iter_mut().zip(src) {
                    let KvRows::F32(d) = d else {
                        anyhow::bail!("a device K/V prefix holds f32 rows");
                    };
                    d.reserve_exact(s.len());
                    d.extend_from_slice(&s);
                }
            }
            kv.rows = to;
            return Ok(());
        }
        for ((c, k), v) in caches().zip(&mut kv.k).zip(&mut kv.v) {
            for (h, (k, v)) in k.iter_mut().zip(v).enumerate() {
                // Exact sizes (`extend_from` reserves exactly): callers account for the bytes.
                // K row by row out of its tiles, so the prefix holds plain rows.
                k.reserve_exact((to - from) * c.head_dim);
                for r in from..to {
                    k.extend_from_strided(&c.k, c.k_at(h, r), KEY_TILE, c.head_dim);
                }
                v.extend_from(&c.v, c.v_at(h, from)..c.v_at(h, to));
            }
        }
        kv.rows = to;
        Ok(())
    }

    /// Makes the committed sequence `tokens`, resuming instead of recomputing: attention rows
    /// already committed for the same leading tokens are kept, the others are copied from
    /// `kv` (whose first `tokens.len()` rows must belong to `tokens`), and a model with
    /// recurrent layers takes `recurrent`, which must have been taken at exactly
    /// `tokens.len()` (an empty `tokens` needs none: the state is reset). Nothing is pending
    /// afterwards.
    pub fn load_prefix(
        &mut self,
        tokens: &[u32],
        kv: &KvPrefix,
        recurrent: Option<&RecurrentSnapshot>,
    ) -> anyhow::Result<()> {
        let n = tokens.len();
        if n == 0 {
            self.reset();
            return Ok(());
        }
        if n > self.capacity {
            anyhow::bail!(
                "a prefix of {n} tokens does not fit the context of {}",
                self.capacity
            );
        }
        let recurrent = if self.has_recurrent_layers() {
            let r = recurrent.ok_or_else(|| {
                anyhow::anyhow!("a model with recurrent layers resumes only from a snapshot")
            })?;
            if r.len != n {
                anyhow::bail!(
                    "the recurrent snapshot was taken at {} tokens, not {n}",
                    r.len
                );
            }
            if r.data.len() * 4 != self.recurrent_snapshot_bytes() {
                anyhow::bail!("the recurrent snapshot belongs to another model");
            }
            Some(r)
        } else {
            None
        };
        let keep = self
            .tokens
            .iter()
            .zip(tokens)
            .take_while(|(a, b)| a == b)
            .count()
            .min(self.committed);
        let n_attn = self
            .layers
            .iter()
            .filter(|l| matches!(l, LayerState::Attention(_)))
            .count();
        if keep < n && n_attn > 0 && kv.dtype().is_some_and(|d| d != self.kv_dtype()) {
            anyhow::bail!("the K/V prefix was cached with another K/V element type");
        }
        let heads_match = self
            .layers
            .iter()
            .filter_map(|l| match l {
                LayerState::Attention(c) => Some(c.n_kv),
                LayerState::Gdn(_) => None,
            })
            .zip(&kv.k)
            .all(|(n_kv, heads)| heads.len() == n_kv);
        if keep < n && n_attn > 0 && (kv.rows < n || kv.k.len() != n_attn || !heads_match) {
            anyhow::bail!(
                "the K/V prefix holds {} rows of {} layers; {n} rows of {n_attn} are needed",
                kv.rows,
                kv.k.len()
            );
        }
        if self.on_device {
            let rows = keep.min(n)..n;
            fn f32s(kv: &[Vec<KvRows>]) -> anyhow::Result<Vec<Vec<&[f32]>>> {
                kv.iter()
                    .map(|l| {
                        l.iter()
                            .map(|r| match r {
                                KvRows::F32(x) => Ok(&x[..]),
                                KvRows::F16(_) => {
                                    anyhow::bail!("a device state resumes from f32 K/V rows")
                                }
                            })
                            .collect()
                    })
                    .collect()
            }
            let (k, v) = if rows.is_empty() {
                (Vec::new(), Vec::new())
            } else {
                (f32s(&kv.k)?, f32s(&kv.v)?)
            };
            let dev = self.prefix_device()?.clone();
            let ds = self.ready_device_state()?;
            dev.write_prefix(ds, rows, &k, &v, recurrent.map(|r| &r.data[..]))?;
        } else {
            self.load_host_prefix(keep, n, kv, recurrent);
        }
        self.committed = n;
        self.pending.active = false;
        self.tokens.clear();
        self.tokens.extend_from_slice(tokens);
        Ok(())
    }

    /// [`State::load_prefix`]'s copies into the host caches and states: attention rows
    /// `keep..n` from `kv`, the recurrent state from `recurrent` (checked by the caller).
    fn load_host_prefix(
        &mut self,
        keep: usize,
        n: usize,
        kv: &KvPrefix,
        recurrent: Option<&RecurrentSnapshot>,
    ) {
        let mut ai = 0;
        let mut off = 0;
        for l in &mut self.layers {
            match l {
                LayerState::Attention(c) => {
                    if keep < n {
                        let hd = c.head_dim;
                        for h in 0..c.n_kv {
                            for r in keep..n {
                                let at = c.k_at(h, r);
                                c.k.copy_from_strided(
                                    at,
                                    KEY_TILE,
                                    &kv.k[ai][h],
                                    r * hd..(r + 1) * hd,
                                );
                            }
                            let at = c.v_at(h, keep);
                            c.v.copy_from(at, &kv.v[ai][h], keep * hd..n * hd);
                        }
                    }
                    ai += 1;
                }
                LayerState::Gdn(g) => {
                    let r = recurrent.expect("checked above");
                    let (sl, cl) = (g.s.len(), g.conv.len());
                    g.s.copy_from_slice(&r.data[off..off + sl]);
                    g.conv.copy_from_slice(&r.data[off + sl..off + sl + cl]);
                    off += sl + cl;
                }
            }
        }
    }

    /// Shortens the committed sequence to `n` tokens. Only attention state can be cut back,
    /// so a model with recurrent layers refuses any `n` but 0 and the current length (use
    /// [`load_prefix`](Self::load_prefix) with a snapshot instead).
    pub fn truncate(&mut self, n: usize) -> anyhow::Result<()> {
        if n > self.committed {
            anyhow::bail!("cannot truncate {} committed tokens to {n}", self.committed);
        }
        if n == 0 {
            self.reset();
            return Ok(());
        }
        if n != self.committed && self.has_recurrent_layers() {
            anyhow::bail!("recurrent (Gated DeltaNet) state cannot be truncated");
        }
        self.committed = n;
        self.pending.active = false;
        self.tokens.truncate(n);
        Ok(())
    }

    /// The element type of the attention caches (f32 when there are none).
    pub fn kv_dtype(&self) -> KvDtype {
        self.layers
            .iter()
            .find_map(|l| match l {
                LayerState::Attention(c) => Some(c.k.dtype()),
                LayerState::Gdn(_) => None,
            })
            .unwrap_or_default()
    }

    pub fn layer(&self, i: usize) -> &LayerState {
        &self.layers[i]
    }
}
