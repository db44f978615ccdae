use super::*;
use serde_json::{json, Map};

/// A file under the temp dir, removed on drop.
struct TempFile(PathBuf);

impl TempFile {
    fn new(name: &str, bytes: &[u8]) -> TempFile {
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
    let mut out = b"GGUF".to_vec();
    out.extend(3u32.to_le_bytes());
    out.extend((tensors.len() as u64).to_le_bytes());
    out.extend(0u64.to_le_bytes());
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
    let text = error_text(store.take_matrix("a", 1, 2));
    assert!(text.contains("good.safetensors: tensor a has shape [2]"), "{text}");
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
fn interleave_heads(rows: &[Vec<f32>], head_dim: usize) -> Vec<Vec<f32>> {
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
fn broken_gguf_files_name_the_file_and_tensor() {
    let tensor = ("blk.0.attn_q.weight", vec![32u64, 2], 8u32, vec![0u8; 2 * 34]); // Q8_0: 34 bytes a block
    let good = gguf(&[tensor.clone()]);
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
