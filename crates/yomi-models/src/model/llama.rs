//! The Llama family — Llama, SmolLM, Qwen2 (q/k/v biases) and Qwen3 (q/k norms) — as one pass
//! over the backend op set: every layer is pre-norm self-attention then a pre-norm SwiGLU MLP,
//! each added back to the residual stream; the final norm and the LM head close the pass.
//! What differs between the members (biases, q/k norms, RoPE scaling, tied embeddings) is in
//! the weights and the config, not in the code.

use anyhow::{Result, bail};
use yomi_core::backend::Backend;

use super::blocks::{Net, Pass, Scratch, Stream, attention, embed, head, mlp};
use super::forward::LogitRows;
use super::weights::Mixer;
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
        let (Mixer::Attention(w), LayerState::Attention(cache)) = (&layer.mixer, state) else {
            bail!("layer {li}: a Llama-family layer is self-attention");
        };
        attention(p, w, cache, &layer.input_norm, &stream, sc);
        mlp(p, layer, sc);
        stream.pending = true;
    }
    head(p, net, sc, stream, which, logits)
}
