use super::*;
use rsgl_kernels::packed::{f16_to_f32, f32_to_f16};
use serde_json::{json, Map};

/// A file under the temp dir, removed on drop.
pub(crate) struct TempFile(pub(crate) PathBuf);

impl TempFile {
    pub(crate) fn new(name: &str, bytes: &[u8]) -> TempFile {
        let path = std::env::temp_dir().join(format!("rsgl-weights-{}-{name}", std::process::id()));
        std::fs::write(&path, bytes).unwrap();
        TempFile(path)
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn le_bytes<const N: usize, T: Copy>(values: &[T], to_bytes: fn(T) -> [u8; N]) -> Vec<u8> {
    values.iter().flat_map(|&v| to_bytes(v)).collect()
}

/// A safetensors file holding `tensors` as (name, dtype, shape, raw bytes).
fn safetensors(tensors: &[(&str, &str, Vec<usize>, Vec<u8>)]) -> Vec<u8> {
    let mut header = Map::new();
    let mut data = Vec::new();
    for (name, dtype, shape, bytes) in tensors {
        header.insert(name.to_string(), json!({ "dtype": dtype, "shape": shape, "data_offsets": [data.len(), data.len() + bytes.len()] }));
        data.extend_from_slice(bytes);
    }
    header.insert("__metadata__".into(), json!({ "format": "pt" }));
    let header = serde_json::to_vec(&header).unwrap();
    [(header.len() as u64).to_le_bytes().to_vec(), header, data].concat()
}

/// A GGUF v3 file with no metadata holding `tensors` as (name, dims innermost first, type id,
/// raw bytes), data aligned to 32 bytes.
fn gguf(tensors: &[(&str, Vec<u64>, u32, Vec<u8>)]) -> Vec<u8> {
    gguf_with_metadata(&Map::new(), tensors)
}

/// A GGUF v3 file holding `metadata` (strings, booleans, whole numbers as u32 and other numbers
/// as f32, as llama.cpp's converter writes them) and `tensors`, as `gguf` does.
pub(crate) fn gguf_with_metadata(metadata: &Map<String, serde_json::Value>, tensors: &[(&str, Vec<u64>, u32, Vec<u8>)]) -> Vec<u8> {
    let string = |s: &str| [(s.len() as u64).to_le_bytes().to_vec(), s.as_bytes().to_vec()].concat();
    let mut out = b"GGUF".to_vec();
    out.extend(3u32.to_le_bytes());
    out.extend((tensors.len() as u64).to_le_bytes());
    out.extend((metadata.len() as u64).to_le_bytes());
    for (key, value) in metadata {
        out.extend(string(key));
        match value {
            serde_json::Value::String(text) => out.extend([8u32.to_le_bytes().to_vec(), string(text)].concat()),
            serde_json::Value::Bool(flag) => out.extend([7u32.to_le_bytes().to_vec(), vec![u8::from(*flag)]].concat()),
            number => match number.as_u64() {
                Some(whole) => out.extend([4u32.to_le_bytes(), (whole as u32).to_le_bytes()].concat()),
                None => out.extend([6u32.to_le_bytes(), (number.as_f64().expect("a number") as f32).to_le_bytes()].concat()),
            },
        }
    }
    let mut data: Vec<u8> = Vec::new();
    for (name, dims, kind, bytes) in tensors {
        out.extend((name.len() as u64).to_le_bytes());
        out.extend(name.as_bytes());
        out.extend((dims.len() as u32).to_le_bytes());
        dims.iter().for_each(|d| out.extend(d.to_le_bytes()));
        out.extend(kind.to_le_bytes());
        out.extend((data.len() as u64).to_le_bytes());
        data.extend(bytes);
        data.resize(data.len().next_multiple_of(32), 0);
    }
    out.resize(out.len().next_multiple_of(32), 0);
    [out, data].concat()
}

fn error_text<T>(result: Result<T>) -> String {
    match result {
        Ok(_) => panic!("expected an error"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn reads_every_safetensors_dtype_by_rows() {
    let file = TempFile::new(
        "dtypes.safetensors",
        &safetensors(&[
            ("a", "F32", vec![2], le_bytes(&[1.5f32, -3.0], f32::to_le_bytes)),
            ("b", "BF16", vec![1, 2], le_bytes(&[0x3f80u16, 0x4000], u16::to_le_bytes)),
            ("c", "F16", vec![2, 1], le_bytes(&[0x3800u16, 0xbc00], u16::to_le_bytes)),
            ("q.weight", "I8", vec![2, 3], vec![1, 2, 3, 0xff, 0x81, 0]),
            ("q.weight_scale", "F32", vec![2, 1], le_bytes(&[0.5f32, 2.0], f32::to_le_bytes)),
            ("model.rotary_emb.inv_freq", "F32", vec![1], vec![0; 4]),
        ]),
    );
    let mut store = WeightStore::open_safetensors(std::slice::from_ref(&file.0)).unwrap();
    assert_eq!(store.names(), ["a", "b", "c", "q.weight", "q.weight_scale"], "old rotary buffers are skipped");
    assert_eq!(store.stored("q.weight"), Some(Stored::Int8));
    assert_eq!((store.read("a").unwrap(), store.read("b").unwrap(), store.read("c").unwrap()), (vec![1.5, -3.0], vec![1.0, 2.0], vec![0.5, -1.0]));
    assert_eq!(store.read("q.weight").unwrap(), [0.5, 1.0, 1.5, -2.0, -254.0, 0.0]);
    let q = store.take_matrix("q.weight", 2, 3).unwrap();
    let mut row = [0i8; 3];
    assert_eq!(q.read_i8(1, &mut row), Some(2.0));
    assert_eq!(row, [-1, -127, 0]);
    assert_eq!(store.names(), ["a", "b", "c"], "an int8 weight takes its scales along");
    let c = store.take_matrix("c", 2, 1).unwrap();
    assert_eq!(c.read_i8(0, &mut [0]), None);
}

#[test]
fn broken_safetensors_name_the_file_or_tensor() {
    let good = safetensors(&[("a", "F32", vec![2], vec![0; 8])]);
    let truncated = TempFile::new("truncated.safetensors", &good[..good.len() - 1]);
    let text = error_text(WeightStore::open_safetensors(std::slice::from_ref(&truncated.0)));
    assert!(text.contains("truncated.safetensors is corrupt or truncated") && text.contains("download it again"), "{text}");
    let wrong_dtype = TempFile::new("i32.safetensors", &safetensors(&[("ids", "I32", vec![1], vec![0; 4])]));
    let text = error_text(WeightStore::open_safetensors(std::slice::from_ref(&wrong_dtype.0)));
    assert!(text.contains("i32.safetensors: tensor ids is stored as I32"), "{text}");
    let missing = error_text(WeightStore::open_safetensors(&[std::env::temp_dir().join("rsgl-no-such-shard.safetensors")]));
    assert!(missing.contains("cannot read") && missing.contains("rsgl-no-such-shard.safetensors"), "{missing}");

    let file = TempFile::new("good.safetensors", &good);
    let mut store = WeightStore::open_safetensors(std::slice::from_ref(&file.0)).unwrap();
    let text = error_text(store.take_matrix("a", 2, 1));
    assert!(text.contains("good.safetensors: tensor a has shape [2]"), "{text}");
    // Leading 1s aside, the shapes agree (llama.cpp's quantizer writes [1, n] tensors as [n]).
    assert_eq!(store.take_matrix("a", 1, 2).unwrap().rows(), 1);
    let text = error_text(store.take("b", &[2]));
    assert!(text.contains("good.safetensors) has no tensor b"), "{text}");
}

#[test]
fn the_mapping_goes_with_the_store() {
    let file = TempFile::new("unmapped.safetensors", &safetensors(&[("a", "F32", vec![2], vec![0; 8])]));
    let mapped = || std::fs::read_to_string("/proc/self/maps").unwrap().contains(file.0.to_str().unwrap());
    let mut store = WeightStore::open_safetensors(std::slice::from_ref(&file.0)).unwrap();
    let rows = store.take_matrix("a", 1, 2);
    let _ = store.take("a", &[2]); // already taken: an error
    assert!(mapped());
    drop((store, rows));
    assert!(!mapped(), "nothing stays mapped once the store and its matrices are gone");
}

/// llama.cpp's q/k permutation: each head's rows `[half 0 | half 1]` interleaved pairwise.
pub(crate) fn interleave_heads(rows: &[Vec<f32>], head_dim: usize) -> Vec<Vec<f32>> {
    let half = head_dim / 2;
    let mut out = rows.to_vec();
    for (r, row) in rows.iter().enumerate() {
        let (head, within) = (r / head_dim, r % head_dim);
        out[head * head_dim + 2 * (within % half) + within / half] = row.clone();
    }
    out
}

#[test]
fn gguf_tensors_come_out_in_hugging_face_names_and_layout() {
    let (heads, kv_heads, head_dim, hidden) = (2, 1, 4, 3);
    let matrix = |rows: usize, base: f32| (0..rows).map(|r| (0..hidden).map(|c| base + (r * hidden + c) as f32).collect::<Vec<f32>>()).collect::<Vec<_>>();
    let f32_bytes = |rows: &[Vec<f32>]| le_bytes(&rows.concat(), f32::to_le_bytes);
    let q = matrix(heads * head_dim, 0.0);
    let k = matrix(kv_heads * head_dim, 100.0);
    // Two experts of two rows each, stacked: [experts, rows, cols] is dims [cols, rows, experts].
    let experts = matrix(4, 200.0);
    let file = TempFile::new(
        "layout.gguf",
        &gguf(&[
            ("blk.0.attn_q.weight", vec![hidden as u64, (heads * head_dim) as u64], 0, f32_bytes(&interleave_heads(&q, head_dim))),
            ("blk.0.attn_k.weight", vec![hidden as u64, (kv_heads * head_dim) as u64], 0, f32_bytes(&interleave_heads(&k, head_dim))),
            ("blk.0.ffn_up_exps.weight", vec![hidden as u64, 2, 2], 0, f32_bytes(&experts)),
            ("output_norm.weight", vec![hidden as u64], 0, f32_bytes(&[vec![1.0, 2.0, 3.0]])),
            ("rope_freqs.weight", vec![2], 0, f32_bytes(&[vec![1.0, 1.0]])),
        ]),
    );
    let store = WeightStore::open_gguf(&file.0, "mixtral", heads, kv_heads).unwrap();
    assert_eq!(
        store.names(),
        [
            "model.layers.0.block_sparse_moe.experts.0.w3.weight",
            "model.layers.0.block_sparse_moe.experts.1.w3.weight",
            "model.layers.0.self_attn.k_proj.weight",
            "model.layers.0.self_attn.q_proj.weight",
            "model.norm.weight",
            "rope_freqs.weight",
        ]
    );
    assert_eq!(store.read("model.layers.0.self_attn.q_proj.weight").unwrap(), q.concat());
    assert_eq!(store.read("model.layers.0.self_attn.k_proj.weight").unwrap(), k.concat());
    assert_eq!(store.read("model.layers.0.block_sparse_moe.experts.1.w3.weight").unwrap(), experts[2..].concat());
    assert_eq!(store.shape("model.layers.0.block_sparse_moe.experts.1.w3.weight"), Some(&[2, hidden][..]));
    // Qwen files keep their rows in order, and name experts as Qwen MoE checkpoints do.
    let store = WeightStore::open_gguf(&file.0, "qwen3_moe", heads, kv_heads).unwrap();
    assert_eq!(store.read("model.layers.0.self_attn.q_proj.weight").unwrap(), interleave_heads(&q, head_dim).concat());
    assert!(store.contains("model.layers.0.mlp.experts.1.up_proj.weight"));
}

#[test]
fn gpt_oss_gguf_tensors_come_out_as_its_hugging_face_parameters() {
    let hidden = 2;
    let f32_bytes = |values: &[f32]| le_bytes(values, f32::to_le_bytes);
    // Two experts' biases of three rows, stacked: [experts, rows] is dims [rows, experts].
    let gate_bias = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
    let file = TempFile::new(
        "gpt-oss.gguf",
        &gguf(&[
            ("blk.0.attn_sinks.weight", vec![2], 0, f32_bytes(&[0.5, -0.5])),
            ("blk.0.post_attention_norm.weight", vec![hidden], 0, f32_bytes(&[1.0, 2.0])),
            ("blk.0.ffn_gate_exps.bias", vec![3, 2], 0, f32_bytes(&gate_bias)),
            ("blk.0.ffn_gate_inp.bias", vec![2], 0, f32_bytes(&[7.0, 8.0])),
        ]),
    );
    let store = WeightStore::open_gguf(&file.0, "gpt_oss", 2, 1).unwrap();
    assert_eq!(
        store.names(),
        [
            "model.layers.0.mlp.experts.0.gate_proj.bias",
            "model.layers.0.mlp.experts.1.gate_proj.bias",
            "model.layers.0.mlp.gate.bias",
            "model.layers.0.post_attention_layernorm.weight",
            "model.layers.0.self_attn.sinks",
        ]
    );
    assert_eq!(store.read("model.layers.0.mlp.experts.1.gate_proj.bias").unwrap(), gate_bias[3..]);
    assert_eq!(store.shape("model.layers.0.mlp.experts.1.gate_proj.bias"), Some(&[3][..]));
    assert_eq!(store.read("model.layers.0.self_attn.sinks").unwrap(), [0.5, -0.5]);
}

/// Qwen3-Next as llama.cpp's converter writes it: a Gated DeltaNet layer (whose `attn_qkv` is the
/// DeltaNet's, not an attention's fused projection), an attention layer, and a multi-token
/// prediction layer appended, which is left out.
#[test]
fn hybrid_gguf_tensors_come_out_as_their_hugging_face_parameters() {
    let f32_bytes = |values: &[f32]| le_bytes(values, f32::to_le_bytes);
    let metadata = serde_json::json!({ "general.architecture": "qwen3next", "qwen3next.block_count": 3, "qwen3next.nextn_predict_layers": 1 });
    let taps = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
    let file = TempFile::new(
        "qwen3next.gguf",
        &gguf_with_metadata(
            metadata.as_object().unwrap(),
            &[
                ("blk.0.attn_qkv.weight", vec![2, 3], 0, f32_bytes(&[0.0; 6])),
                ("blk.0.attn_gate.weight", vec![2, 1], 0, f32_bytes(&[0.0; 2])),
                ("blk.0.ssm_ba.weight", vec![2, 2], 0, f32_bytes(&[0.0; 4])),
                ("blk.0.ssm_a", vec![1], 0, f32_bytes(&[-2.0])),
                ("blk.0.ssm_dt.bias", vec![1], 0, f32_bytes(&[0.5])),
                // [channels, taps]: dims [taps, channels].
                ("blk.0.ssm_conv1d.weight", vec![2, 3], 0, f32_bytes(&taps)),
                ("blk.0.ssm_norm.weight", vec![1], 0, f32_bytes(&[1.0])),
                ("blk.0.ssm_out.weight", vec![1, 2], 0, f32_bytes(&[0.0; 2])),
                ("blk.1.attn_q.weight", vec![2, 2], 0, f32_bytes(&[0.0; 4])),
                ("blk.2.attn_q.weight", vec![2, 2], 0, f32_bytes(&[0.0; 4])),
                ("blk.2.nextn.eh_proj.weight", vec![4, 2], 0, f32_bytes(&[0.0; 8])),
            ],
        ),
    );
    let store = WeightStore::open_gguf(&file.0, "qwen3_next", 1, 1).unwrap();
    let linear_attn = |name: &str| format!("model.layers.0.linear_attn.{name}");
    let mut want: Vec<String> =
        ["A", "conv1d.weight", "dt_bias", "in_proj_ba.weight", "in_proj_qkv.weight", "in_proj_z.weight", "norm.weight", "out_proj.weight"]
            .iter()
            .map(|name| linear_attn(name))
            .collect();
    want.push("model.layers.1.self_attn.q_proj.weight".into());
    assert_eq!(store.names(), want);
    assert_eq!(store.shape(&linear_attn("conv1d.weight")), Some(&[3, 1, 2][..]));
    assert_eq!(store.read(&linear_attn("conv1d.weight")).unwrap(), taps);
    assert_eq!(store.read(&linear_attn("A")).unwrap(), [-2.0]);
    // Earlier converters' one input projection is refused, saying what to do.
    let fused = TempFile::new(
        "qwen3next-ssm-in.gguf",
        &gguf(&[("blk.0.ssm_in.weight", vec![2, 4], 0, f32_bytes(&[0.0; 8])), ("blk.0.ssm_a", vec![1], 0, f32_bytes(&[-2.0]))]),
    );
    let text = error_text(WeightStore::open_gguf(&fused.0, "qwen3_next", 1, 1));
    assert!(text.contains("blk.0.ssm_in.weight") && text.contains("convert the model again"), "{text}");
}

/// llama.cpp's projector file of SmolVLM: its tower's and connector's tensors under Hugging Face
/// names and layout beside the language model's; a name it does not know kept as it is.
#[test]
fn a_projector_file_reads_as_the_vision_tower_of_the_hugging_face_checkpoint() {
    let f32_bytes = |values: &[f32]| le_bytes(values, f32::to_le_bytes);
    let model = TempFile::new("vlm.gguf", &gguf(&[("output_norm.weight", vec![2], 0, f32_bytes(&[1.0, 2.0]))]));
    let values: Vec<f32> = (0..6).map(|v| v as f32).collect();
    let tensors = [
        ("v.patch_embd.weight", vec![1, 1, 3, 2], 0, f32_bytes(&values)),
        ("v.blk.1.attn_out.bias", vec![2], 0, f32_bytes(&[5.0, 6.0])),
        ("v.blk.0.ffn_down.weight", vec![3, 2], 0, f32_bytes(&values)),
        ("mm.model.fc.weight", vec![3, 2], 0, f32_bytes(&values)),
        ("v.post_ln.weight", vec![2], 0, f32_bytes(&[7.0, 8.0])),
        ("v.unknown.weight", vec![2], 0, f32_bytes(&[0.0, 0.0])),
    ];
    let metadata = json!({"clip.projector_type": "idefics3"});
    let projector = TempFile::new("mmproj-vlm.gguf", &gguf_with_metadata(metadata.as_object().unwrap(), &tensors));
    let mut store = WeightStore::open_gguf(&model.0, "llama", 1, 1).unwrap();
    store.add_gguf_projector(&projector.0).unwrap();
    let shapes: Vec<(&str, &[usize])> = store.names().into_iter().map(|name| (name, store.shape(name).unwrap())).collect();
    assert_eq!(
        shapes,
        [
            ("model.connector.modality_projection.proj.weight", &[2, 3][..]),
            ("model.norm.weight", &[2]),
            ("model.vision_model.embeddings.patch_embedding.weight", &[2, 3, 1, 1]),
            ("model.vision_model.encoder.layers.0.mlp.fc2.weight", &[2, 3]),
            ("model.vision_model.encoder.layers.1.self_attn.out_proj.bias", &[2]),
            ("model.vision_model.post_layernorm.weight", &[2]),
            ("v.unknown.weight", &[2]),
        ]
    );
    assert_eq!(store.read("model.vision_model.encoder.layers.0.mlp.fc2.weight").unwrap(), values);
    let text = error_text(store.add_gguf_projector(&projector.0));
    assert!(text.contains("both hold"), "{text}");
}

/// Gemma 3's projector file: its norm and its F16 projection (`[vision, text]` as GGUF writes
/// `[text, vision]` innermost first) under the Hugging Face checkpoint's names and layout.
#[test]
fn a_gemma3_projector_file_reads_as_the_hugging_face_projector() {
    let model = TempFile::new("gemma3.gguf", &gguf(&[("output_norm.weight", vec![2], 0, le_bytes(&[1.0f32, 2.0], f32::to_le_bytes))]));
    let projection: Vec<f32> = (0..6).map(|v| v as f32 / 4.0).collect();
    let metadata = json!({"clip.projector_type": "gemma3"});
    let projector = TempFile::new(
        "mmproj-gemma3.gguf",
        &gguf_with_metadata(
            metadata.as_object().unwrap(),
            &[
                ("mm.input_projection.weight", vec![3, 2], 1, le_bytes(&projection.iter().map(|&v| f32_to_f16(v)).collect::<Vec<_>>(), u16::to_le_bytes)),
                ("mm.soft_emb_norm.weight", vec![2], 0, le_bytes(&[1.5f32, 0.5], f32::to_le_bytes)),
            ],
        ),
    );
    let mut store = WeightStore::open_gguf(&model.0, "llama", 1, 1).unwrap();
    store.add_gguf_projector(&projector.0).unwrap();
    let projection_name = "model.multi_modal_projector.mm_input_projection_weight";
    assert_eq!(store.shape(projection_name).unwrap(), [2, 3]);
    assert_eq!(store.read(projection_name).unwrap(), projection);
    assert_eq!(store.read("model.multi_modal_projector.mm_soft_emb_norm.weight").unwrap(), [1.5, 0.5]);
}

/// Qwen2.5-VL's projector file: the two frames' patch convolutions stacked back into the 3D one
/// (`[out, channels, frames, rows, columns]`), q, k and v under their own names, the merger's
/// tensors under the checkpoint's; a file missing a frame, or whose frames differ in shape, is refused.
#[test]
fn a_qwen2_5_vl_projector_file_reads_as_its_checkpoints_tower() {
    let f32_bytes = |values: &[f32]| le_bytes(values, f32::to_le_bytes);
    let model = TempFile::new("qwen-vl.gguf", &gguf(&[("output_norm.weight", vec![2], 0, f32_bytes(&[1.0, 2.0]))]));
    // Frames of [out 2, channels 1, 1 x 2 pixels]: frame 0 holds 0..4, frame 1 holds 10..14.
    let frame = |first: f32| f32_bytes(&[first, first + 1.0, first + 2.0, first + 3.0]);
    let metadata = json!({"clip.projector_type": "qwen2.5vl_merger"});
    let tensors = [
        ("v.patch_embd.weight.1", vec![2, 1, 1, 2], 0, frame(10.0)),
        ("v.patch_embd.weight", vec![2, 1, 1, 2], 0, frame(0.0)),
        ("v.blk.0.attn_k.bias", vec![2], 0, f32_bytes(&[5.0, 6.0])),
        ("v.blk.0.ffn_gate.weight", vec![2, 3], 0, f32_bytes(&[0.0; 6])),
        ("v.blk.0.ln1.weight", vec![2], 0, f32_bytes(&[1.0; 2])),
        ("v.post_ln.weight", vec![2], 0, f32_bytes(&[7.0, 8.0])),
        ("mm.2.weight", vec![8, 2], 0, f32_bytes(&[0.0; 16])),
    ];
    let projector = TempFile::new("mmproj-qwen-vl.gguf", &gguf_with_metadata(metadata.as_object().unwrap(), &tensors));
    let mut store = WeightStore::open_gguf(&model.0, "qwen2_5_vl_text", 1, 1).unwrap();
    store.add_gguf_projector(&projector.0).unwrap();
    let shapes: Vec<(&str, &[usize])> = store.names().into_iter().map(|name| (name, store.shape(name).unwrap())).collect();
    assert_eq!(
        shapes,
        [
            ("model.norm.weight", &[2][..]),
            ("visual.blocks.0.attn.k.bias", &[2]),
            ("visual.blocks.0.mlp.gate_proj.weight", &[3, 2]),
            ("visual.blocks.0.norm1.weight", &[2]),
            ("visual.merger.ln_q.weight", &[2]),
            ("visual.merger.mlp.2.weight", &[2, 8]),
            ("visual.patch_embed.proj.weight", &[2, 1, 2, 1, 2]),
        ]
    );
    // Each output's channel holds frame 0's pixels, then frame 1's.
    assert_eq!(store.read("visual.patch_embed.proj.weight").unwrap(), [0.0, 1.0, 10.0, 11.0, 2.0, 3.0, 12.0, 13.0]);
    let one_frame = TempFile::new("mmproj-qwen-vl-one-frame.gguf", &gguf_with_metadata(metadata.as_object().unwrap(), &tensors[1..]));
    let mut store = WeightStore::open_gguf(&model.0, "qwen2_5_vl_text", 1, 1).unwrap();
    let text = error_text(store.add_gguf_projector(&one_frame.0));
    assert!(text.contains("v.patch_embd.weight.1 is missing"), "{text}");
    let mut unlike = tensors.clone();
    unlike[0] = ("v.patch_embd.weight.1", vec![1, 1, 1, 2], 0, f32_bytes(&[0.0; 2]));
    let unlike = TempFile::new("mmproj-qwen-vl-unlike.gguf", &gguf_with_metadata(metadata.as_object().unwrap(), &unlike));
    let text = error_text(store.add_gguf_projector(&unlike.0));
    assert!(text.contains("does not stack with v.patch_embd.weight's"), "{text}");
}

#[test]
fn a_sharded_gguf_model_maps_every_shard_whichever_is_named() {
    let row = |value: f32| le_bytes(&[value; 4], f32::to_le_bytes);
    let first = TempFile::new("split-00001-of-00002.gguf", &gguf(&[("token_embd.weight", vec![4, 1], 0, row(1.0))]));
    let text = error_text(WeightStore::open_gguf(&first.0, "qwen2", 1, 1));
    assert!(text.contains("is one of 2 shards") && text.contains("split-00002-of-00002.gguf is not beside it"), "{text}");
    let second = TempFile::new("split-00002-of-00002.gguf", &gguf(&[("output_norm.weight", vec![4], 0, row(2.0))]));
    for named in [&first.0, &second.0] {
        let store = WeightStore::open_gguf(named, "qwen2", 1, 1).unwrap();
        assert_eq!(store.names(), ["model.embed_tokens.weight", "model.norm.weight"]);
        assert_eq!(store.read("model.embed_tokens.weight").unwrap(), [1.0; 4]);
        assert_eq!(store.read("model.norm.weight").unwrap(), [2.0; 4]);
    }
    // Names that only look like shards are whole files.
    for name in ["split-00003-of-00002.gguf", "split-1-of-2.gguf"] {
        let whole = TempFile::new(name, &gguf(&[("output_norm.weight", vec![4], 0, row(3.0))]));
        assert_eq!(WeightStore::open_gguf(&whole.0, "qwen2", 1, 1).unwrap().names(), ["model.norm.weight"]);
    }
}

#[test]
fn broken_gguf_files_name_the_file_and_tensor() {
    let tensor = ("blk.0.attn_q.weight", vec![32u64, 2], 8u32, vec![0u8; 2 * 34]); // Q8_0: 34 bytes a block
    let good = gguf(std::slice::from_ref(&tensor));
    let truncated = TempFile::new("truncated.gguf", &good[..good.len() - 40]);
    let text = error_text(WeightStore::open_gguf(&truncated.0, "llama", 1, 1));
    assert!(text.contains("truncated.gguf is corrupt, truncated or not a GGUF file") && text.contains("blk.0.attn_q.weight"), "{text}");
    let unknown_type = TempFile::new("iq.gguf", &gguf(&[("blk.0.attn_q.weight", vec![256, 1], 16, vec![0; 66])]));
    let text = error_text(WeightStore::open_gguf(&unknown_type.0, "llama", 1, 1));
    assert!(text.contains("iq.gguf: tensor blk.0.attn_q.weight is stored as IQ2_XXS"), "{text}");
    let ragged = TempFile::new("ragged.gguf", &gguf(&[("blk.0.attn_q.weight", vec![33, 1], 8, vec![0; 68])]));
    let text = error_text(WeightStore::open_gguf(&ragged.0, "llama", 1, 1));
    assert!(text.contains("ragged.gguf is corrupt") && text.contains("blk.0.attn_q.weight's dimensions [33, 1] do not fit Q8_0 blocks"), "{text}");
}

#[test]
fn in_memory_tensors_read_like_mapped_ones() {
    let mut store = WeightStore::new();
    store.insert("w", vec![2, 3], vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]).unwrap();
    assert!(store.insert("bad", vec![2, 2], vec![0.0; 3]).is_err());
    let w = store.take_matrix("w", 2, 3).unwrap();
    let mut row = [0.0; 3];
    w.read_f32(1, &mut row);
    assert_eq!(row, [4.0, 5.0, 6.0]);
    assert!(store.is_empty());
}

/// A 4-bit layer quantized in groups, as a checkpoint would hold it before packing: quants
/// `[out][in]`, zero points and f16 scales `[groups][out]`, and each input's group.
struct GroupedLayerValues {
    rows: usize,
    cols: usize,
    q: Vec<Vec<u8>>,
    zeros: Vec<Vec<u8>>,
    scales: Vec<Vec<u16>>,
    g_idx: Vec<usize>,
}

impl GroupedLayerValues {
    /// Arbitrary values; zero points in 1..=16 for GPTQ v1 (stored minus one), else 0..=15.
    /// `act_order` scatters the inputs over the groups as GPTQ's desc_act does.
    fn new(rows: usize, cols: usize, group_size: usize, packing: Int4Packing, act_order: bool) -> GroupedLayerValues {
        let mut state = (rows * 31 + cols) as u64;
        let mut next = move |n: u64| {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((state >> 33) % n) as u8
        };
        let groups = cols.div_ceil(group_size);
        let zero_base = if packing == Int4Packing::Gptq { 1 } else { 0 };
        let q = (0..rows).map(|_| (0..cols).map(|_| next(16)).collect()).collect();
        let zeros = (0..groups).map(|_| (0..rows).map(|_| zero_base + next(16)).collect()).collect();
        let scales = (0..groups).map(|_| (0..rows).map(|_| f32_to_f16(0.001 + next(200) as f32 * 0.0005)).collect()).collect();
        let g_idx = (0..cols).map(|i| if act_order { (i * 7 + 3) % cols / group_size } else { i / group_size }).collect();
        GroupedLayerValues { rows, cols, q, zeros, scales, g_idx }
    }

    fn value(&self, o: usize, i: usize) -> f32 {
        let g = self.g_idx[i];
        (self.q[o][i] as f32 - self.zeros[g][o] as f32) * f16_to_f32(self.scales[g][o])
    }

    /// Eight nibbles into a little-endian int32's bytes, nibble `n` from `nibble(n)`.
    fn word(nibble: impl Fn(usize) -> u8) -> [u8; 4] {
        (0..8).fold(0u32, |w, n| w | ((nibble(n) & 0x0f) as u32) << (4 * n)).to_le_bytes()
    }

    /// `(suffix, dtype, shape, bytes)` of the checkpoint's tensors in `packing`.
    fn packed(&self, packing: Int4Packing) -> Vec<(&'static str, &'static str, Vec<usize>, Vec<u8>)> {
        const AWQ_ORDER: [usize; 8] = [0, 2, 4, 6, 1, 3, 5, 7];
        let (rows, cols, groups) = (self.rows, self.cols, self.zeros.len());
        let zero_offset = if packing == Int4Packing::Gptq { 1 } else { 0 };
        let output = |j: usize, n: usize| if packing == Int4Packing::Awq { 8 * j + AWQ_ORDER[n] } else { 8 * j + n };
        let qzeros = (0..groups).flat_map(|g| (0..rows / 8).flat_map(move |j| Self::word(|n| self.zeros[g][output(j, n)] - zero_offset))).collect();
        let scales = self.scales.iter().flat_map(|row| row.iter().flat_map(|s| s.to_le_bytes())).collect();
        let (qweight_shape, qweight) = match packing {
            Int4Packing::Awq => {
                (vec![cols, rows / 8], (0..cols).flat_map(|i| (0..rows / 8).flat_map(move |j| Self::word(|n| self.q[output(j, n)][i]))).collect())
            }
            _ => (vec![cols / 8, rows], (0..cols / 8).flat_map(|r| (0..rows).flat_map(move |o| Self::word(|k| self.q[o][8 * r + k]))).collect()),
        };
        let mut tensors =
            vec![("qweight", "I32", qweight_shape, qweight), ("qzeros", "I32", vec![groups, rows / 8], qzeros), ("scales", "F16", vec![groups, rows], scales)];
        if packing != Int4Packing::Awq {
            tensors.push(("g_idx", "I32", vec![cols], le_bytes(&self.g_idx.iter().map(|&g| g as i32).collect::<Vec<_>>(), i32::to_le_bytes)));
        }
        tensors
    }
}

/// Each row read as floats is the scalar dequantization `(q - zero) * scale`, exactly; as 4-bit
/// blocks (where groups are runs of whole blocks) it holds the same quants with `d = scale`,
/// `m = -scale * zero` in f16, and packs for the W4A8 kernels into those values.
#[test]
fn grouped_int4_layers_read_as_their_dequantized_values() {
    use rsgl_kernels::int4::{Int4Weights, QBLOCK};
    use rsgl_kernels::ThreadPool;
    let cases = [
        // (packing, out, in, group size (None: all inputs), act-order); out = 40 is 2.5 panels of 16.
        (Int4Packing::Awq, 48, 64, Some(32), false),
        (Int4Packing::Awq, 40, 256, Some(128), false),
        (Int4Packing::Gptq, 40, 256, Some(128), false),
        (Int4Packing::Gptq, 24, 64, Some(32), true),
        (Int4Packing::Gptq, 16, 96, None, false),
        (Int4Packing::GptqV2, 8, 64, Some(32), false),
    ];
    for (packing, rows, cols, group_size, act_order) in cases {
        let what = format!("{packing:?} [{rows}, {cols}] groups of {group_size:?}{}", if act_order { ", act-order" } else { "" });
        let layer = GroupedLayerValues::new(rows, cols, group_size.unwrap_or(cols), packing, act_order);
        let tensors = layer.packed(packing);
        // The qweight in one shard, the rest in another: a layer may straddle shards.
        let names: Vec<String> = tensors.iter().map(|(suffix, ..)| format!("model.layers.0.mlp.down_proj.{suffix}")).collect();
        let shard = |range: std::ops::Range<usize>| {
            safetensors(&range.map(|t| (names[t].as_str(), tensors[t].1, tensors[t].2.clone(), tensors[t].3.clone())).collect::<Vec<_>>())
        };
        let files = [TempFile::new("grouped-1.safetensors", &shard(0..1)), TempFile::new("grouped-2.safetensors", &shard(1..tensors.len()))];
        let paths: Vec<PathBuf> = files.iter().map(|f| f.0.clone()).collect();
        let mut store = WeightStore::open_int4_safetensors(&paths, Int4Checkpoint { packing, group_size }).unwrap();
        let name = "model.layers.0.mlp.down_proj.weight";
        assert_eq!(store.names(), [name], "{what}");
        assert_eq!(store.shape(name), Some(&[rows, cols][..]), "{what}");
        let stored = store.stored(name).unwrap();
        let kind_name = match (packing, act_order) {
            (_, true) => "GPTQ_ACT_ORDER",
            (Int4Packing::Awq, false) => "AWQ",
            _ => "GPTQ",
        };
        assert_eq!(stored.name(), kind_name, "{what}");
        assert_eq!(stored.int4_offset(), (!act_order).then_some(Int4Offset::Min), "{what}");

        let want: Vec<f32> = (0..rows).flat_map(|o| (0..cols).map(move |i| (o, i))).map(|(o, i)| layer.value(o, i)).collect();
        assert_eq!(store.read(name).unwrap(), want, "{what}: read");
        let matrix = store.take_matrix(name, rows, cols).unwrap();
        let mut row = vec![0.0; cols];
        let mut blocks = Int4Row::new(cols);
        for o in 0..rows {
            matrix.read_f32(o, &mut row);
            assert_eq!(row, want[o * cols..(o + 1) * cols], "{what}: row {o}");
            assert_eq!(matrix.read_q4(o, &mut blocks, Int4Offset::Min), !act_order, "{what}: act-order rows are floats only");
            if act_order {
                continue;
            }
            for b in 0..cols / QBLOCK {
                let g = layer.g_idx[b * QBLOCK];
                let (scale, zero) = (layer.scales[g][o], layer.zeros[g][o]);
                assert_eq!((blocks.scales[b], blocks.mins[b]), (scale, f32_to_f16(-f16_to_f32(scale) * zero as f32)), "{what}: row {o} block {b}");
                for j in 0..QBLOCK {
                    let q = (blocks.nibbles[b * 16 + j % 16] >> (4 * (j / 16))) & 0x0f;
                    assert_eq!(q, layer.q[o][b * QBLOCK + j], "{what}: row {o} input {}", b * QBLOCK + j);
                }
            }
        }
        if !act_order {
            let packed =
                Int4Weights::pack_rows(rows, cols, Int4Offset::Min, &ThreadPool::new(2, false), &|o, out| assert!(matrix.read_q4(o, out, Int4Offset::Min)));
            for o in 0..rows {
                for (i, (got, want)) in packed.row(o).iter().zip(&want[o * cols..]).enumerate() {
                    // Only the minimum's rounding to f16 (2^-11 of scale * zero) separates them.
                    let tol = (f16_to_f32(layer.scales[layer.g_idx[i]][o]) * 16.0) / 2048.0;
                    assert!((got - want).abs() <= tol, "{what}: packed row {o} input {i}: {got} vs {want}");
                }
            }
        }
        drop(matrix);
        assert!(store.is_empty());
    }
}

#[test]
fn broken_grouped_int4_layers_name_the_tensor() {
    let layer = GroupedLayerValues::new(16, 64, 32, Int4Packing::Gptq, false);
    let tensors = layer.packed(Int4Packing::Gptq);
    let gptq = Int4Checkpoint { packing: Int4Packing::Gptq, group_size: Some(32) };
    let open = |file_name: &str, keep: &dyn Fn(&str) -> bool, checkpoint: Int4Checkpoint| {
        let kept: Vec<(String, &str, Vec<usize>, Vec<u8>)> = tensors
            .iter()
            .filter(|(suffix, ..)| keep(suffix))
            .map(|(suffix, dtype, shape, bytes)| (format!("l.{suffix}"), *dtype, shape.clone(), bytes.clone()))
            .collect();
        let kept: Vec<(&str, &str, Vec<usize>, Vec<u8>)> = kept.iter().map(|(n, d, s, b)| (n.as_str(), *d, s.clone(), b.clone())).collect();
        let file = TempFile::new(file_name, &safetensors(&kept));
        error_text(WeightStore::open_int4_safetensors(std::slice::from_ref(&file.0), checkpoint))
    };
    let text = open("no-zeros.safetensors", &|suffix| suffix != "qzeros", gptq);
    assert!(text.contains("no-zeros.safetensors: l.qweight has no l.qzeros beside it") && text.contains("download it again"), "{text}");
    let text = open("no-qweight.safetensors", &|suffix| suffix != "qweight", gptq);
    assert!(text.contains("l.qzeros has no l.qweight beside it"), "{text}");
    let text = open("group-64.safetensors", &|_| true, Int4Checkpoint { packing: Int4Packing::Gptq, group_size: Some(64) });
    assert!(text.contains("do not make a 4-bit GPTQ layer in groups of 64 inputs") && text.contains("quantization_config"), "{text}");
    let text = open("awq-g-idx.safetensors", &|_| true, Int4Checkpoint { packing: Int4Packing::Awq, group_size: Some(32) });
    assert!(text.contains("l.g_idx is GPTQ's, but config.json says the checkpoint is AWQ"), "{text}");
    // Without the checkpoint's quantization, the int32 tensors are not weights rsgl reads.
    let file = TempFile::new("unnamed.safetensors", &safetensors(&[("l.qweight", "I32", vec![8, 16], vec![0; 512])]));
    let text = error_text(WeightStore::open_safetensors(std::slice::from_ref(&file.0)));
    assert!(text.contains("tensor l.qweight is stored as I32") && text.contains("AWQ and GPTQ"), "{text}");
}

#[test]
fn w4a8_checkpoints_list_their_byte_rows_as_q4_1_tensors() {
    // Two rows of two Q4_1 blocks: d = 0.5 and m = -1 for every block, q = input index mod 16.
    let block = |_: usize| [f32_to_f16(0.5).to_le_bytes(), f32_to_f16(-1.0).to_le_bytes()].concat().into_iter().chain((0..16u8).map(|j| j | (j << 4)));
    let rows: Vec<u8> = (0..4).flat_map(block).collect();
    let norm = le_bytes(&[1.0f32; 2], f32::to_le_bytes);
    let file = TempFile::new("w4a8.safetensors", &safetensors(&[("w.weight", "U8", vec![2, 40], rows.clone()), ("n.weight", "F32", vec![2], norm)]));
    let mut store = WeightStore::open_q4_1_safetensors(std::slice::from_ref(&file.0)).unwrap();
    assert_eq!(store.stored("w.weight"), Some(Stored::Ggml(GgmlType::Q4_1)));
    let matrix = store.take_matrix("w.weight", 2, 64).unwrap();
    let mut values = vec![0.0; 64];
    matrix.read_f32(1, &mut values);
    assert!(values.iter().enumerate().all(|(i, &v)| v == 0.5 * (i % 16) as f32 - 1.0), "{values:?}");
    assert!(matrix.read_q4(0, &mut Int4Row::new(64), Int4Offset::Min));
    assert_eq!(store.take("n.weight", &[2]).unwrap(), vec![1.0; 2]);

    let broken = TempFile::new("w4a8-broken.safetensors", &safetensors(&[("w.weight", "U8", vec![2, 39], rows[..78].to_vec())]));
    let text = error_text(WeightStore::open_q4_1_safetensors(std::slice::from_ref(&broken.0)));
    assert!(text.contains("w.weight") && text.contains("Q4_1"), "{text}");
}

/// Hugging Face MXFP4 pairs (`_blocks` and `_scales`, here in different shards) are listed as one
/// tensor; views of its rows (an expert's gate and up, interleaved) read as the W4A8 kernels'
/// MXFP4 blocks and as floats the values the codes and scales mean.
#[test]
fn hf_mxfp4_blocks_and_scales_read_as_stored() {
    use rsgl_kernels::int4::{Int4Offset, Int4Row, Int4Weights, QBLOCK};
    use rsgl_kernels::ThreadPool;
    const E2M1: [f32; 8] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];
    let (experts, rows, cols) = (2, 4, 64);
    let blocks: Vec<u8> = (0..experts * rows * cols / 2).map(|i| (i * 37 % 256) as u8).collect();
    let scales: Vec<u8> = (0..experts * rows * cols / QBLOCK).map(|i| [0, 1, 119, 127, 130, 200][i % 6]).collect();
    let name = "model.layers.0.mlp.experts.gate_up_proj";
    let codes_file =
        TempFile::new("mxfp4-blocks.safetensors", &safetensors(&[(&format!("{name}_blocks"), "U8", vec![experts, rows, cols / QBLOCK, 16], blocks.clone())]));
    let scales_file =
        TempFile::new("mxfp4-scales.safetensors", &safetensors(&[(&format!("{name}_scales"), "U8", vec![experts, rows, cols / QBLOCK], scales.clone())]));
    let mut store = WeightStore::open_safetensors(&[codes_file.0.clone(), scales_file.0.clone()]).unwrap();
    assert_eq!((store.shape(name), store.stored(name).map(Stored::name)), (Some(&[experts, rows, cols][..]), Some("MXFP4")));
    // Stored row `r`'s value `i`: HF's byte `j` of a block holds values 2j (low) and 2j + 1.
    let value = |r: usize, i: usize| {
        let code = (blocks[r * cols / 2 + i / 2] >> (4 * (i % 2))) & 0x0f;
        let magnitude = E2M1[code as usize % 8] * if code >= 8 { -1.0 } else { 1.0 };
        magnitude as f64 * 2f64.powi(scales[r * cols / QBLOCK + i / QBLOCK] as i32 - 127)
    };
    let views: Vec<(String, usize, usize, usize)> =
        (0..experts).flat_map(|e| [(format!("e{e}.gate"), e * rows, 2, rows / 2), (format!("e{e}.up"), e * rows + 1, 2, rows / 2)]).collect();
    store.split_rows(name, &views).unwrap();
    assert!(!store.contains(name));
    for (view, first, step, count) in views {
        let matrix = store.take_matrix(&view, count, cols).unwrap();
        assert_eq!(matrix.stored().int4_offset(), Some(Int4Offset::Mxfp4));
        let mut floats = vec![0.0; cols];
        for row in 0..count {
            matrix.read_f32(row, &mut floats);
            for (i, got) in floats.iter().enumerate() {
                assert_eq!(*got as f64, value(first + step * row, i), "{view} row {row} value {i}");
            }
        }
        let mut blocks = Int4Row::new(cols);
        assert!(!matrix.read_q4(0, &mut blocks, Int4Offset::Min), "MXFP4 reads only as MXFP4");
        let packed = Int4Weights::pack_rows(count, cols, Int4Offset::Mxfp4, &ThreadPool::new(1, false), &|row, out| {
            assert!(matrix.read_q4(row, out, Int4Offset::Mxfp4))
        });
        for row in 0..count {
            matrix.read_f32(row, &mut floats);
            assert_eq!(packed.row(row), floats, "{view} row {row}: packed blocks vs floats");
        }
    }
    let lone = TempFile::new("mxfp4-lone.safetensors", &safetensors(&[(&format!("{name}_blocks"), "U8", vec![1, 1, 2, 16], vec![0; 32])]));
    let text = error_text(WeightStore::open_safetensors(std::slice::from_ref(&lone.0)));
    assert!(text.contains("gate_up_proj_scales") && text.contains("incomplete"), "{text}");
}

/// A GGUF file's MXFP4 experts (type 39) split per expert, read as the W4A8 kernels' MXFP4
/// blocks as they are and as floats the values their codes and scales mean.
#[test]
fn gguf_mxfp4_experts_read_as_stored() {
    use rsgl_kernels::int4::{Int4Offset, Int4Weights, QBLOCK};
    use rsgl_kernels::ThreadPool;
    const E2M1: [f32; 8] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];
    let (experts, rows, cols) = (2, 3, 64);
    // A block: the e8m0 byte, then 16 bytes, byte j holding value j (low nibble) and j + 16.
    let blocks: Vec<u8> = (0..experts * rows * cols / QBLOCK)
        .flat_map(|b| std::iter::once(118 + (b % 12) as u8).chain((0..16).map(move |j| ((b * 16 + j) * 37 % 256) as u8)))
        .collect();
    let file = TempFile::new("mxfp4.gguf", &gguf(&[("blk.0.ffn_up_exps.weight", vec![cols as u64, rows as u64, experts as u64], 39, blocks.clone())]));
    let mut store = WeightStore::open_gguf(&file.0, "qwen3_moe", 1, 1).unwrap();
    for e in 0..experts {
        let name = format!("model.layers.0.mlp.experts.{e}.up_proj.weight");
        assert_eq!(store.stored(&name), Some(Stored::Ggml(GgmlType::Mxfp4)));
        let matrix = store.take_matrix(&name, rows, cols).unwrap();
        let packed =
            Int4Weights::pack_rows(rows, cols, Int4Offset::Mxfp4, &ThreadPool::new(1, false), &|row, out| assert!(matrix.read_q4(row, out, Int4Offset::Mxfp4)));
        let mut floats = vec![0.0; cols];
        for row in 0..rows {
            matrix.read_f32(row, &mut floats);
            for (i, got) in floats.iter().enumerate() {
                let block = &blocks[((e * rows + row) * cols / QBLOCK + i / QBLOCK) * 17..][..17];
                let code = (block[1 + i % 16] >> (4 * (i % QBLOCK / 16))) & 0x0f;
                let want = E2M1[code as usize % 8] * if code >= 8 { -1.0 } else { 1.0 } * 2f32.powi(block[0] as i32 - 127);
                assert_eq!(*got, want, "expert {e} row {row} value {i}");
            }
            assert_eq!(packed.row(row), floats, "expert {e} row {row}: packed blocks vs floats");
        }
    }
}

#[test]
fn gemma3s_vision_tower_is_read_under_siglips_names_and_other_towers_are_not() {
    let named = |name: &str| super::language_model_name(name);
    for hub in ["vision_tower.vision_model.encoder.layers.0.mlp.fc1.weight", "model.vision_tower.vision_model.encoder.layers.0.mlp.fc1.weight"] {
        assert_eq!(named(hub).as_deref(), Some("model.vision_model.encoder.layers.0.mlp.fc1.weight"));
    }
    assert_eq!(named("vision_tower.post_layernorm.bias").as_deref(), Some("model.vision_model.post_layernorm.bias"), "as transformers 5 saves it");
    assert_eq!(named("multi_modal_projector.mm_soft_emb_norm.weight").as_deref(), Some("model.multi_modal_projector.mm_soft_emb_norm.weight"));
    // Mistral 3's Pixtral tower and projector.
    assert_eq!(named("vision_tower.transformer.layers.0.attention.q_proj.weight"), None);
    assert_eq!(named("multi_modal_projector.linear_1.weight"), None);
    assert_eq!(named("language_model.model.layers.0.mlp.up_proj.weight").as_deref(), Some("model.layers.0.mlp.up_proj.weight"));
}

#[test]
fn the_digest_reads_every_byte_where_the_fingerprint_samples() {
    // 4096 floats (16 KiB): one change in the middle, past the fingerprint's first and last 4 KiB.
    let values: Vec<f32> = (0..4096).map(|i| i as f32).collect();
    let mut edited = values.clone();
    edited[2048] = -1.0;
    let stores: Vec<WeightStore> = [("before", values), ("after", edited)]
        .into_iter()
        .map(|(name, values)| {
            let file = TempFile::new(&format!("digest-{name}.safetensors"), &safetensors(&[("w", "F32", vec![64, 64], le_bytes(&values, f32::to_le_bytes))]));
            WeightStore::open_safetensors(std::slice::from_ref(&file.0)).unwrap()
        })
        .collect();
    assert_eq!(stores[0].fingerprint(), stores[1].fingerprint());
    assert_ne!(stores[0].digest(), stores[1].digest());
}
