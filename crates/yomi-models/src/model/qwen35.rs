//! Qwen3.5 / Qwen3.6 hybrid text models as one pass over the backend op set: layers of Gated
//! DeltaNet (linear attention with a causal conv and the gated delta rule) and of gated full
//! attention (a per-head sigmoid gate on the attention output, q/k norms), each followed by a
//! SwiGLU MLP; zero-centred norm weights (1 + w) are folded in at load time.

use anyhow::{Result, bail};
use yomi_core::GdnShape;
use yomi_core::backend::{Backend, GdnParams};

use super::blocks::{Net, Pass, Scratch, Stream, attention, embed, head, mlp};
use super::forward::LogitRows;
use super::weights::{GdnWeights, Mixer};
use crate::state::LayerState;

pub(crate) fn forward<B: Backend>(
    p: &Pass<'_, B>,
    net: &Net<'_, B>,
    states: &mut [LayerState<B>],
    sc: &mut Scratch<B>,
    mut stream: Stream<'_>,
    which: LogitRows,
    logits: &mut B::Buf,
) -> Result<()> {
    embed(p, net, sc);
    for (li, (layer, state)) in net.layers.iter().zip(states.iter_mut()).enumerate() {
        stream.enter(p, sc, li);
        match (&layer.mixer, state) {
            (Mixer::Attention(w), LayerState::Attention(cache)) => {
                attention(p, w, cache, &layer.input_norm, &stream, sc)
            }
            (Mixer::Gdn(w), LayerState::Gdn(gs)) => {
                gated_delta_net(p, w, gs, &layer.input_norm, &stream, sc)?
            }
            _ => bail!("layer {li}: state kind does not match the weights"),
        }
        mlp(p, layer, sc);
        stream.pending = true;
    }
    head(p, net, sc, stream, which, logits)
}

/// Gated DeltaNet: the input projections (q|k|v, the output gate z, β's b and the decay's a),
/// the conv + gated delta rule core over the pass's tree, the gated RMSNorm and the output
/// projection: `y` = the block's output.
fn gated_delta_net<B: Backend>(
    p: &Pass<'_, B>,
    w: &GdnWeights<B>,
    state: &mut B::GdnState,
    input_norm: &B::Vector,
    stream: &Stream<'_>,
    sc: &mut Scratch<B>,
) -> Result<()> {
    let (b, cfg, t) = (p.b, p.cfg, p.rows());
    let Some(g) = cfg.gdn else {
        bail!("a Gated DeltaNet layer in a model without a GDN config");
    };
    let Scratch {
        h,
        x,
        y,
        z: pending_z,
        a: qkv,
        b: mc,
        c: zg,
        d: braw,
        e: araw,
        f: q,
        g: o,
        ..
    } = sc;
    b.add_norm_linears(
        h,
        stream.pending.then_some(&*pending_z),
        input_norm,
        cfg.rms_norm_eps,
        t,
        x,
        &[&w.qkv, &w.z, &w.b, &w.a],
        &[None, None, None, None],
        &mut [&mut *qkv, &mut *zg, &mut *braw, &mut *araw],
    );
    let params = GdnParams {
        shape: GdnShape {
            hk: g.num_key_heads,
            hv: g.num_value_heads,
            dk: g.key_head_dim,
            dv: g.value_head_dim,
        },
        conv_kernel: g.conv_kernel,
        conv: &w.conv,
        neg_exp_a: &w.neg_exp_a,
        dt_bias: &w.dt_bias,
    };
    b.gated_delta_rule(state, params, p.rows, qkv, braw, araw, [mc, q], o);
    b.gated_rms_norm_inplace(o, zg, t * g.value_dim(), &w.norm, cfg.rms_norm_eps);
    b.linear(o, t, &w.out, None, y);
    Ok(())
}
