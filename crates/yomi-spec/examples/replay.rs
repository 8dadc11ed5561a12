//! Replays recorded greedy generations through the suffix drafter, without a model: because a
//! greedy output does not depend on the drafter, the accepted path of every pass is known from
//! the recording, so tokens per pass and drafted rows are exact. The predicted speed-up charges
//! a pass 1 + r · drafts (r = one more row's cost relative to a one-row pass, as the engine
//! measures it) against one per token for plain decoding.
//!
//! Input files: two lines of comma-separated token ids, the prompt and the output (e.g.
//! `prompt_ids` and `output_ids` of `yomi run --json`; `bench/spec_cpu.py --record DIR` writes
//! them for its prompts). `REPLAY_TRACE=1` prints every pass (match length, drafts, accepted,
//! and how far the recording actually copies the matched occurrence); `REPLAY_CFG=decay=0.9,…`
//! overrides drafter settings, for tuning on recordings rather than on noisy timings.
//!
//! `--oracle-depth` replaces each proposal by a chain from the drafter's own best occurrence
//! (the first of its longest match's occurrences) exactly as deep as the recording follows it
//! (at most the budget): what the drafter would reach if it knew how far each copy goes.
//! `--oracle-occurrence` (which implies it) also picks the occurrence the recording follows
//! furthest. Both bound what better depth estimates (and occurrence choices) could gain.
//!
//! `--costs 1,1.01,1.1,…` charges a pass of T rows the T-th value instead (pass times relative
//! to a one-row pass, as `verify_cost` prints them; past the list's end its last step
//! continues), while the drafter is still told `--r` (and `--growth`), as the engine tells it
//! its fit. Without `--costs` a pass of n drafts costs 1 + r·n + growth·n². `--tell-curve`
//! tells the drafter the `--costs` curve itself, as the engine does once it has measured each
//! pass size.
//!
//! `--learn` (with `--costs`) tells the drafter what the engine would: the pass times charged
//! so far go into a [`PassCost`] (carried from file to file, as the engine carries them from
//! request to request), whose curve or fit the drafter is told before every proposal. Each
//! file is replayed once uncounted first, as `spec_ab` warms up. `--noise F` scales each
//! charged time by a factor drawn evenly from 1 ± F (a fixed seed), as a real host's passes
//! scatter. `--drift A [--drift-period P]` scales them also by 1 + A · sin(2π · pass / P)
//! (passes counted over all files; P = 400 by default), as a shared VM's speed drifts from
//! minute to minute, so that sizes measured at different moments disagree.
//!
//! `--cold` (implies `--learn`) replays each file as a fresh process does (`yomi run`): an
//! empty [`PassCost`], no warm-up, and the drafter told nothing until the engine would tell it.
//!
//! cargo run --release -p yomi-spec --example replay -- [--r 0.25] [--growth 0] [--budget 16]
//! [--costs LIST [--tell-curve | --learn | --cold] [--noise F] [--drift A [--drift-period P]]]
//! [--oracle-depth | --oracle-occurrence]
//! FILE...

use std::process::ExitCode;

use yomi_core::TreeBatch;
use yomi_spec::{DraftTree, Drafter, PassCost, SuffixConfig, SuffixDrafter, accept};

struct Replay {
    tokens: usize,
    passes: usize,
    drafted: usize,
    cost: f64,
}

/// How passes are charged (the drafter is told `r`).
struct Costs {
    r: f32,
    /// What the drafter is told of the curve's bend ([`Drafter::set_row_cost_growth`]).
    growth: f32,
    /// Pass time by rows (index T − 1), relative to one row; empty: 1 + r · drafts.
    curve: Vec<f32>,
    /// Tell the drafter the curve itself ([`Drafter::set_pass_costs`]), as the engine does
    /// once it has measured the sizes.
    tell_curve: bool,
}

/// The engine's measurements, simulated (`--learn`): what the passes were charged so far.
struct Learn {
    cost: PassCost,
    /// Each charged time is scaled by a factor in 1 ± `noise`.
    noise: f64,
    /// The noise's generator state (xorshift64).
    rng: u64,
    /// The host's speed drifting: each charged time is scaled by 1 + drift · sin(2π · pass /
    /// drift_period), passes counted over every file.
    drift: f64,
    drift_period: f64,
    passes: u64,
}

impl Learn {
    /// Records a pass of `rows` rows charged `units` one-row passes (one unit = 1 ms).
    fn record(&mut self, rows: usize, units: f64) {
        self.passes += 1;
        let phase = std::f64::consts::TAU * self.passes as f64 / self.drift_period;
        let units = units * (1.0 + self.drift * phase.sin());
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        let uniform = (self.rng >> 11) as f64 / (1u64 << 53) as f64;
        let factor = 1.0 + self.noise * (2.0 * uniform - 1.0);
        self.cost.add(rows, units * factor * 1e-3);
    }
}

impl Costs {
    fn pass(&self, drafts: usize) -> f64 {
        let c = &self.curve;
        if c.is_empty() {
            let n = drafts as f64;
            return 1.0 + self.r as f64 * n + self.growth as f64 * n * n;
        }
        let last = c.len() - 1;
        if drafts <= last {
            return c[drafts] as f64;
        }
        let step = if last > 0 { c[last] - c[last - 1] } else { 0.0 };
        (c[last] + step * (drafts - last) as f32) as f64
    }
}

/// What replaces the drafter's proposals (see the module notes).
#[derive(Clone, Copy, PartialEq)]
enum Oracle {
    None,
    Depth,
    DepthAndOccurrence,
}

/// A chain from one of the drafter's occurrences of the context's longest match, as deep as
/// the recording (`output`, at position `i`) follows it, at most `budget`.
fn oracle_chain(
    d: &SuffixDrafter,
    oracle: Oracle,
    output: &[u32],
    i: usize,
    budget: usize,
    draft: &mut DraftTree,
) {
    draft.reset(output[i]);
    let mut occ = Vec::new();
    let c = d.config();
    d.index()
        .find(c.max_candidates, c.max_occurrences, &mut occ);
    let tried = if oracle == Oracle::DepthAndOccurrence {
        occ.len()
    } else {
        1
    };
    let follows = |j: u32| {
        (0..budget)
            .take_while(|&r| {
                i + 1 + r < output.len()
                    && d.index().token(j as usize + 1 + r) == Some(output[i + 1 + r])
            })
            .count()
    };
    let run = occ
        .iter()
        .take(tried)
        .map(|&j| follows(j))
        .max()
        .unwrap_or(0);
    let mut parent = 0;
    for &t in &output[i + 1..i + 1 + run] {
        parent = draft.push(parent, t);
    }
}

fn replay(
    prompt: &[u32],
    output: &[u32],
    costs: &Costs,
    budget: usize,
    oracle: Oracle,
    mut learn: Option<&mut Learn>,
    cold: bool,
) -> Replay {
    let mut d = SuffixDrafter::new(config());
    let mut told = Vec::new();
    if !cold {
        d.set_row_cost(costs.r);
        d.set_row_cost_growth(costs.growth);
    }
    if costs.tell_curve {
        d.set_pass_costs(&costs.curve);
    }
    let mut context: Vec<u32> = prompt.to_vec();
    context.push(output[0]);
    let mut draft = DraftTree::new();
    let mut accepted = Vec::new();
    let mut samples = Vec::new();
    let (mut i, mut passes, mut drafted, mut cost) = (0usize, 0usize, 0usize, 0f64);
    while i + 1 < output.len() {
        draft.reset(output[i]);
        let max_depth = output.len() - i - 2;
        if max_depth > 0 {
            if let Some(l) = learn.as_deref() {
                // What the engine tells the drafter before every proposal.
                l.cost.inform(&mut d, budget, &mut told);
            }
            d.propose(&context, budget, &mut draft);
            if oracle != Oracle::None {
                oracle_chain(&d, oracle, output, i, budget, &mut draft);
            }
            draft.trim(budget, max_depth as u32);
        }
        // The target's sample at a row is the recorded token after the row's path when the
        // path is the recording's, anything else otherwise (then no child can match).
        let tree = TreeBatch::from_parents(draft.parents()).expect("drafter trees are valid");
        samples.clear();
        let mut on_path = vec![false; draft.len()];
        for row in 0..draft.len() {
            let depth = draft.depth(row) as usize;
            let p = draft.parents()[row];
            on_path[row] =
                row == 0 || (on_path[p as usize] && draft.tokens()[row] == output[i + depth]);
            samples.push(if on_path[row] {
                output[i + depth + 1]
            } else {
                u32::MAX
            });
        }
        let bonus = accept(&tree, draft.tokens(), &samples, &mut accepted);
        let a = accepted.len() - 1;
        if std::env::var_os("REPLAY_TRACE").is_some() {
            let mut occ = Vec::new();
            let m = d.index().find(64, 16, &mut occ);
            // The longest run the recording copies from the best occurrence.
            let mut run = 0;
            if let Some(&j) = occ.first() {
                while i + 1 + run < output.len()
                    && d.index().token(j as usize + 1 + run) == Some(output[i + 1 + run])
                {
                    run += 1;
                }
            }
            eprintln!(
                "TRACE i={i} m={m} occ={} drafted={} depth={} acc={a} run={run}",
                occ.len(),
                draft.num_drafts(),
                draft.max_depth()
            );
        }
        if draft.num_drafts() > 0 {
            d.observe(a, draft.num_drafts());
        }
        debug_assert_eq!(bonus, output[i + a + 1]);
        passes += 1;
        drafted += draft.num_drafts();
        let charged = costs.pass(draft.num_drafts());
        cost += charged;
        if let Some(l) = learn.as_deref_mut() {
            l.record(draft.len(), charged);
        }
        context.extend_from_slice(&output[i + 1..=i + a + 1]);
        i += a + 1;
    }
    Replay {
        tokens: output.len() - 1,
        passes,
        drafted,
        cost,
    }
}

/// The default settings, with `REPLAY_CFG=name=value,…` overrides (for tuning).
fn config() -> SuffixConfig {
    let mut c = SuffixConfig::default();
    for kv in std::env::var("REPLAY_CFG").unwrap_or_default().split(',') {
        let Some((k, v)) = kv.split_once('=') else {
            continue;
        };
        let f: f32 = v.parse().unwrap_or(f32::NAN);
        match k {
            "max_match" => c.max_match = f as usize,
            "min_match" => c.min_match = f as usize,
            "max_occurrences" => c.max_occurrences = f as usize,
            "min_frequency" => c.min_frequency = f,
            "spec_factor" => c.spec_factor = f,
            "prior_accept" => c.prior_accept = f,
            "prior_weight" => c.prior_weight = f,
            "decay" => c.decay = f,
            "min_pause" => c.min_pause = f as u32,
            "substitutions" => c.substitutions = f != 0.0,
            "max_pause" => c.max_pause = f as u32,
            _ => eprintln!("unknown setting {k}"),
        }
    }
    c
}

fn ids(line: &str) -> Result<Vec<u32>, String> {
    line.split(',')
        .filter(|s| !s.trim().is_empty())
        .map(|s| {
            s.trim()
                .parse::<u32>()
                .map_err(|e| format!("bad id {s:?}: {e}"))
        })
        .collect()
}

fn main() -> ExitCode {
    let mut r = 0.25f32;
    let mut growth = 0.0f32;
    let mut budget = 16usize;
    let mut curve = Vec::new();
    let mut tell_curve = false;
    let mut learn = false;
    let mut cold = false;
    let mut noise = 0.0f64;
    let mut drift = 0.0f64;
    let mut drift_period = 400.0f64;
    let mut oracle = Oracle::None;
    let mut files = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--r" => r = args.next().and_then(|v| v.parse().ok()).unwrap_or(r),
            "--growth" => growth = args.next().and_then(|v| v.parse().ok()).unwrap_or(growth),
            "--tell-curve" => tell_curve = true,
            "--learn" => learn = true,
            "--cold" => {
                learn = true;
                cold = true;
            }
            "--noise" => noise = args.next().and_then(|v| v.parse().ok()).unwrap_or(noise),
            "--drift" => drift = args.next().and_then(|v| v.parse().ok()).unwrap_or(drift),
            "--drift-period" => {
                drift_period = args
                    .next()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(drift_period)
            }
            // `--oracle-occurrence` implies the depth oracle.
            "--oracle-depth" if oracle == Oracle::None => oracle = Oracle::Depth,
            "--oracle-depth" => {}
            "--oracle-occurrence" => oracle = Oracle::DepthAndOccurrence,
            "--budget" => budget = args.next().and_then(|v| v.parse().ok()).unwrap_or(budget),
            "--costs" => {
                let list = args.next().unwrap_or_default();
                match list.split(',').map(|v| v.trim().parse::<f32>()).collect() {
                    Ok(c) => curve = c,
                    Err(e) => {
                        eprintln!("--costs {list:?}: {e}");
                        return ExitCode::FAILURE;
                    }
                }
            }
            _ => files.push(a),
        }
    }
    if (learn || noise != 0.0 || drift != 0.0) && (curve.is_empty() || tell_curve) {
        eprintln!("--learn, --cold, --noise and --drift need --costs, and not --tell-curve");
        return ExitCode::FAILURE;
    }
    if (noise != 0.0 || drift != 0.0) && !learn {
        // They scatter what the engine would measure: without --learn nothing is measured.
        eprintln!("--noise and --drift need --learn or --cold");
        return ExitCode::FAILURE;
    }
    let mut learn = learn.then(|| Learn {
        cost: PassCost::default(),
        noise: noise.clamp(0.0, 0.9),
        rng: 0x9e37_79b9_7f4a_7c15,
        drift: drift.clamp(0.0, 0.9),
        drift_period: drift_period.max(1.0),
        passes: 0,
    });
    let costs = Costs {
        r,
        growth,
        tell_curve: tell_curve && !curve.is_empty(),
        curve,
    };
    let model = match (costs.curve.is_empty(), growth > 0.0) {
        _ if costs.tell_curve => "the cost curve, drafter told the curve".to_string(),
        _ if learn.is_some() => "the cost curve, drafter told what it measured".to_string(),
        (true, false) => format!("r = {r}"),
        (true, true) => format!("1 + {r}·n + {growth}·n² for n drafts"),
        (false, false) => format!("the cost curve, drafter told r = {r}"),
        (false, true) => format!("the cost curve, drafter told r = {r}, g = {growth}"),
    };
    println!("| file | tokens | tokens/pass | drafted/pass | predicted speed-up at {model} |");
    println!("|---|---|---|---|---|");
    for f in files {
        let text = match std::fs::read_to_string(&f) {
            Ok(t) => t,
            Err(e) => {
                eprintln!("{f}: {e}");
                return ExitCode::FAILURE;
            }
        };
        let mut lines = text.lines();
        let (prompt, output) = match (lines.next().map(ids), lines.next().map(ids)) {
            (Some(Ok(p)), Some(Ok(o))) if o.len() >= 2 => (p, o),
            _ => {
                eprintln!("{f}: expected two lines of token ids (prompt, output of ≥ 2 tokens)");
                return ExitCode::FAILURE;
            }
        };
        if cold && let Some(l) = learn.as_mut() {
            // A fresh engine: nothing measured, the drafter told nothing.
            l.cost = PassCost::default();
        } else if let Some(l) = learn.as_mut() {
            // The warm-up: measurements as the engine has them after one generation.
            replay(&prompt, &output, &costs, budget, oracle, Some(l), false);
        }
        let s = replay(
            &prompt,
            &output,
            &costs,
            budget,
            oracle,
            learn.as_mut(),
            cold,
        );
        println!(
            "| {f} | {} | {:.2} | {:.2} | {:.2}x |",
            s.tokens,
            s.tokens as f64 / s.passes as f64,
            s.drafted as f64 / s.passes as f64,
            s.tokens as f64 / s.cost
        );
    }
    ExitCode::SUCCESS
}
