//! Causal depthwise conv1d with state and tree parents (the GDN short convolution).
//!
//! Shapes: m [T, C] pre-conv inputs of this pass, state [K−1, C] the committed last K−1 inputs
//! (oldest first), w [C, K]. For row i with ancestors a_0 = i, a_1 = parent(i), …, continuing into
//! the committed state (newest first) once the chain passes the root:
//! out[i, c] = silu(Σ_{d=0..K−1} w[c, K−1−d] · m[a_d, c]).
//! Each row's own conv state (its last K−1 inputs, oldest first) is written to windows
//! [T, K−1, C]; commit copies the last accepted row's window into the state.

use yomi_core::TreeBatch;

use crate::activation::silu;

#[allow(clippy::too_many_arguments)]
pub fn conv1d_tree(
    m: &[f32],
    c: usize,
    k: usize,
    state: &[f32],
    w: &[f32],
    tree: &TreeBatch,
    out: &mut [f32],
    windows: &mut [f32],
) {
    let t = tree.len();
    assert_eq!(m.len(), t * c);
    assert_eq!(state.len(), (k - 1) * c);
    assert_eq!(w.len(), c * k);
    assert_eq!(windows.len(), t * (k - 1) * c);
    // Up to K sources per row (newest first); K is 4 in every released model.
    let mut src: [&[f32]; 8] = [&[]; 8];
    assert!(k <= 8, "conv kernel wider than 8 is not supported");
    for i in 0..t {
        let mut j = i as i32;
        let mut from_state = 0usize;
        for slot in src.iter_mut().take(k) {
            if j >= 0 {
                *slot = &m[j as usize * c..(j as usize + 1) * c];
                j = tree.parent(j as usize);
            } else {
                // Newest committed input first: state row K−2, then K−3, …
                let r = k - 2 - from_state;
                *slot = &state[r * c..(r + 1) * c];
                from_state += 1;
            }
        }
        let orow = &mut out[i * c..(i + 1) * c];
        for ch in 0..c {
            let wr = &w[ch * k..(ch + 1) * k];
            let mut s = 0.0f32;
            for d in 0..k {
                s += wr[k - 1 - d] * src[d][ch];
            }
            orow[ch] = silu(s);
        }
        let win = &mut windows[i * (k - 1) * c..(i + 1) * (k - 1) * c];
        for r in 0..k - 1 {
            // window row r (oldest first) = source d = K−2−r
            win[r * c..(r + 1) * c].copy_from_slice(src[k - 2 - r]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Tree conv equals the plain sequential conv over committed history + root→i path.
    #[test]
    fn tree_conv_matches_sequential_paths() {
        let (c, k) = (5, 4);
        let parents = [-1, 0, 1, 0, 3, 4, 4];
        let tree = TreeBatch::from_parents(&parents).unwrap();
        let t = parents.len();
        let f = |i: usize| ((i * 2654435761) % 1000) as f32 / 500.0 - 1.0;
        let m: Vec<f32> = (0..t * c).map(|i| f(i + 7)).collect();
        let state: Vec<f32> = (0..(k - 1) * c).map(|i| f(i + 1000)).collect();
        let w: Vec<f32> = (0..c * k).map(|i| f(i + 2000)).collect();
        let mut out = vec![0.0; t * c];
        let mut win = vec![0.0; t * (k - 1) * c];
        conv1d_tree(&m, c, k, &state, &w, &tree, &mut out, &mut win);
        for i in 0..t {
            // sequence of inputs: state rows then the path rows
            let mut seq: Vec<&[f32]> = (0..k - 1).map(|r| &state[r * c..(r + 1) * c]).collect();
            for j in tree.path_to(i) {
                seq.push(&m[j * c..(j + 1) * c]);
            }
            let n = seq.len();
            for ch in 0..c {
                let s: f32 = (0..k).map(|kk| w[ch * k + kk] * seq[n - k + kk][ch]).sum();
                assert!((silu(s) - out[i * c + ch]).abs() < 1e-6);
            }
            for r in 0..k - 1 {
                assert_eq!(
                    &win[(i * (k - 1) + r) * c..(i * (k - 1) + r + 1) * c],
                    seq[n - (k - 1) + r]
                );
            }
        }
    }
}
