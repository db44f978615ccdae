//! The MLP of a decoder layer: one gated block (SwiGLU, or Gemma's GeGLU) in dense models, or a
//! router choosing a few of many SwiGLU experts per token (mixture of experts), with Qwen2-MoE's
//! gated shared expert or Granite 4's ungated shared MLP.

use super::archs::MlpLayout;
use super::decoder::Precision;
use super::linear::{Compute, Linear, LinearParts};
use super::lora::{add_lora, LoraRows, LoraTarget};
use super::tensor_parallel::Shard;
use crate::config::{Activation, ExpertScoring, GroupScore, ModelConfig, MoeConfig};
use crate::error::{EngineError, Result};
use crate::weights::{Stored, WeightStore};
use rsgl_kernels::profile::{self, Phase};
use rsgl_kernels::{ThreadPool, WeightDtype};

pub(super) fn take_linear(w: &mut WeightStore, prefix: &str, out: usize, inp: usize) -> Result<LinearParts> {
    Ok(LinearParts::new(w.take_matrix(&format!("{prefix}.weight"), out, inp)?, w.take_optional(&format!("{prefix}.bias"), &[out])?))
}

/// Each tensor-parallel rank's shard and the threads that pack (and first touch) its weights.
pub(super) type Ranks<'a> = [(&'a Shard, &'a ThreadPool)];

/// A small layer every rank holds whole, in float32.
fn replicated(parts: &LinearParts, ranks: &Ranks) -> Vec<Linear> {
    ranks.iter().map(|(_, pool)| Linear::fused(vec![parts.clone()], WeightDtype::F32, None, pool)).collect()
}

/// `down(act(gate(x)) * up(x))`, gate and up fused into one GEMM.
pub struct GatedMlp {
    gate_up: Linear,
    down: Linear,
    activation: Activation,
}

impl GatedMlp {
    /// Takes `{prefix}.{gate}` and `.{up}` (or the `.gate_up_proj` a checkpoint fuses them
    /// into) and `.{down}`, of width `inter`; each rank gets its
    /// columns of the intermediate width (its outputs are partial sums).
    fn take(
        w: &mut WeightStore,
        prefix: &str,
        [gate, up, down]: [&str; 3],
        (h, inter): (usize, usize),
        activation: Activation,
        p: &Precision,
        ranks: &Ranks,
    ) -> Result<Vec<GatedMlp>> {
        // Phi-3 checkpoints fuse gate and up into one `gate_up_proj`, gate first.
        let (gate, up) = if w.contains(&format!("{prefix}.gate_up_proj.weight")) {
            let fused = take_linear(w, &format!("{prefix}.gate_up_proj"), 2 * inter, h)?;
            (fused.output_rows(0..inter), fused.output_rows(inter..2 * inter))
        } else {
            (take_linear(w, &format!("{prefix}.{gate}"), inter, h)?, take_linear(w, &format!("{prefix}.{up}"), inter, h)?)
        };
        let down = take_linear(w, &format!("{prefix}.{down}"), h, inter)?;
        Ok(ranks
            .iter()
            .map(|(shard, pool)| {
                let columns = shard.columns(inter);
                GatedMlp {
                    gate_up: Linear::fused(vec![gate.output_rows(columns.clone()), up.output_rows(columns.clone())], p.dtype, p.quantization, pool),
                    down: Linear::fused(vec![down.input_columns(columns, shard.adds_bias())], p.dtype, p.quantization, pool),
                    activation,
                }
            })
            .collect())
    }

    /// `x` is `[rows, hidden]`.
    fn forward(&self, c: &Compute, x: &[f32]) -> Vec<f32> {
        self.forward_with_lora(c, x, &[])
    }

    /// [`Self::forward`], `lora`'s rows adding their adapters' updates of gate, up and down.
    fn forward_with_lora(&self, c: &Compute, x: &[f32], lora: &[LoraRows]) -> Vec<f32> {
        let inter = self.inter();
        let gate_up = {
            let _phase = profile::phase(Phase::GateUpProjection);
            let mut gate_up = self.gate_up.forward(c, x);
            // A fused `gate_up_proj`'s update covers gate|up, as the fused output does.
            for (target, first) in [(LoraTarget::Gate, 0), (LoraTarget::Up, inter), (LoraTarget::GateUp, 0)] {
                add_lora(c, lora, target, x, &mut gate_up, 2 * inter, first);
            }
            gate_up
        };
        let mut act = vec![0.0; gate_up.len() / 2];
        let activation = profile::phase(Phase::Activation);
        c.pool.for_chunks_mut(&mut act, inter, &|row, out| self.activate(c, &gate_up[row * 2 * inter..(row + 1) * 2 * inter], out));
        drop(activation);
        let _phase = profile::phase(Phase::DownProjection);
        let mut out = self.down.forward(c, &act);
        add_lora(c, lora, LoraTarget::Down, &act, &mut out, self.down.out_features(), 0);
        out
    }

    /// This rank's intermediate width.
    fn inter(&self) -> usize {
        self.gate_up.out_features() / 2
    }

    /// The activation of rows of gate|up outputs (`[rows, 2 * inter]`, each row's gate, then
    /// up) into `out` (`[rows, inter]`).
    fn activate(&self, c: &Compute, gate_up: &[f32], out: &mut [f32]) {
        let activate = match self.activation {
            Activation::Silu => c.kernels.silu_mul,
            Activation::GeluTanh => c.kernels.gelu_tanh_mul,
            Activation::ClampedSwiglu => c.kernels.clamped_swiglu_mul,
        };
        let inter = self.inter();
        for (row, out) in gate_up.chunks_exact(2 * inter).zip(out.chunks_exact_mut(inter)) {
            let (gate, up) = row.split_at(inter);
            activate(gate, up, out);
        }
    }
}

/// Rows up to which a step runs its routed experts' projections together ([`Experts::forward_grouped`]):
/// decode batches. Their outputs are held at once, so a prefill's runs expert by expert.
const GROUPED_ROWS: usize = 32;

pub struct Experts {
    /// Router logits per expert; kept in float32 (small, and decisive for which experts run).
    router: Linear,
    /// Added to the scores to choose experts, not to weigh them (DeepSeek-V3's
    /// `e_score_correction_bias`).
    choice_bias: Option<Vec<f32>>,
    experts: Vec<GatedMlp>,
    routing: MoeConfig,
    /// An expert every token goes through: Qwen2-MoE's scaled by `sigmoid(gate · x)`, Granite
    /// 4's and DeepSeek's unscaled.
    shared: Option<(GatedMlp, Option<Linear>)>,
}

// One per layer, built once: the variants' size difference costs nothing.
#[allow(clippy::large_enum_variant)]
pub enum Mlp {
    Dense(GatedMlp),
    Moe(Experts),
}

impl Mlp {
    /// Layer `layer`'s MLP (`prefix`), named as its architecture's checkpoints name it
    /// (`layout`), one per rank: dense in a model without experts and in DeepSeek's first layers.
    pub fn take(w: &mut WeightStore, layer: usize, prefix: &str, cfg: &ModelConfig, layout: MlpLayout, p: &Precision, ranks: &Ranks) -> Result<Vec<Mlp>> {
        let h = cfg.hidden_size;
        const PROJECTIONS: [&str; 3] = ["gate_proj", "up_proj", "down_proj"];
        let shared_block = format!("{prefix}.shared_mlp");
        if layout == MlpLayout::GraniteShared {
            split_granite_mlps(w, prefix, cfg)?;
        }
        let Some(moe) = cfg.moe.as_ref().filter(|moe| layer >= moe.dense_layers) else {
            let block = if layout == MlpLayout::GraniteShared { shared_block } else { format!("{prefix}.mlp") };
            let dense = GatedMlp::take(w, &block, PROJECTIONS, (h, cfg.intermediate_size), cfg.activation, p, ranks)?;
            return Ok(dense.into_iter().map(Mlp::Dense).collect());
        };
        let (num_experts, inter) = (moe.num_experts, moe.expert_intermediate_size);
        let (block, names) = if cfg.architecture == "mixtral" {
            (format!("{prefix}.block_sparse_moe"), ["w1", "w3", "w2"])
        } else if layout == MlpLayout::GraniteShared {
            (format!("{prefix}.block_sparse_moe"), PROJECTIONS)
        } else {
            (format!("{prefix}.mlp"), PROJECTIONS)
        };
        split_stacked_experts(w, &block, (num_experts, h, inter))?;
        // The router runs on every rank (small, and every rank routes the same rows); each
        // expert is split as a dense MLP is. gpt-oss names it `router` (with a bias).
        let router = if w.contains(&format!("{block}.router.weight")) { "router" } else { "gate" };
        let choice_bias = w.take_optional(&format!("{block}.{router}.e_score_correction_bias"), &[num_experts])?;
        let mut routers = replicated(&take_linear(w, &format!("{block}.{router}"), num_experts, h)?, ranks).into_iter();
        let mut experts: Vec<Vec<GatedMlp>> = ranks.iter().map(|_| Vec::with_capacity(num_experts)).collect();
        for e in 0..num_experts {
            for (rank_experts, expert) in
                experts.iter_mut().zip(GatedMlp::take(w, &format!("{block}.experts.{e}"), names, (h, inter), cfg.activation, p, ranks)?)
            {
                rank_experts.push(expert);
            }
        }
        let mut shared: Vec<Option<(GatedMlp, Option<Linear>)>> = match (moe.shared_expert_intermediate_size, layout) {
            (None, _) => ranks.iter().map(|_| None).collect(),
            (Some(size), MlpLayout::Separate) => {
                // Qwen2-MoE's `shared_expert` has a gate; DeepSeek's `shared_experts` (several, fused into one) have none.
                let gate_name = format!("{block}.shared_expert_gate");
                let gated = w.contains(&format!("{gate_name}.weight"));
                let name = if w.contains(&format!("{block}.shared_experts.down_proj.weight")) { "shared_experts" } else { "shared_expert" };
                let expert = GatedMlp::take(w, &format!("{block}.{name}"), names, (h, size), cfg.activation, p, ranks)?;
                let gates: Vec<Option<Linear>> = match gated {
                    true => replicated(&take_linear(w, &gate_name, 1, h)?, ranks).into_iter().map(Some).collect(),
                    false => ranks.iter().map(|_| None).collect(),
                };
                expert.into_iter().zip(gates).map(Some).collect()
            }
            (Some(size), MlpLayout::GraniteShared) => {
                GatedMlp::take(w, &shared_block, PROJECTIONS, (h, size), cfg.activation, p, ranks)?.into_iter().map(|expert| Some((expert, None))).collect()
            }
        };
        Ok(experts
            .into_iter()
            .map(|experts| {
                let (router, shared) = (routers.next().expect("one per rank"), shared.remove(0));
                Mlp::Moe(Experts { router, choice_bias: choice_bias.clone(), experts, routing: moe.clone(), shared })
            })
            .collect())
    }

    /// `x` is `[rows, hidden]`; returns the MLP's output rows, `lora`'s with their adapters'
    /// updates of a dense MLP or shared expert (routed experts take none).
    pub fn forward(&self, c: &Compute, x: &[f32], lora: &[LoraRows]) -> Vec<f32> {
        match self {
            Mlp::Dense(ffn) => ffn.forward_with_lora(c, x, lora),
            Mlp::Moe(moe) => {
                let _phase = profile::phase(Phase::Experts);
                moe.forward(c, x, lora)
            }
        }
    }
}

/// gpt-oss stores all of a layer's experts in one tensor each, with gate and up interleaved
/// (gate the even ones): in floats transposed from nn.Linear (`x @ W`), `experts.gate_up_proj`
/// `[E, hidden, 2 * inter]` (interleaved columns) and `experts.down_proj` `[E, inter, hidden]`;
/// in MXFP4 as nn.Linear, `[E, 2 * inter, hidden]` (interleaved rows) and `[E, hidden, inter]`
/// (see `weights::hf_mxfp4`); and their biases `[E, 2 * inter]` and `[E, hidden]`. Each
/// expert's slices go back into the store under the per-expert names
/// (`experts.{e}.gate_proj.weight` `[inter, hidden]`, ...) that the loader of separate experts
/// reads: floats as copies, MXFP4 as views of the stored rows (no float copy of the experts).
/// A no-op for checkpoints without them.
fn split_stacked_experts(w: &mut WeightStore, block: &str, (experts, h, inter): (usize, usize, usize)) -> Result<()> {
    let stacked = |name: &str| format!("{block}.experts.{name}");
    if !w.contains(&stacked("gate_up_proj")) {
        return Ok(());
    }
    let name = |e: usize, proj: &str, part: &str| format!("{block}.experts.{e}.{proj}.{part}");
    let gates_ups = [("gate_proj", 0), ("up_proj", 1)];
    if w.stored(&stacked("gate_up_proj")) == Some(Stored::HfMxfp4) {
        for (tensor, shape) in [("gate_up_proj", [experts, 2 * inter, h]), ("down_proj", [experts, h, inter])] {
            let found = w.shape(&stacked(tensor)).map(<[usize]>::to_vec);
            if found.as_deref() != Some(&shape[..]) {
                return Err(EngineError::ModelLoad(format!(
                    "MXFP4 tensor {} has shape {found:?}, but the model's config implies {shape:?}; the config does not match the weights",
                    stacked(tensor)
                )));
            }
        }
        let gate_up = (0..experts).flat_map(|e| gates_ups.map(|(proj, parity)| (name(e, proj, "weight"), e * 2 * inter + parity, 2, inter)));
        w.split_rows(&stacked("gate_up_proj"), &gate_up.collect::<Vec<_>>())?;
        w.split_rows(&stacked("down_proj"), &(0..experts).map(|e| (name(e, "down_proj", "weight"), e * h, 1, h)).collect::<Vec<_>>())?;
    } else {
        let gate_up = w.take(&stacked("gate_up_proj"), &[experts, h, 2 * inter])?;
        let down = w.take(&stacked("down_proj"), &[experts, inter, h])?;
        // Row `r` of the nn.Linear weight is column `pick(r)` of the stored `[inputs, cols]` matrix.
        let transposed = |m: &[f32], rows: usize, inputs: usize, cols: usize, pick: &dyn Fn(usize) -> usize| -> Vec<f32> {
            (0..rows).flat_map(|r| (0..inputs).map(move |i| (r, i))).map(|(r, i)| m[i * cols + pick(r)]).collect()
        };
        for e in 0..experts {
            let gu = &gate_up[e * h * 2 * inter..(e + 1) * h * 2 * inter];
            for (proj, parity) in gates_ups {
                w.insert(&name(e, proj, "weight"), vec![inter, h], transposed(gu, inter, h, 2 * inter, &|r| 2 * r + parity))?;
            }
            let d = &down[e * inter * h..(e + 1) * inter * h];
            w.insert(&name(e, "down_proj", "weight"), vec![h, inter], transposed(d, h, inter, h, &|r| r))?;
        }
    }
    let gate_up_bias = w.take_optional(&stacked("gate_up_proj_bias"), &[experts, 2 * inter])?;
    let down_bias = w.take_optional(&stacked("down_proj_bias"), &[experts, h])?;
    for e in 0..experts {
        if let Some(bias) = &gate_up_bias {
            let bias = &bias[e * 2 * inter..(e + 1) * 2 * inter];
            for (proj, parity) in gates_ups {
                w.insert(&name(e, proj, "bias"), vec![inter], (0..inter).map(|r| bias[2 * r + parity]).collect())?;
            }
        }
        if let Some(bias) = &down_bias {
            w.insert(&name(e, "down_proj", "bias"), vec![h], bias[e * h..(e + 1) * h].to_vec())?;
        }
    }
    Ok(())
}

/// Granite's MLP tensors as views of their rows under the names the loaders read:
/// `shared_mlp.input_linear` `[2 * shared, hidden]` (gate rows, then up) as `shared_mlp.gate_proj`
/// and `up_proj`, `output_linear` as `down_proj`; with experts, `block_sparse_moe.input_linear`
/// `[E, 2 * inter, hidden]` as each `experts.{e}.gate_proj` and `up_proj`, `output_linear`
/// `[E, hidden, inter]` as each `experts.{e}.down_proj`, and `router.layer` as `router`.
fn split_granite_mlps(w: &mut WeightStore, prefix: &str, cfg: &ModelConfig) -> Result<()> {
    type Views = Vec<(String, usize, usize, usize)>;
    let split = |w: &mut WeightStore, name: String, shape: &[usize], views: Views| -> Result<()> {
        if let Some(found) = w.shape(&name).filter(|found| *found != shape) {
            return Err(EngineError::ModelLoad(format!(
                "tensor {name} has shape {found:?}, but the model's config implies {shape:?}; the config does not match the weights"
            )));
        }
        w.split_rows(&name, &views)
    };
    let (h, shared) = (cfg.hidden_size, cfg.intermediate_size);
    let block = format!("{prefix}.shared_mlp");
    let gate_up = vec![(format!("{block}.gate_proj.weight"), 0, 1, shared), (format!("{block}.up_proj.weight"), shared, 1, shared)];
    split(w, format!("{block}.input_linear.weight"), &[2 * shared, h], gate_up)?;
    split(w, format!("{block}.output_linear.weight"), &[h, shared], vec![(format!("{block}.down_proj.weight"), 0, 1, h)])?;
    let Some(moe) = &cfg.moe else { return Ok(()) };
    let (experts, inter) = (moe.num_experts, moe.expert_intermediate_size);
    let block = format!("{prefix}.block_sparse_moe");
    let name = |e: usize, proj: &str| format!("{block}.experts.{e}.{proj}.weight");
    let gate_up = (0..experts).flat_map(|e| [(name(e, "gate_proj"), 2 * inter * e, 1, inter), (name(e, "up_proj"), 2 * inter * e + inter, 1, inter)]);
    split(w, format!("{block}.input_linear.weight"), &[experts, 2 * inter, h], gate_up.collect())?;
    let down = (0..experts).map(|e| (name(e, "down_proj"), h * e, 1, h));
    split(w, format!("{block}.output_linear.weight"), &[experts, h, inter], down.collect())?;
    split(w, format!("{block}.router.layer.weight"), &[experts, h], vec![(format!("{block}.router.weight"), 0, 1, experts)])
}

impl Experts {
    /// Routes each row to its top experts, runs every expert once on the rows it got (a GEMM
    /// split over the pool), and adds the results weighted by the routing, expert by expert in
    /// index order, so a row's result does not depend on the other rows; `lora`'s rows add their
    /// adapters' updates of the shared expert.
    fn forward(&self, c: &Compute, x: &[f32], lora: &[LoraRows]) -> Vec<f32> {
        let h = self.router.weight_in_features();
        let rows = x.len() / h;
        let logits = self.router.forward(c, x);
        let experts = self.experts.len();
        // (row, weight) per expert.
        let mut routed: Vec<Vec<(usize, f32)>> = vec![Vec::new(); experts];
        let mut router = Router::new(experts);
        for (row, logits) in logits.chunks_exact(experts).enumerate() {
            for (e, weight) in router.route(c, &self.routing, self.choice_bias.as_deref(), logits) {
                routed[e].push((row, weight));
            }
        }
        let mut out = vec![0.0; x.len()];
        let active: Vec<(&GatedMlp, &[(usize, f32)])> =
            self.experts.iter().zip(&routed).filter(|(_, assigned)| !assigned.is_empty()).map(|(expert, assigned)| (expert, assigned.as_slice())).collect();
        let gather = |assigned: &[(usize, f32)]| -> Vec<f32> { assigned.iter().flat_map(|&(row, _)| &x[row * h..(row + 1) * h]).copied().collect() };
        let mut combine = |assigned: &[(usize, f32)], y: &[f32]| {
            for (&(row, weight), yr) in assigned.iter().zip(y.chunks_exact(h)) {
                (c.kernels.axpy)(weight, yr, &mut out[row * h..(row + 1) * h]);
            }
        };
        if rows <= GROUPED_ROWS {
            let gathered: Vec<(&GatedMlp, Vec<f32>)> = active.iter().map(|&(expert, assigned)| (expert, gather(assigned))).collect();
            for ((_, assigned), y) in active.iter().zip(Self::forward_grouped(c, &gathered)) {
                combine(assigned, &y);
            }
        } else {
            // Expert by expert: a prefill's gathered rows and outputs, held for every expert at
            // once, would be the whole chunk times the experts each row takes.
            for &(expert, assigned) in &active {
                combine(assigned, &expert.forward(c, &gather(assigned)));
            }
        }
        if let Some((expert, gate)) = &self.shared {
            let (y, g) = (expert.forward_with_lora(c, x, lora), gate.as_ref().map(|gate| gate.forward(c, x)));
            for row in 0..rows {
                // The kernels' exp, not libm's: the same bits on every system.
                let weight = g.as_ref().map_or(1.0, |g| 1.0 / (1.0 + rsgl_kernels::portable::exp(-g[row])));
                (c.kernels.axpy)(weight, &y[row * h..(row + 1) * h], &mut out[row * h..(row + 1) * h]);
            }
        }
        out
    }

    /// The experts' feed-forwards on their gathered rows, each projection of all of them
    /// in one parallel region (three synchronization points a layer rather than two per expert:
    /// at batch 1 each expert's share of a thread is a few kilobytes of weights).
    fn forward_grouped(c: &Compute, active: &[(&GatedMlp, Vec<f32>)]) -> Vec<Vec<f32>> {
        let gate_ups = {
            let _phase = profile::phase(Phase::GateUpProjection);
            Linear::forward_group(c, &active.iter().map(|(expert, x)| (&expert.gate_up, x.as_slice())).collect::<Vec<_>>())
        };
        let mut acts: Vec<Vec<f32>> = gate_ups.iter().map(|gate_up| vec![0.0; gate_up.len() / 2]).collect();
        let activation = profile::phase(Phase::Activation);
        c.pool.for_chunks_mut(&mut acts, 1, &|i, act| active[i].0.activate(c, &gate_ups[i], &mut act[0]));
        drop(activation);
        let _phase = profile::phase(Phase::DownProjection);
        Linear::forward_group(c, &active.iter().zip(&acts).map(|((expert, _), act)| (&expert.down, act.as_slice())).collect::<Vec<_>>())
    }
}

/// One row's routing, with buffers reused across rows.
struct Router {
    scores: Vec<f32>,
    choice: Vec<f32>,
    best: Vec<(f32, u32)>,
}

impl Router {
    fn new(experts: usize) -> Router {
        Router { scores: vec![0.0; experts], choice: vec![0.0; experts], best: Vec::new() }
    }

    /// The experts a row with router `logits` goes to, with their weights: the top k by score
    /// (plus `choice_bias`) among the experts of its best groups, weighed by score, renormalized
    /// over the chosen where the config says, times the routed scaling factor.
    fn route(&mut self, c: &Compute, routing: &MoeConfig, choice_bias: Option<&[f32]>, logits: &[f32]) -> Vec<(usize, f32)> {
        self.scores.copy_from_slice(logits);
        match routing.scoring {
            ExpertScoring::Softmax => (c.kernels.softmax)(&mut self.scores),
            // The kernels' exp, not libm's: the same bits on every system.
            ExpertScoring::Sigmoid => self.scores.iter_mut().for_each(|s| *s = 1.0 / (1.0 + rsgl_kernels::portable::exp(-*s))),
        }
        self.choice.copy_from_slice(&self.scores);
        if let Some(bias) = choice_bias {
            self.choice.iter_mut().zip(bias).for_each(|(s, b)| *s += b);
        }
        if let Some(groups) = routing.expert_groups {
            let size = self.choice.len() / groups.groups;
            let group_scores: Vec<f32> = self
                .choice
                .chunks_exact(size)
                .map(|group| {
                    (c.kernels.top_k)(group, 2.min(size), &mut self.best);
                    match groups.score {
                        GroupScore::Best => self.best[0].0,
                        GroupScore::BestTwo => self.best.iter().map(|b| b.0).sum(),
                    }
                })
                .collect();
            (c.kernels.top_k)(&group_scores, groups.groups_per_token, &mut self.best);
            let mut kept = vec![false; groups.groups];
            self.best.iter().for_each(|&(_, g)| kept[g as usize] = true);
            for (group, kept) in self.choice.chunks_exact_mut(size).zip(kept) {
                if !kept {
                    group.fill(f32::NEG_INFINITY);
                }
            }
        }
        (c.kernels.top_k)(&self.choice, routing.experts_per_token, &mut self.best);
        let weights = self.best.iter().map(|&(_, e)| self.scores[e as usize]);
        let total: f32 = if routing.norm_topk_prob { weights.clone().sum() } else { 1.0 };
        weights.zip(&self.best).map(|(score, &(_, e))| (e as usize, score / total * routing.routed_scaling_factor)).collect()
    }
}
