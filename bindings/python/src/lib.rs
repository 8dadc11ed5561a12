//! yomi's Python package: `yomi.Model(path, device="auto")` loads a model as `yomi run` does,
//! and `Model.generate(prompt or messages, …)` answers it with the text, the token ids, the
//! finish reason and the stats `yomi run --json` prints; with `stream=True` it returns an
//! iterator of text pieces instead.
//!
//! Generation runs on a thread of its own and hands its pieces over a channel; the calling
//! thread waits for them detached from the interpreter (the GIL released), waking every
//! [`POLL`] to let Ctrl-C in. One generation runs at a time per model (the server's worker
//! does the same); a second caller waits its turn.

// The crate has no Rust tests (pytest covers it: tests/python/test_python_package.py), and its
// test build is empty: `cargo test --workspace --lib` and `clippy --all-targets` build the lib
// as a test even with `test = false`, and the two CLI files included below bring their unit
// tests (run in yomi-cli, with its dev-dependencies) along.
#![cfg(not(test))]

// The CLI's resolution of model names (`hf:ORG/NAME` from the Hugging Face cache) and its
// reading of the environment (`YOMI_*`, `HF_*`), compiled in from yomi-cli's own files so that
// the package finds and configures a model exactly as `yomi` does (yomi-cli is a binary crate;
// these two files need only std, anyhow and the engine crates). The parts only the CLI uses
// (`yomi pull`'s file list, the server's key, the hub's address) are unused here.
#[allow(dead_code)]
#[path = "../../../crates/yomi-cli/src/hub.rs"]
mod hub;
#[allow(dead_code)]
#[path = "../../../crates/yomi-cli/src/settings.rs"]
mod settings;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pyo3::create_exception;
use pyo3::exceptions::{PyFileNotFoundError, PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString};
use yomi_core::SamplerParams;
use yomi_engine::dflash_drafter::DraftShape;
use yomi_engine::generate::DEFAULT_DRAFT_BUDGET;
use yomi_engine::stats::StatsRecorder;
use yomi_engine::template::ChatMessage;
use yomi_engine::{DraftMode, Engine, EngineOptions, GenerateParams, Generation, Prompt};
use yomi_models::{KvDtype, State};

use settings::Settings;

create_exception!(
    yomi,
    YomiError,
    PyRuntimeError,
    "An error of the yomi engine, with its one-line message."
);

/// How often a waiting caller wakes to check for signals (Ctrl-C).
const POLL: Duration = Duration::from_millis(50);

/// An error as one line, `outer: inner: …`, as the CLI prints it.
fn one_line(e: &anyhow::Error) -> String {
    format!("{e:#}").replace('\n', " ")
}

fn engine_err(e: anyhow::Error) -> PyErr {
    YomiError::new_err(one_line(&e))
}

fn value_err(e: impl std::fmt::Display) -> PyErr {
    PyValueError::new_err(e.to_string())
}

/// Why a model did not load: its path names nothing (FileNotFoundError), or anything else.
enum LoadError {
    NotFound(anyhow::Error),
    Engine(anyhow::Error),
}

impl From<LoadError> for PyErr {
    fn from(e: LoadError) -> PyErr {
        match e {
            LoadError::NotFound(e) => PyFileNotFoundError::new_err(one_line(&e)),
            LoadError::Engine(e) => engine_err(e),
        }
    }
}

/// Loads a model as `yomi run` does (crates/yomi-cli/src/common.rs, `load_engine`): the name
/// resolved from the Hugging Face cache if it is one; on the GPU with `cuda`, or with `auto`
/// when one is present, each layer uploaded as it is read; `auto` falls back to the CPU when
/// the GPU cannot take the model (the note says why).
fn load(
    path: &Path,
    device: &str,
    opts: &EngineOptions,
    settings: &Settings,
) -> Result<(Engine, Option<String>), LoadError> {
    // Before reading anything, as `yomi run --device cuda` does.
    if device == "cuda" && !yomi_cuda::cuda_available() {
        return Err(LoadError::Engine(anyhow::anyhow!(
            "device=\"cuda\": no CUDA driver (libcuda.so) or GPU found"
        )));
    }
    let resolved =
        hub::resolve_model(path, settings.hf_cache.as_deref()).map_err(LoadError::NotFound)?;
    let failed = |e: anyhow::Error| {
        if resolved.exists() {
            LoadError::Engine(e)
        } else {
            LoadError::NotFound(e)
        }
    };
    let gpu = match device {
        "cuda" => true,
        "auto" => yomi_cuda::cuda_available(),
        _ => false,
    };
    let mut note = None;
    if gpu {
        match load_on_gpu(&resolved, opts, settings) {
            Ok(engine) => return Ok((engine, None)),
            Err((e, true)) if device == "auto" => {
                note = Some(format!(
                    "yomi: running on the CPU: the GPU could not take the model: {}",
                    one_line(&e)
                ));
            }
            Err((e, true)) => return Err(LoadError::Engine(e.context("device=\"cuda\""))),
            Err((e, false)) => return Err(failed(e)),
        }
    }
    let engine = Engine::load(&resolved, opts, &mut |_, _| {}).map_err(failed)?;
    Ok((engine, note))
}

/// Loads the model straight onto GPU 0; the error says whether the device failed (true) or
/// the model itself could not be read (false). As the CLI's `load_on_gpu`.
fn load_on_gpu(
    path: &Path,
    opts: &EngineOptions,
    settings: &Settings,
) -> Result<Engine, (anyhow::Error, bool)> {
    let mut up = yomi_engine::cuda::Uploader::open(0, &settings.cuda).map_err(|e| (e, true))?;
    let mut engine = Engine::load_into(path, opts, &mut |_, _| {}, Some(&mut up))
        .map_err(|e| (e, up.failed()))?;
    up.finish(&mut engine.model).map_err(|e| (e, true))?;
    Ok(engine)
}

/// A seed for requests that give none, as the CLI's `random_seed`.
fn random_seed() -> u64 {
    use std::collections::hash_map::RandomState;
    use std::hash::{BuildHasher, Hasher};
    let mut h = RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    h.finish()
}

/// A loaded model: `Model(path, device="auto", *, ctx_size=None, threads=None, kv_cache="f16",
/// draft_model=None, draft_tree="tree", mtp_steps=None)`.
#[pyclass(module = "yomi", frozen)]
struct Model {
    engine: Arc<Engine>,
    /// A DFlash drafter is attached (`draft_model`): `draft="dflash"` drafts with it.
    dflash: bool,
    /// The model's MTP block is attached (`mtp_steps`): `draft="mtp"` drafts with it.
    mtp: bool,
    /// The sequence state, reused from request to request; held by the running generation,
    /// which makes a second one wait for it.
    state: Arc<Mutex<Option<State>>>,
    device: String,
}

/// What a generation thread sends its caller.
enum Msg {
    Piece(String),
    // Boxed: a generation is large beside a piece.
    Done(anyhow::Result<Box<Generation>>),
}

/// A generation running on its own thread.
struct Job {
    /// In a mutex only so that a waiting caller can hold it without the GIL (a receiver is
    /// not `Sync`); never locked while the GIL is being taken back.
    rx: Mutex<Receiver<Msg>>,
    /// Set when the caller gives up (Ctrl-C, `close()`): the next piece ends the generation.
    cancel: Arc<AtomicBool>,
}

impl Job {
    fn start(
        model: &Model,
        ids: Vec<u32>,
        params: GenerateParams,
        stats: StatsRecorder,
        stream: bool,
    ) -> PyResult<Job> {
        let (tx, rx) = mpsc::channel();
        let cancel = Arc::new(AtomicBool::new(false));
        let engine = Arc::clone(&model.engine);
        let slot = Arc::clone(&model.state);
        let stop = Arc::clone(&cancel);
        std::thread::Builder::new()
            .name("yomi-generate".into())
            .spawn(move || {
                // A generation that panicked leaves the mutex poisoned; generate resets the
                // state it is given, so it is still good to use.
                let mut slot = slot.lock().unwrap_or_else(|p| p.into_inner());
                let state = slot.get_or_insert_with(|| engine.new_state());
                let pieces = tx.clone();
                let r = engine.generate(state, &ids, &params, stats, &mut |t: &str| {
                    // False ends the generation (finish reason "cancelled"): the caller gave up,
                    // or dropped the stream (its receiver is gone).
                    !stop.load(Ordering::Relaxed)
                        && (!stream || pieces.send(Msg::Piece(t.to_owned())).is_ok())
                });
                // A caller that is gone wants no result.
                let _ = tx.send(Msg::Done(r.map(Box::new)));
            })
            .map_err(|e| YomiError::new_err(format!("cannot start a generation thread: {e}")))?;
        Ok(Job {
            rx: Mutex::new(rx),
            cancel,
        })
    }

    /// The next message, waited for without the GIL; None when the thread ended without a
    /// result (it panicked). A pending signal (Ctrl-C) cancels the generation and is raised.
    fn next(&self, py: Python<'_>) -> PyResult<Option<Msg>> {
        loop {
            let got = py.detach(|| {
                let rx = self.rx.lock().unwrap_or_else(|p| p.into_inner());
                rx.recv_timeout(POLL)
            });
            match got {
                Ok(m) => return Ok(Some(m)),
                Err(RecvTimeoutError::Disconnected) => return Ok(None),
                Err(RecvTimeoutError::Timeout) => {
                    if let Err(e) = py.check_signals() {
                        self.cancel.store(true, Ordering::Relaxed);
                        return Err(e);
                    }
                }
            }
        }
    }
}

fn thread_died() -> PyErr {
    YomiError::new_err("the generation thread stopped without a result (see its message above)")
}

/// A chat message from Python: a dict with str `role` and `content` (and optionally
/// `reasoning_content`).
fn message(i: usize, m: &Bound<'_, PyAny>) -> PyResult<ChatMessage> {
    let d = m.cast::<PyDict>().map_err(|_| {
        PyTypeError::new_err(format!(
            "message {i}: expected a dict with \"role\" and \"content\", got {}",
            type_name(m)
        ))
    })?;
    let field = |key: &str, required: bool| -> PyResult<Option<String>> {
        match d.get_item(key)? {
            Some(v) if v.is_none() && !required => Ok(None),
            Some(v) => v.extract::<String>().map(Some).map_err(|_| {
                PyTypeError::new_err(format!(
                    "message {i}: \"{key}\" must be a str, got {}",
                    type_name(&v)
                ))
            }),
            None if required => Err(PyValueError::new_err(format!(
                "message {i} has no \"{key}\""
            ))),
            None => Ok(None),
        }
    };
    Ok(ChatMessage {
        role: field("role", true)?.unwrap_or_default(),
        content: field("content", true)?.unwrap_or_default(),
        reasoning_content: field("reasoning_content", false)?,
    })
}

fn type_name(v: &Bound<'_, PyAny>) -> String {
    v.get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "?".into())
}

/// A str is the prompt as is; a list of messages goes through the model's chat template.
fn prompt(p: &Bound<'_, PyAny>, enable_thinking: Option<bool>) -> PyResult<Prompt> {
    if let Ok(s) = p.cast::<PyString>() {
        return Ok(Prompt::Text(s.to_cow()?.into_owned()));
    }
    if p.is_instance_of::<PyDict>() {
        return Err(PyTypeError::new_err(
            "expected a str or a list of messages, got one dict (wrap it in a list)",
        ));
    }
    let items = p.try_iter().map_err(|_| {
        PyTypeError::new_err(format!(
            "expected a str or a list of messages, got {}",
            type_name(p)
        ))
    })?;
    let mut messages = Vec::new();
    for (i, m) in items.enumerate() {
        messages.push(message(i, &m?)?);
    }
    if messages.is_empty() {
        return Err(PyValueError::new_err("the list of messages is empty"));
    }
    Ok(Prompt::Chat {
        messages,
        enable_thinking,
    })
}

/// `stop`: None, one str, or a list of them.
fn stop_strings(stop: Option<&Bound<'_, PyAny>>) -> PyResult<Vec<String>> {
    match stop {
        None => Ok(Vec::new()),
        Some(s) if s.is_none() => Ok(Vec::new()),
        Some(s) => {
            if let Ok(one) = s.cast::<PyString>() {
                return Ok(vec![one.to_cow()?.into_owned()]);
            }
            s.extract::<Vec<String>>().map_err(|_| {
                PyTypeError::new_err(format!(
                    "stop: expected a str or a list of str, got {}",
                    type_name(s)
                ))
            })
        }
    }
}

/// The result of [`Model::generate`].
#[pyclass(module = "yomi", frozen)]
struct GenerationResult {
    /// The generated text (without a stop string that ended it).
    #[pyo3(get)]
    text: String,
    /// The generated token ids.
    #[pyo3(get)]
    tokens: Vec<u32>,
    /// The prompt's token ids (after the chat template, if any).
    #[pyo3(get)]
    prompt_tokens: Vec<u32>,
    /// "stop", "length" or "cancelled", as `yomi run --json` says it.
    #[pyo3(get)]
    finish_reason: String,
    /// The stats: a dict with the keys of `yomi run --json`'s "stats".
    #[pyo3(get)]
    stats: Py<PyAny>,
}

impl GenerationResult {
    fn new(py: Python<'_>, g: Box<Generation>) -> PyResult<GenerationResult> {
        let g = *g;
        // Through JSON, so the keys and values are exactly those `yomi run --json` prints.
        let json = serde_json::to_string(&g.stats).map_err(value_err)?;
        let stats = py.import("json")?.call_method1("loads", (json,))?.unbind();
        let finish_reason = match serde_json::to_value(g.finish_reason) {
            Ok(serde_json::Value::String(s)) => s,
            _ => format!("{:?}", g.finish_reason).to_lowercase(),
        };
        Ok(GenerationResult {
            text: g.text,
            tokens: g.output_ids,
            prompt_tokens: g.prompt_ids,
            finish_reason,
            stats,
        })
    }
}

#[pymethods]
impl GenerationResult {
    fn __str__(&self) -> &str {
        &self.text
    }

    fn __repr__(&self) -> String {
        format!(
            "GenerationResult(text={:?}, tokens=<{} ids>, finish_reason={:?})",
            self.text,
            self.tokens.len(),
            self.finish_reason
        )
    }
}

/// The iterator `generate(..., stream=True)` returns: text pieces as they are generated, then
/// `result` and `stats` once it is exhausted.
#[pyclass(module = "yomi", frozen)]
struct Stream {
    job: Job,
    done: AtomicBool,
    result: Mutex<Option<Py<GenerationResult>>>,
}

#[pymethods]
impl Stream {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__(&self, py: Python<'_>) -> PyResult<Option<String>> {
        if self.done.load(Ordering::Relaxed) {
            return Ok(None);
        }
        let msg = self.job.next(py)?;
        if !matches!(msg, Some(Msg::Piece(_))) {
            self.done.store(true, Ordering::Relaxed);
        }
        match msg {
            Some(Msg::Piece(t)) => Ok(Some(t)),
            Some(Msg::Done(Ok(g))) => {
                let r = Py::new(py, GenerationResult::new(py, g)?)?;
                *self.result.lock().unwrap_or_else(|p| p.into_inner()) = Some(r);
                Ok(None)
            }
            Some(Msg::Done(Err(e))) => Err(engine_err(e)),
            None => Err(thread_died()),
        }
    }

    /// The whole result once the stream is exhausted (None before).
    #[getter]
    fn result(&self, py: Python<'_>) -> Option<Py<GenerationResult>> {
        let r = self.result.lock().unwrap_or_else(|p| p.into_inner());
        r.as_ref().map(|r| r.clone_ref(py))
    }

    /// The stats (as `yomi run --json`'s) once the stream is exhausted (None before).
    #[getter]
    fn stats(&self, py: Python<'_>) -> Option<Py<PyAny>> {
        let r = self.result.lock().unwrap_or_else(|p| p.into_inner());
        r.as_ref().map(|r| r.get().stats.clone_ref(py))
    }

    /// Stops the generation early (its result's finish reason is then "cancelled").
    fn close(&self) {
        self.job.cancel.store(true, Ordering::Relaxed);
    }
}

#[pymethods]
impl Model {
    #[new]
    // One argument per Python keyword.
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (
        path, device = "auto", *, ctx_size = None, threads = None, kv_cache = "f16",
        draft_model = None, draft_tree = "tree", mtp_steps = None
    ))]
    fn new(
        py: Python<'_>,
        path: PathBuf,
        device: &str,
        ctx_size: Option<usize>,
        threads: Option<usize>,
        kv_cache: &str,
        draft_model: Option<PathBuf>,
        draft_tree: &str,
        mtp_steps: Option<usize>,
    ) -> PyResult<Model> {
        if !matches!(device, "cpu" | "cuda" | "auto") {
            return Err(PyValueError::new_err(format!(
                "device={device:?}: expected \"cpu\", \"cuda\" or \"auto\""
            )));
        }
        let kv: KvDtype = kv_cache
            .parse()
            .map_err(|e| PyValueError::new_err(format!("kv_cache={kv_cache:?}: {e}")))?;
        let shape: DraftShape = draft_tree
            .parse()
            .map_err(|e| PyValueError::new_err(format!("draft_tree={draft_tree:?}: {e}")))?;
        // The environment, read as `yomi` reads it (YOMI_*, HF_HUB_CACHE, …).
        let settings = Settings::from_env().map_err(|e| value_err(one_line(&e)))?;
        settings.install().map_err(engine_err)?;
        let opts = EngineOptions {
            context_size: ctx_size,
            threads,
            kv_cache: Some(kv),
            quant_pack: settings.quant_pack,
            pass_threads: settings.pass_threads,
            pass_trace: settings.pass_trace,
        };
        let (mut engine, note) = py.detach(|| load(&path, device, &opts, &settings))?;
        // The DFlash drafter, as `yomi run --draft dflash --draft-model DIR` attaches it.
        if let Some(dir) = &draft_model {
            py.detach(|| engine.attach_dflash(dir, shape))
                .map_err(engine_err)?;
        }
        // The model's own MTP block, as `yomi run --draft mtp --mtp-steps N` attaches it.
        if let Some(steps) = mtp_steps {
            py.detach(|| {
                engine.attach_mtp(shape, steps, yomi_engine::mtp_drafter::DEFAULT_DRAFT_VOCAB)
            })
            .map_err(engine_err)?;
        }
        if let Some(note) = note {
            let warning = py.get_type::<pyo3::exceptions::PyRuntimeWarning>();
            py.import("warnings")?
                .call_method1("warn", (note, warning, 2))?;
        }
        let device = engine.device();
        Ok(Model {
            engine: Arc::new(engine),
            dflash: draft_model.is_some(),
            mtp: mtp_steps.is_some(),
            state: Arc::new(Mutex::new(None)),
            device,
        })
    }

    /// Where the model runs, in words (as `yomi run --json`'s "device").
    #[getter]
    fn device(&self) -> &str {
        &self.device
    }

    /// The model's path (the Hugging Face cache's snapshot for a name).
    #[getter]
    fn path(&self) -> String {
        self.engine.path.to_string_lossy().into_owned()
    }

    /// The context size in tokens.
    #[getter]
    fn context_size(&self) -> usize {
        self.engine.context_size
    }

    fn __repr__(&self) -> String {
        format!(
            "Model({:?}, device={:?})",
            self.engine.path.display().to_string(),
            self.device
        )
    }

    /// Generates from a prompt (a str, as is) or a list of messages (`{"role": …, "content":
    /// …}` dicts, through the model's chat template). Sampling settings left at None take the
    /// model's generation_config, else greedy, as `yomi run` does.
    // One argument per Python keyword.
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (
        prompt, *, max_tokens = 512, temperature = None, top_p = None, top_k = None,
        min_p = None, seed = None, draft = "suffix", draft_budget = DEFAULT_DRAFT_BUDGET,
        stop = None, enable_thinking = None, stream = false
    ))]
    fn generate<'py>(
        &self,
        py: Python<'py>,
        prompt: &Bound<'py, PyAny>,
        max_tokens: usize,
        temperature: Option<f32>,
        top_p: Option<f32>,
        top_k: Option<usize>,
        min_p: Option<f32>,
        seed: Option<u64>,
        draft: &str,
        draft_budget: usize,
        stop: Option<&Bound<'py, PyAny>>,
        enable_thinking: Option<bool>,
        stream: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        // Stats count from the request's arrival.
        let stats = StatsRecorder::start();
        let prompt = self::prompt(prompt, enable_thinking)?;
        if matches!(prompt, Prompt::Chat { .. }) && self.engine.template.is_none() {
            return Err(PyValueError::new_err(format!(
                "{} has no chat template; pass the prompt as a str to use it as is",
                self.engine.path.display()
            )));
        }
        let draft = draft.parse::<DraftMode>().map_err(value_err)?;
        if draft == DraftMode::DFlash && !self.dflash {
            return Err(PyValueError::new_err(
                "draft=\"dflash\" needs a DFlash drafter: load the model with \
                 yomi.Model(path, draft_model=DIR)",
            ));
        }
        if draft == DraftMode::Mtp && !self.mtp {
            return Err(PyValueError::new_err(
                "draft=\"mtp\" needs the model's MTP block: load the model with \
                 yomi.Model(path, mtp_steps=N)",
            ));
        }
        let d = &self.engine.defaults;
        let params = GenerateParams {
            max_tokens,
            sampler: SamplerParams {
                temperature: temperature.or(d.temperature).unwrap_or(0.0),
                top_k: top_k.or(d.top_k).unwrap_or(0),
                top_p: top_p.or(d.top_p).unwrap_or(1.0),
                min_p: min_p.or(d.min_p).unwrap_or(0.0),
                seed: seed.unwrap_or_else(random_seed),
            },
            stop: stop_strings(stop)?,
            draft,
            draft_budget,
        };
        params.validate().map_err(value_err)?;
        let engine = &self.engine;
        let ids = py
            .detach(|| engine.prompt_ids(&prompt))
            .map_err(|e| value_err(one_line(&e)))?;
        let job = Job::start(self, ids, params, stats, stream)?;
        if stream {
            let s = Stream {
                job,
                done: AtomicBool::new(false),
                result: Mutex::new(None),
            };
            return Ok(Bound::new(py, s)?.into_any());
        }
        loop {
            match job.next(py)? {
                Some(Msg::Piece(_)) => {}
                Some(Msg::Done(Ok(g))) => {
                    return Ok(Bound::new(py, GenerationResult::new(py, g)?)?.into_any());
                }
                Some(Msg::Done(Err(e))) => return Err(engine_err(e)),
                None => return Err(thread_died()),
            }
        }
    }
}

#[pymodule]
fn yomi(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Model>()?;
    m.add_class::<GenerationResult>()?;
    m.add_class::<Stream>()?;
    m.add("YomiError", m.py().get_type::<YomiError>())?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
