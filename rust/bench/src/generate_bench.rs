//! `rsgl-bench generate`: offline greedy generation through the engine, at several batch sizes,
//! on a random-weight model of a preset's shape or on a model directory (config.json and
//! safetensors, see model_dir.rs).
//!
//! Prefill tok/s is batch·prompt_len over the time until every request has its first token;
//! decode tok/s is the tokens generated after that, over the batch, per second of the rest
//! (the same method as benches/bench_generate.py, so the two can be compared).

use crate::args::Args;
use crate::model_dir;
use crate::report::{host_info, print_table, write_json};
use rsgl_engine::sample::Rng;
use rsgl_engine::{Engine, EngineOptions, GenerateRequest, ModelConfig, RequestStream, WeightStore};
use rsgl_kernels::profile::{self, PhaseTotals};
use serde_json::{json, Value};
use std::path::PathBuf;
use std::time::{Duration, Instant};

const PAGE_SIZE: usize = 16;
/// How long one engine output may take before the run is declared stuck.
const OUTPUT_TIMEOUT: Duration = Duration::from_secs(600);

/// The model shape of a preset, as the loader would hand it to the engine.
fn preset_config(name: &str) -> Result<Value, String> {
    let (hidden, ffn, layers, heads, kv_heads, head_dim, vocab, theta, context, tied) = match name {
        "smollm2-135m" => (576, 1536, 30, 9, 3, 64, 49152, 1e5, 8192, true),
        // Llama-3.2-1B and Llama-3.1-8B with the default model's vocabulary, as
        // benches/synth_model.py writes them.
        "llama-1b" => (2048, 8192, 16, 32, 8, 64, 49152, 5e5, 131072, true),
        "llama-8b" => (4096, 14336, 32, 32, 8, 128, 49152, 5e5, 131072, false),
        // Small enough to build and run in a blink: checks the harness itself.
        "tiny" => (64, 128, 2, 4, 2, 16, 256, 1e4, 2048, true),
        other => return Err(format!("unknown preset {other:?}; use smollm2-135m, llama-1b, llama-8b or tiny")),
    };
    Ok(json!({
        "architecture": "llama", "hidden_size": hidden, "intermediate_size": ffn,
        "num_hidden_layers": layers, "num_attention_heads": heads, "num_key_value_heads": kv_heads,
        "head_dim": head_dim, "vocab_size": vocab, "rms_norm_eps": 1e-5, "rope_theta": theta,
        "rope_scaling": null, "attention_bias": false, "qk_norm": false,
        "tie_word_embeddings": tied, "max_position_embeddings": context,
    }))
}

/// Uniform in ±1/√fan_in, so activations stay in range through every layer; made up as the
/// engine packs them, so a preset of any size needs no more memory than its packed weights.
fn random_weights(cfg: &ModelConfig, rng: &mut Rng) -> Result<WeightStore, String> {
    let mut store = WeightStore::new();
    let mut add = |name: String, shape: Vec<usize>, random: bool| {
        let scale = 1.0 / (*shape.last().expect("tensors have a shape") as f32).sqrt();
        if random {
            store.insert_random(&name, shape, scale, rng.next_u64());
            Ok(())
        } else {
            let len = shape.iter().product();
            store.insert(&name, shape, vec![1.0; len]).map_err(|e| e.to_string())
        }
    };
    let (h, ffn, vocab) = (cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size);
    add("model.embed_tokens.weight".into(), vec![vocab, h], true)?;
    add("model.norm.weight".into(), vec![h], false)?;
    if !cfg.tie_word_embeddings {
        add("lm_head.weight".into(), vec![vocab, h], true)?;
    }
    for l in 0..cfg.num_hidden_layers {
        let p = format!("model.layers.{l}");
        add(format!("{p}.input_layernorm.weight"), vec![h], false)?;
        add(format!("{p}.post_attention_layernorm.weight"), vec![h], false)?;
        add(format!("{p}.self_attn.q_proj.weight"), vec![cfg.q_size(), h], true)?;
        add(format!("{p}.self_attn.k_proj.weight"), vec![cfg.kv_size(), h], true)?;
        add(format!("{p}.self_attn.v_proj.weight"), vec![cfg.kv_size(), h], true)?;
        add(format!("{p}.self_attn.o_proj.weight"), vec![h, cfg.q_size()], true)?;
        add(format!("{p}.mlp.gate_proj.weight"), vec![ffn, h], true)?;
        add(format!("{p}.mlp.up_proj.weight"), vec![ffn, h], true)?;
        add(format!("{p}.mlp.down_proj.weight"), vec![h, ffn], true)?;
    }
    Ok(store)
}

/// How the engine holds the weights: `--dtype`, `--quantization`, `--quantize-lm-head 1`,
/// `--activation-bits 16`.
struct Precision {
    dtype: String,
    quantization: Option<String>,
    quantize_lm_head: bool,
    activation_bits: usize,
    kv_cache_dtype: String,
}

impl Precision {
    fn describe(&self) -> String {
        let weights = match &self.quantization {
            None => self.dtype.clone(),
            Some(q) => format!("{q} ({} lm_head)", if self.quantize_lm_head { "int8".to_string() } else { self.dtype.clone() }),
        };
        let activations = if self.activation_bits == 16 { ", 16-bit block activations" } else { "" };
        format!("{weights}{activations}, KV cache {}", self.kv_cache_dtype)
    }
}

/// Tokens per request: prompt, then new tokens.
#[derive(Clone, Copy)]
struct Lengths {
    prompt: usize,
    generated: usize,
}

/// Options that fit `max_batch` requests in the KV pool at once, so none waits for pages.
/// `threads` compute threads over `tp` tensor-parallel ranks.
fn engine_options(len: Lengths, max_batch: usize, (threads, tp): (usize, usize), precision: &Precision) -> Result<EngineOptions, String> {
    let per_request = (len.prompt + len.generated).next_multiple_of(PAGE_SIZE);
    let opts = json!({
        "threads": threads,
        "tp_size": tp,
        "dtype": precision.dtype,
        "quantization": precision.quantization,
        "quantize_lm_head": precision.quantize_lm_head,
        "activation_bits": precision.activation_bits,
        "page_size": PAGE_SIZE,
        "kv_cache_dtype": precision.kv_cache_dtype,
        "context_length": len.prompt + len.generated,
        "max_total_tokens": max_batch * per_request,
        "max_running_requests": max_batch,
        // Each case runs its prompts twice (to the first token, then to the end): a prefix cache
        // would skip the second prefill and inflate decode.
        "disable_radix_cache": true,
    });
    EngineOptions::from_json(&opts.to_string()).map_err(|e| e.to_string())
}

fn request(rid: &str, prompt: &[u32], max_new_tokens: usize) -> Result<GenerateRequest, String> {
    let req = json!({
        "rid": rid,
        "input_ids": prompt,
        "sampling_params": { "temperature": 0, "max_new_tokens": max_new_tokens, "ignore_eos": true },
    });
    GenerateRequest::from_json(&req.to_string()).map_err(|e| e.to_string())
}

/// Waits for a request to finish; returns how many tokens it generated.
fn drain(mut stream: RequestStream) -> Result<usize, String> {
    let mut tokens = 0;
    loop {
        let out = stream
            .next(OUTPUT_TIMEOUT)
            .map_err(|e| format!("request {}: {e}", stream.rid))?
            .ok_or_else(|| format!("request {}: no output within {OUTPUT_TIMEOUT:?}", stream.rid))?;
        tokens += out.token_ids.len();
        if out.finished.is_some() {
            return Ok(tokens);
        }
    }
}

/// Seconds from submitting one request per prompt, all at once, until the last one finishes.
fn time_batch(engine: &Engine, prompts: &[Vec<u32>], new_tokens: usize) -> Result<f64, String> {
    let requests =
        prompts.iter().enumerate().map(|(i, p)| request(&format!("b{}-n{new_tokens}-{i}", prompts.len()), p, new_tokens)).collect::<Result<Vec<_>, _>>()?;
    let start = Instant::now();
    let streams = requests.into_iter().map(|r| engine.submit(r).map_err(|e| e.to_string())).collect::<Result<Vec<_>, _>>()?;
    for stream in streams {
        let tokens = drain(stream)?;
        if tokens != new_tokens {
            return Err(format!("a request generated {tokens} tokens instead of {new_tokens}"));
        }
    }
    Ok(start.elapsed().as_secs_f64())
}

struct CaseResult {
    batch: usize,
    prompt_len: usize,
    ttft: f64,
    decode_seconds: f64,
    decoded_tokens: usize,
    /// With --profile: the decode steps counted and each phase's totals over them.
    profile: Option<(u64, Vec<PhaseTotals>)>,
}

impl CaseResult {
    fn prefill_tok_s(&self) -> f64 {
        (self.batch * self.prompt_len) as f64 / self.ttft
    }

    fn decode_tok_s(&self) -> f64 {
        self.decoded_tokens as f64 / self.decode_seconds
    }

    /// Mean time of one decode step (each step decodes the whole batch).
    fn ms_per_step(&self) -> f64 {
        self.decode_seconds * 1e3 / (self.decoded_tokens as f64 / self.batch as f64)
    }

    fn row(&self) -> Vec<String> {
        vec![
            self.batch.to_string(),
            format!("{:.1}", self.ttft * 1e3),
            format!("{:.1}", self.prefill_tok_s()),
            format!("{:.1}", self.decode_tok_s()),
            format!("{:.2}", self.ms_per_step()),
        ]
    }

    fn json(&self) -> Value {
        json!({
            "batch": self.batch,
            "ttft_s": self.ttft,
            "prefill_tok_s": self.prefill_tok_s(),
            "decode_s": self.decode_seconds,
            "decoded_tokens": self.decoded_tokens,
            "decode_tok_s": self.decode_tok_s(),
            "ms_per_decode_step": self.ms_per_step(),
            "decode_profile": self.profile.as_ref().map(|(steps, phases)| json!({
                "steps": steps,
                "phases": phases.iter().map(|p| json!({
                    "phase": p.phase.name(), "seconds": p.seconds, "regions": p.regions,
                    "wait_seconds": p.wait_seconds, "bytes": p.bytes,
                })).collect::<Vec<_>>(),
            })),
        })
    }
}

/// Times the batch twice on the same prompts: up to the first token, then to the last. The
/// difference is the decode time, taken from whole runs because a thread woken per token can be
/// late (the compute threads hold every core), which would blur steps shorter than a millisecond.
/// With `profiled`, the second run's decode steps are profiled by phase.
fn run_case(engine: &Engine, batch: usize, len: Lengths, vocab: usize, rng: &mut Rng, profiled: bool) -> Result<CaseResult, String> {
    let prompts: Vec<Vec<u32>> = (0..batch).map(|_| random_prompt(rng, len.prompt, vocab)).collect();
    let ttft = time_batch(engine, &prompts, 1)?;
    profile::reset();
    profile::enable(profiled);
    let total = time_batch(engine, &prompts, len.generated);
    profile::enable(false);
    let profile = profiled.then(|| profile::totals(true));
    Ok(CaseResult { batch, prompt_len: len.prompt, ttft, decode_seconds: total? - ttft, decoded_tokens: batch * (len.generated - 1), profile })
}

/// Prints a case's decode profile: per step, each phase's time, parallel regions, the caller's
/// wait at their ends and bytes read; with `membw` (GB/s), the step's bytes as a share of it.
fn print_profile(case: &CaseResult, membw: Option<f64>) {
    let Some((steps, phases)) = &case.profile else { return };
    if *steps == 0 {
        return;
    }
    let per_step = |x: f64| x / *steps as f64;
    let step = PhaseTotals {
        phase: profile::Phase::Engine, // unused: the step's row is named below
        seconds: phases.iter().map(|p| p.seconds).sum(),
        regions: phases.iter().map(|p| p.regions).sum(),
        wait_seconds: phases.iter().map(|p| p.wait_seconds).sum(),
        bytes: phases.iter().map(|p| p.bytes).sum(),
    };
    println!("\ndecode profile, batch {}: {steps} steps of {:.3} ms", case.batch, per_step(step.seconds) * 1e3);
    let row = |name: &str, p: &PhaseTotals| {
        vec![
            name.to_string(),
            format!("{:.3}", per_step(p.seconds) * 1e3),
            format!("{:.1}%", 100.0 * p.seconds / step.seconds),
            format!("{:.1}", per_step(p.regions as f64)),
            format!("{:.3}", per_step(p.wait_seconds) * 1e3),
            format!("{:.2}", per_step(p.bytes as f64) / 1e6),
            if p.bytes > 0 { format!("{:.1}", p.bytes as f64 / p.seconds / 1e9) } else { String::new() },
        ]
    };
    let mut rows: Vec<Vec<String>> = phases.iter().filter(|p| p.seconds > 0.0).map(|p| row(p.phase.name(), p)).collect();
    rows.push(row("step", &step));
    print_table(&["phase", "ms/step", "share", "regions/step", "wait ms/step", "MB/step", "GB/s"], &rows);
    if let Some(gbps) = membw {
        let floor = per_step(step.bytes as f64) / (gbps * 1e9);
        println!("at {gbps:.1} GB/s the step's bytes take {:.3} ms: {:.0}% of the limit", floor * 1e3, 100.0 * floor / per_step(step.seconds));
    }
}

fn random_prompt(rng: &mut Rng, len: usize, vocab: usize) -> Vec<u32> {
    (0..len).map(|_| (rng.next_u64() % vocab as u64) as u32).collect()
}

/// Where the benchmarked model comes from.
enum ModelSource {
    Preset(String),
    Dir(PathBuf),
}

impl ModelSource {
    fn from_args(args: &mut Args) -> Result<ModelSource, String> {
        match (args.string("preset"), args.string("model-dir")) {
            (Some(_), Some(_)) => Err("give --preset or --model-dir, not both".into()),
            (_, Some(dir)) => Ok(ModelSource::Dir(dir.into())),
            (preset, None) => Ok(ModelSource::Preset(preset.unwrap_or_else(|| "smollm2-135m".into()))),
        }
    }

    fn describe(&self) -> String {
        match self {
            ModelSource::Preset(name) => format!("preset {name} (random weights)"),
            ModelSource::Dir(dir) => format!("model directory {}", dir.display()),
        }
    }

    fn json(&self) -> Value {
        match self {
            ModelSource::Preset(name) => json!({ "preset": name }),
            ModelSource::Dir(dir) => json!({ "model_dir": dir }),
        }
    }

    /// The normalized config, the weights and the tensor types they were stored in.
    fn load(&self, rng: &mut Rng) -> Result<(Value, WeightStore, Vec<String>), String> {
        match self {
            ModelSource::Preset(name) => {
                let config = preset_config(name)?;
                let weights = random_weights(&parse_config(&config)?, rng)?;
                Ok((config, weights, vec!["F32".into()]))
            }
            ModelSource::Dir(dir) => {
                let loaded = model_dir::load(dir)?;
                Ok((loaded.config, loaded.weights, loaded.stored_dtypes.into_iter().collect()))
            }
        }
    }
}

fn parse_config(config: &Value) -> Result<ModelConfig, String> {
    ModelConfig::from_json(&config.to_string()).map_err(|e| e.to_string())
}

pub fn run(mut args: Args) -> Result<(), String> {
    let source = ModelSource::from_args(&mut args)?;
    let batches = args.usize_list_or("batch", &[1, 8])?;
    let len = Lengths { prompt: args.usize_or("prompt-len", 128)?, generated: args.usize_or("gen-len", 32)? };
    let threads = args.usize_or("threads", std::thread::available_parallelism().map_or(1, |n| n.get()))?;
    let tp = args.usize_or("tp", 1)?;
    let precision = Precision {
        dtype: args.string("dtype").unwrap_or_else(|| "float32".into()),
        quantization: args.string("quantization"),
        quantize_lm_head: args.string("quantize-lm-head").is_some_and(|v| v == "1" || v == "true"),
        activation_bits: args.usize_or("activation-bits", 8)?,
        kv_cache_dtype: args.string("kv-cache-dtype").unwrap_or_else(|| "float32".into()),
    };
    let profiled = args.string("profile").is_some_and(|v| v == "1" || v == "true");
    let membw = args.string("membw").map(|v| v.parse::<f64>().map_err(|_| format!("--membw: {v:?} is not a number of GB/s"))).transpose()?;
    let json_path = args.string("json");
    args.finish()?;
    if len.generated < 2 {
        return Err("--gen-len must be at least 2: decode speed is measured after the first token".into());
    }

    let mut rng = Rng::new(2024);
    let load_started = Instant::now();
    let (config, weights, stored_dtypes) = source.load(&mut rng)?;
    let cfg = parse_config(&config)?;
    let vocab = cfg.vocab_size;
    let max_batch = *batches.iter().max().expect("the list parser yields at least one");
    let opts = engine_options(len, max_batch, (threads, tp), &precision)?;
    let engine = Engine::start(cfg, weights, None, vec![], opts).map_err(|e| e.to_string())?;
    let load_seconds = load_started.elapsed().as_secs_f64();
    let stats = engine.stats();
    println!(
        "rsgl-bench generate: {}, weights stored as {}, held as {}, kernels {} (int8: {}), {} thread(s) over {} tensor-parallel rank(s), prompt {} + {} new tokens (loaded in {load_seconds:.1} s)",
        source.describe(),
        stored_dtypes.join("/"),
        precision.describe(),
        stats.kernels,
        stats.int8_kernels,
        stats.threads,
        stats.tp_size,
        len.prompt,
        len.generated
    );

    // Warm-up: pages, caches and the thread pool see one request before anything is timed.
    run_case(&engine, 1, Lengths { generated: 2, ..len }, vocab, &mut rng, false)?;
    let results = batches.iter().map(|&b| run_case(&engine, b, len, vocab, &mut rng, profiled)).collect::<Result<Vec<_>, _>>()?;

    let rows: Vec<Vec<String>> = results.iter().map(CaseResult::row).collect();
    print_table(&["batch", "TTFT ms", "prefill tok/s", "decode tok/s", "ms/step"], &rows);
    results.iter().for_each(|case| print_profile(case, membw));
    if let Some(path) = json_path {
        let report = json!({
            "bench": "generate",
            "host": host_info(),
            "source": source.json(),
            "stored_dtypes": stored_dtypes,
            "model": config,
            "kernels": stats.kernels,
            "dtype": stats.dtype,
            "quantization": stats.quantization,
            "quantize_lm_head": precision.quantize_lm_head,
            "int8_kernels": stats.int8_kernels,
            "threads": stats.threads,
            "tp_size": stats.tp_size,
            "prompt_len": len.prompt,
            "gen_len": len.generated,
            "load_seconds": load_seconds,
            "results": results.iter().map(CaseResult::json).collect::<Vec<_>>(),
        });
        write_json(&path, &report)?;
    }
    Ok(())
}
