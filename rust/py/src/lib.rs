//! `rsgl._core`: thin bindings over rsgl-engine. Each method converts its arguments, releases
//! the GIL while the engine works, and maps engine errors onto `rsgl.errors` exceptions.
//! Structured values cross as Python objects read and built by the engine's own serde types
//! (pythonize), so the schema is written once, in Rust, and no JSON text crosses per output.

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use pythonize::{pythonize, Depythonizer};
use rsgl_engine::model::{PeftAdapter, PeftConfig};
use rsgl_engine::pooling::Pooling;
use rsgl_engine::request::deserialize_with_path;
use rsgl_engine::sample::SamplingParams;
use rsgl_engine::weights::{Int4Checkpoint, Int4Packing};
use rsgl_engine::{EmbedRequest, EngineError, EngineOptions, GenerateRequest};
use serde::Deserialize;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

// The exception classes of `rsgl.errors`, imported once and cached by pyo3.
pyo3::import_exception!(rsgl.errors, ModelLoadError);
pyo3::import_exception!(rsgl.errors, UnsupportedModelError);
pyo3::import_exception!(rsgl.errors, InvalidRequestError);
pyo3::import_exception!(rsgl.errors, EngineClosedError);

fn to_py_err(e: EngineError) -> PyErr {
    let msg = e.to_string();
    match e {
        EngineError::ModelLoad(_) => ModelLoadError::new_err(msg),
        EngineError::UnsupportedModel(_) => UnsupportedModelError::new_err(msg),
        EngineError::InvalidRequest(_) => InvalidRequestError::new_err(msg),
        EngineError::Closed => EngineClosedError::new_err(msg),
    }
}

/// A checkpoint's tensors, mapped by the core (safetensors files or a GGUF file) under Hugging
/// Face names; the engine takes them when it starts and the files are unmapped then.
#[pyclass(module = "rsgl._core")]
struct WeightStore {
    inner: Mutex<Option<rsgl_engine::WeightStore>>,
}

impl WeightStore {
    fn with<T>(&self, f: impl FnOnce(&rsgl_engine::WeightStore) -> PyResult<T>) -> PyResult<T> {
        let guard = self.inner.lock().expect("store lock");
        f(guard.as_ref().ok_or_else(|| PyRuntimeError::new_err("this WeightStore was already used by an Engine"))?)
    }

    /// The store itself, for the engine to take (it is then empty).
    fn take(&self) -> PyResult<rsgl_engine::WeightStore> {
        self.inner.lock().expect("store lock").take().ok_or_else(|| PyRuntimeError::new_err("this WeightStore was already used by an Engine"))
    }

    fn wrap(py: Python<'_>, open: impl FnOnce() -> Result<rsgl_engine::WeightStore, EngineError> + Send) -> PyResult<Self> {
        let store = py.detach(open).map_err(to_py_err)?;
        Ok(WeightStore { inner: Mutex::new(Some(store)) })
    }
}

#[pymethods]
impl WeightStore {
    /// Maps the safetensors files of a Hugging Face checkpoint (one file or its shards). A
    /// checkpoint with packed 4-bit layers names their `packing`: "awq", "gptq" or "gptq_v2"
    /// with their `group_size` (None: one group over all of a layer's inputs), or "ggml_q4_1"
    /// (rsgl's w4a8: rows of Q4_1 blocks).
    #[staticmethod]
    #[pyo3(signature = (paths, packing=None, group_size=None))]
    fn open_safetensors(py: Python<'_>, paths: Vec<PathBuf>, packing: Option<&str>, group_size: Option<usize>) -> PyResult<Self> {
        let packing = match packing {
            None => return Self::wrap(py, || rsgl_engine::WeightStore::open_safetensors(&paths)),
            Some("ggml_q4_1") => return Self::wrap(py, || rsgl_engine::WeightStore::open_q4_1_safetensors(&paths)),
            Some("awq") => Int4Packing::Awq,
            Some("gptq") => Int4Packing::Gptq,
            Some("gptq_v2") => Int4Packing::GptqV2,
            Some(other) => {
                let message = format!("packing {other:?} is not one of \"awq\", \"gptq\", \"gptq_v2\", \"ggml_q4_1\"");
                return Err(to_py_err(EngineError::InvalidRequest(message)));
            }
        };
        if group_size == Some(0) {
            return Err(to_py_err(EngineError::InvalidRequest("group_size must be positive (None: one group per layer)".into())));
        }
        let checkpoint = Int4Checkpoint { packing, group_size };
        Self::wrap(py, || rsgl_engine::WeightStore::open_int4_safetensors(&paths, checkpoint))
    }

    /// Maps a GGUF file, its tensors named and laid out as in a Hugging Face checkpoint, with
    /// llama.cpp's separate projector file (`mmproj`) of a vision-language model's images.
    #[staticmethod]
    #[pyo3(signature = (path, architecture, heads, kv_heads, mmproj=None))]
    fn open_gguf(py: Python<'_>, path: PathBuf, architecture: &str, heads: usize, kv_heads: usize, mmproj: Option<PathBuf>) -> PyResult<Self> {
        Self::wrap(py, || {
            let mut store = rsgl_engine::WeightStore::open_gguf(&path, architecture, heads, kv_heads)?;
            if let Some(projector) = &mmproj {
                store.add_gguf_projector(projector)?;
            }
            Ok(store)
        })
    }

    /// The GGUF LoRA adapter file `path` (llama.cpp's convert_lora_to_gguf.py) named `name`, for
    /// the base model of `config`, as the PEFT adapter it was made from: the adapter_config.json
    /// it stands for, and its tensors under PEFT's names.
    #[staticmethod]
    fn open_gguf_lora<'py>(py: Python<'py>, name: String, path: PathBuf, config: &ModelConfig) -> PyResult<(Bound<'py, PyAny>, Self)> {
        let adapter = py.detach(|| PeftAdapter::from_gguf(name, &path, &config.inner)).map_err(to_py_err)?;
        Ok((to_python(py, &adapter.config)?, WeightStore { inner: Mutex::new(Some(adapter.weights)) }))
    }

    /// A GGUF file's metadata (key -> value).
    #[staticmethod]
    fn gguf_metadata<'py>(py: Python<'py>, path: PathBuf) -> PyResult<Bound<'py, PyAny>> {
        let metadata = py.detach(|| rsgl_engine::WeightStore::gguf_metadata(&path)).map_err(to_py_err)?;
        to_python(py, &metadata)
    }

    /// Every tensor's name, shape and storage type ("BF16", "Q4_K", "I8", "AWQ", "GPTQ", ...).
    fn tensors(&self) -> PyResult<Vec<(String, Vec<usize>, &'static str)>> {
        self.with(|s| Ok(s.names().into_iter().map(|n| (n.to_string(), s.shape(n).expect("listed").to_vec(), s.stored(n).expect("listed").name())).collect()))
    }

    /// One tensor as little-endian float32 bytes, in Hugging Face layout.
    fn read<'py>(&self, py: Python<'py>, name: &str) -> PyResult<Bound<'py, PyBytes>> {
        let values = self.with(|s| py.detach(|| s.read(name)).map_err(to_py_err))?;
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        Ok(PyBytes::new(py, &bytes))
    }

    /// Whether the engine draws a progress bar of the bytes it packs while loading.
    fn show_progress(&self, show: bool) -> PyResult<()> {
        let mut guard = self.inner.lock().expect("store lock");
        let store = guard.as_mut().ok_or_else(|| PyRuntimeError::new_err("this WeightStore was already used by an Engine"))?;
        store.show_progress(show);
        Ok(())
    }

    fn __len__(&self) -> usize {
        self.inner.lock().expect("store lock").as_ref().map_or(0, |s| s.len())
    }
}

/// A model's normalized config, held by the core: the loader reads a copy of its `fields`, and
/// the engine takes the config itself, so it is never rebuilt from Python values.
#[pyclass(module = "rsgl._core", frozen)]
struct ModelConfig {
    inner: rsgl_engine::ModelConfig,
}

#[pymethods]
impl ModelConfig {
    /// The normalized config of a transformers config.json (a dict).
    #[staticmethod]
    fn from_hf(config: &Bound<'_, PyAny>) -> PyResult<Self> {
        let inner = rsgl_engine::ModelConfig::from_hf_config(&mut Depythonizer::from_object(config)).map_err(to_py_err)?;
        Ok(ModelConfig { inner })
    }

    /// The normalized config of a GGUF file, from its metadata and tensors; with llama.cpp's
    /// separate projector file (`mmproj`), its vision config too.
    #[staticmethod]
    #[pyo3(signature = (path, mmproj=None))]
    fn from_gguf(py: Python<'_>, path: PathBuf, mmproj: Option<PathBuf>) -> PyResult<Self> {
        let inner = py.detach(|| rsgl_engine::ModelConfig::from_gguf(&path, mmproj.as_deref())).map_err(to_py_err)?;
        Ok(ModelConfig { inner })
    }

    /// This config with what a folder's other files say: the pooling sentence-transformers
    /// declares, and whether there is an `lm_head`.
    #[pyo3(signature = (pooling=None, has_lm_head=true))]
    fn with_checkpoint(&self, pooling: Option<&Bound<'_, PyAny>>, has_lm_head: bool) -> PyResult<Self> {
        let pooling = pooling
            .map(|p| Pooling::deserialize(&mut Depythonizer::from_object(p)))
            .transpose()
            .map_err(|e| ModelLoadError::new_err(format!("pooling: {e}")))?;
        Ok(ModelConfig { inner: self.inner.clone().with_checkpoint(pooling, has_lm_head) })
    }

    /// The config's fields, as a new dict.
    #[getter]
    fn fields<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        to_python(py, &self.inner)
    }
}

/// The model's tokenizer (a `tokenizer.json`), shared with the engine: prompts are encoded,
/// texts decoded and structured output's forced text tokenized by this one instance.
#[pyclass(module = "rsgl._core", frozen)]
struct Tokenizer {
    inner: Arc<rsgl_engine::Tokenizer>,
}

#[pymethods]
impl Tokenizer {
    /// Reads `tokenizer.json` text; `vocab_size` is the model's (ids past the tokenizer's own
    /// vocabulary decode to nothing), or None for the tokenizer's own.
    #[staticmethod]
    #[pyo3(signature = (json, vocab_size=None))]
    fn from_str(py: Python<'_>, json: String, vocab_size: Option<usize>) -> PyResult<Self> {
        let inner = py.detach(|| rsgl_engine::Tokenizer::from_json(&json, vocab_size)).map_err(to_py_err)?;
        Ok(Tokenizer { inner: Arc::new(inner) })
    }

    /// The tokenizer a GGUF file's metadata describes (its first shard's, for a split model), as
    /// llama.cpp builds it; None for a file without a vocabulary.
    #[staticmethod]
    #[pyo3(signature = (path, vocab_size=None))]
    fn from_gguf(py: Python<'_>, path: PathBuf, vocab_size: Option<usize>) -> PyResult<Option<Self>> {
        let built = py.detach(|| rsgl_engine::WeightStore::gguf_metadata(&path).and_then(|metadata| rsgl_engine::Tokenizer::from_gguf(&metadata, vocab_size)));
        Ok(built.map_err(to_py_err)?.map(|inner| Tokenizer { inner: Arc::new(inner) }))
    }

    #[pyo3(signature = (text, add_special_tokens=true))]
    fn encode(&self, py: Python<'_>, text: &str, add_special_tokens: bool) -> PyResult<Vec<u32>> {
        py.detach(|| self.inner.encode(text, add_special_tokens)).map_err(to_py_err)
    }

    /// Encodes texts in parallel, without the GIL.
    #[pyo3(signature = (texts, add_special_tokens=true))]
    fn encode_batch(&self, py: Python<'_>, texts: Vec<String>, add_special_tokens: bool) -> PyResult<Vec<Vec<u32>>> {
        py.detach(|| self.inner.encode_batch(texts, add_special_tokens)).map_err(to_py_err)
    }

    #[pyo3(signature = (ids, skip_special_tokens=true))]
    fn decode(&self, py: Python<'_>, ids: Vec<u32>, skip_special_tokens: bool) -> PyResult<String> {
        py.detach(|| self.inner.decode(&ids, skip_special_tokens)).map_err(to_py_err)
    }

    fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// The bytes a token adds to text, as the engine's detokenizer writes them.
    fn token_bytes<'py>(&self, py: Python<'py>, id: u32) -> Bound<'py, PyBytes> {
        PyBytes::new(py, self.inner.table().bytes(id, false))
    }

    /// Whether a token is special (left out of text decoded with skip_special_tokens).
    fn is_special(&self, id: u32) -> bool {
        self.inner.table().is_special(id)
    }

    /// The model's vocabulary size (the token table's length).
    #[getter]
    fn vocab_size(&self) -> usize {
        self.inner.table().len()
    }

    /// The tokenizer as `tokenizer.json` text.
    fn to_str(&self) -> String {
        self.inner.to_json()
    }
}

/// A LoRA adapter as Python reads it: its name, its adapter_config.json (a dict), its weights.
fn peft_adapter(name: String, adapter_config: &Bound<'_, PyAny>, weights: &WeightStore) -> PyResult<PeftAdapter> {
    let config = PeftConfig::deserialize_from(&mut Depythonizer::from_object(adapter_config))
        .map_err(|e| ModelLoadError::new_err(format!("LoRA adapter {name:?}: adapter_config.json: {e}")))?;
    Ok(PeftAdapter { name, config, weights: weights.take()? })
}

#[pyclass(module = "rsgl._core")]
struct Engine {
    /// Held only while a call clones or takes the handle: a call that holds the GIL never waits
    /// on this lock behind one that released the GIL.
    inner: Mutex<Option<Arc<rsgl_engine::Engine>>>,
}

impl Engine {
    fn engine(&self) -> PyResult<Arc<rsgl_engine::Engine>> {
        self.inner.lock().expect("engine lock").clone().ok_or_else(|| to_py_err(EngineError::Closed))
    }
}

#[pymethods]
impl Engine {
    /// `adapters`: the LoRA adapters `options["lora_paths"]` names, each `(name, its
    /// adapter_config.json as a dict, its adapter_model.safetensors mapped)`.
    #[new]
    #[pyo3(signature = (config, weights, options, eos_token_ids, tokenizer=None, adapters=Vec::new()))]
    fn new(
        py: Python<'_>,
        config: &ModelConfig,
        weights: &WeightStore,
        options: &Bound<'_, PyAny>,
        eos_token_ids: Vec<u32>,
        tokenizer: Option<&Tokenizer>,
        adapters: Vec<(String, Bound<'_, PyAny>, PyRef<'_, WeightStore>)>,
    ) -> PyResult<Self> {
        let cfg = config.inner.clone();
        let opts = EngineOptions::deserialize_from(&mut Depythonizer::from_object(options)).map_err(to_py_err)?;
        let peft_adapters =
            adapters.into_iter().map(|(name, adapter_config, store)| peft_adapter(name, &adapter_config, &store)).collect::<PyResult<Vec<_>>>()?;
        let store = weights.take()?;
        let tokenizer = tokenizer.map(|t| t.inner.clone());
        let engine = py.detach(|| rsgl_engine::Engine::start_with_adapters(cfg, store, tokenizer, eos_token_ids, opts, peft_adapters)).map_err(to_py_err)?;
        Ok(Engine { inner: Mutex::new(Some(Arc::new(engine))) })
    }

    /// Queues a request (a dict: `rid`, `input_ids`, `sampling_params`, ...). With a
    /// `notifier`, each of the request's outputs pushes `key` onto it.
    #[pyo3(signature = (request, notifier=None, key=0))]
    fn submit(&self, request: &Bound<'_, PyAny>, notifier: Option<&Notifier>, key: u64) -> PyResult<RequestStream> {
        let req = GenerateRequest::deserialize_from(&mut Depythonizer::from_object(request)).map_err(to_py_err)?;
        let engine = self.engine()?;
        let stream = match waker(notifier, key) {
            Some(waker) => engine.submit_with_waker(req, waker),
            None => engine.submit(req),
        };
        RequestStream::new(stream)
    }

    /// Queues a prompt to embed (a dict: `rid`, `input_ids`) on an engine started with
    /// `is_embedding`; its one output carries `embedding`. `notifier` as in `submit`.
    #[pyo3(signature = (request, notifier=None, key=0))]
    fn embed(&self, request: &Bound<'_, PyAny>, notifier: Option<&Notifier>, key: u64) -> PyResult<RequestStream> {
        let req = EmbedRequest::deserialize_from(&mut Depythonizer::from_object(request)).map_err(to_py_err)?;
        RequestStream::new(self.engine()?.embed(req, waker(notifier, key)))
    }

    /// Compiles the grammar of `sampling_params` now, raising InvalidRequestError with the
    /// grammar backend's message if it is invalid; the compiled grammar is cached.
    fn check_grammar(&self, py: Python<'_>, sampling_params: &Bound<'_, PyAny>) -> PyResult<()> {
        let params: SamplingParams = deserialize_with_path(&mut Depythonizer::from_object(sampling_params))
            .map_err(|e| to_py_err(EngineError::InvalidRequest(format!("sampling_params.{e}"))))?;
        let engine = self.engine()?;
        py.detach(|| engine.check_grammar(&params)).map_err(to_py_err)
    }

    fn abort(&self, rid: &str) -> PyResult<()> {
        self.engine()?.abort(rid);
        Ok(())
    }

    /// Loads a LoRA adapter requests may name from then on: its name, its adapter_config.json as
    /// a dict and its adapter_model.safetensors mapped (as `adapters` are given to `new`).
    fn load_lora_adapter(&self, py: Python<'_>, name: String, adapter_config: &Bound<'_, PyAny>, weights: &WeightStore) -> PyResult<()> {
        let adapter = peft_adapter(name, adapter_config, weights)?;
        let engine = self.engine()?;
        py.detach(|| engine.load_adapter(adapter)).map_err(to_py_err)
    }

    /// Unloads the LoRA adapter `name`; refused while requests use it.
    fn unload_lora_adapter(&self, py: Python<'_>, name: &str) -> PyResult<()> {
        let engine = self.engine()?;
        py.detach(|| engine.unload_adapter(name)).map_err(to_py_err)
    }

    /// The names of the LoRA adapters loaded.
    fn lora_adapters(&self) -> PyResult<Vec<String>> {
        Ok(self.engine()?.adapter_names())
    }

    /// Empties the prefix cache; false while requests are in flight.
    fn flush_cache(&self, py: Python<'_>) -> PyResult<bool> {
        let engine = self.engine()?;
        py.detach(|| engine.flush_cache()).map_err(to_py_err)
    }

    /// Engine counters.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        to_python(py, &self.engine()?.stats())
    }

    fn is_running(&self) -> bool {
        self.engine().is_ok_and(|e| e.is_running())
    }

    /// Stops the engine thread; requests in flight end with an abort.
    fn shutdown(&self, py: Python<'_>) {
        let engine = self.inner.lock().expect("engine lock").take();
        if let Some(engine) = engine {
            py.detach(move || engine.shutdown());
        }
    }
}

/// The outputs of one request.
#[pyclass(module = "rsgl._core")]
struct RequestStream {
    inner: Mutex<rsgl_engine::RequestStream>,
    /// Kept outside the lock, which a blocking `next` holds without the GIL.
    done: AtomicBool,
}

impl RequestStream {
    fn new(stream: Result<rsgl_engine::RequestStream, EngineError>) -> PyResult<Self> {
        Ok(RequestStream { inner: Mutex::new(stream.map_err(to_py_err)?), done: AtomicBool::new(false) })
    }

    fn answer<'py>(&self, py: Python<'py>, out: Result<Option<rsgl_engine::Output>, EngineError>) -> PyResult<Option<Bound<'py, PyAny>>> {
        let out = out.inspect_err(|_| self.done.store(true, Ordering::Release)).map_err(to_py_err)?;
        if out.as_ref().is_some_and(|o| o.finished.is_some()) {
            self.done.store(true, Ordering::Release);
        }
        out.map(|o| to_python(py, &o)).transpose()
    }
}

#[pymethods]
impl RequestStream {
    /// The next output, or None when `timeout` seconds passed first.
    fn next<'py>(&self, py: Python<'py>, timeout: f64) -> PyResult<Option<Bound<'py, PyAny>>> {
        let wait = Duration::from_secs_f64(timeout.max(0.0));
        let out = py.detach(|| self.inner.lock().expect("stream lock").next(wait));
        self.answer(py, out)
    }

    /// The next output if there is one now, else None (for callers woken by a Notifier).
    fn try_next<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        let out = py.detach(|| self.inner.lock().expect("stream lock").try_next());
        self.answer(py, out)
    }

    #[getter]
    fn rid(&self, py: Python<'_>) -> String {
        py.detach(|| self.inner.lock().expect("stream lock").rid.clone())
    }

    #[getter]
    fn done(&self) -> bool {
        self.done.load(Ordering::Acquire)
    }
}

/// Keys of requests with new outputs, and a socket that becomes readable when there are some:
/// an event loop watches `fileno()` and calls `take_ready()`, so no thread waits per request.
#[pyclass(module = "rsgl._core")]
struct Notifier {
    ready: Arc<ReadyKeys>,
    reader: UnixStream,
}

struct ReadyKeys {
    keys: Mutex<Vec<u64>>,
    writer: UnixStream,
}

impl ReadyKeys {
    /// Runs on the engine thread: one byte per batch of keys, so the socket never fills.
    fn push(&self, key: u64) {
        let mut keys = self.keys.lock().expect("ready keys lock");
        keys.push(key);
        if keys.len() == 1 {
            // A full socket (WouldBlock) already has bytes to wake the reader; a closed one has no reader.
            let _ = (&self.writer).write(&[1]);
        }
    }
}

#[pymethods]
impl Notifier {
    #[new]
    fn new() -> PyResult<Self> {
        let (reader, writer) = UnixStream::pair()?;
        reader.set_nonblocking(true)?;
        writer.set_nonblocking(true)?;
        Ok(Notifier { ready: Arc::new(ReadyKeys { keys: Mutex::new(Vec::new()), writer }), reader })
    }

    /// The file descriptor that becomes readable when keys are ready.
    fn fileno(&self) -> i32 {
        self.reader.as_raw_fd()
    }

    /// The keys pushed since the last call (a key may appear more than once).
    fn take_ready(&self) -> Vec<u64> {
        // Drain the wake-up bytes first: a key pushed after this still writes a fresh byte.
        let mut bytes = [0u8; 256];
        while matches!((&self.reader).read(&mut bytes), Ok(n) if n > 0) {}
        std::mem::take(&mut *self.ready.keys.lock().expect("ready keys lock"))
    }
}

/// What wakes a notifier's reader when a request has an output: `key` pushed onto it.
fn waker(notifier: Option<&Notifier>, key: u64) -> Option<rsgl_engine::Waker> {
    let ready = notifier?.ready.clone();
    Some(Arc::new(move || ready.push(key)))
}

/// A value of the engine's as the Python objects its serde form names (dicts, lists, str, ...).
fn to_python<'py>(py: Python<'py>, value: &impl serde::Serialize) -> PyResult<Bound<'py, PyAny>> {
    pythonize(py, value).map_err(|e| PyRuntimeError::new_err(format!("rsgl could not convert an engine value to Python: {e}")))
}

#[pyfunction]
fn kernel_isa() -> &'static str {
    rsgl_engine::kernel_isa()
}

/// Counts engine steps' time by phase from now (zeroing the counters) with `on`, stops counting
/// without. Process-wide: profile one engine at a time.
#[pyfunction]
fn profile_steps(on: bool) {
    if on {
        rsgl_engine::profile::reset();
    }
    rsgl_engine::profile::enable(on);
}

/// The decode steps (every sequence one new token) counted since `profile_steps(True)` and each
/// phase's totals over them: `(steps, [{phase, seconds, regions, wait_seconds, bytes}])`.
#[pyfunction]
fn decode_profile(py: Python<'_>) -> PyResult<(u64, Bound<'_, PyAny>)> {
    let (steps, phases) = rsgl_engine::profile::totals(true);
    let phases: Vec<_> = phases
        .iter()
        .map(|p| serde_json::json!({"phase": p.phase.name(), "seconds": p.seconds, "regions": p.regions, "wait_seconds": p.wait_seconds, "bytes": p.bytes}))
        .collect();
    Ok((steps, to_python(py, &phases)?))
}

/// The architectures the engine runs: their names in each checkpoint format and the facts the
/// config readers take from them.
#[pyfunction]
fn architectures(py: Python<'_>) -> PyResult<Bound<'_, PyAny>> {
    to_python(py, &rsgl_engine::config::ARCHITECTURES)
}

/// The engine options' JSON Schema (a dict): each option's type, default and help, which
/// `scripts/gen_options.py` turns into the Python option types, the server's flags and the docs.
#[pyfunction]
fn engine_options_schema(py: Python<'_>) -> PyResult<Bound<'_, PyAny>> {
    to_python(py, &EngineOptions::json_schema())
}

/// A JSON schema (given as JSON text) as the grammar enforces it: the schema rewritten by the
/// schema policy (JSON text), and what it relaxes, a list of `{keyword, pointer, action}` dicts,
/// empty when the schema is enforced as written.
#[pyfunction]
fn relax_json_schema<'py>(py: Python<'py>, schema: &str) -> PyResult<(String, Bound<'py, PyAny>)> {
    let (relaxed, relaxations) = rsgl_engine::grammar::relaxed_schema(schema).map_err(to_py_err)?;
    Ok((relaxed.to_string(), to_python(py, &relaxations)?))
}

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<WeightStore>()?;
    m.add_class::<ModelConfig>()?;
    m.add_class::<Tokenizer>()?;
    m.add_class::<Engine>()?;
    m.add_class::<RequestStream>()?;
    m.add_class::<Notifier>()?;
    m.add_function(wrap_pyfunction!(kernel_isa, m)?)?;
    m.add_function(wrap_pyfunction!(architectures, m)?)?;
    m.add_function(wrap_pyfunction!(engine_options_schema, m)?)?;
    m.add_function(wrap_pyfunction!(relax_json_schema, m)?)?;
    m.add_function(wrap_pyfunction!(profile_steps, m)?)?;
    m.add_function(wrap_pyfunction!(decode_profile, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
