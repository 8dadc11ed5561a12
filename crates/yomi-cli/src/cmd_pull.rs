//! `yomi pull ORG/NAME[@REV][:FILE]`: downloads a model from the Hugging Face hub
//! (`HF_ENDPOINT`) into the local Hugging Face cache, in the layout `huggingface_hub` writes, so
//! that `--model hf:ORG/NAME` (and any other tool reading that cache) finds it.

use anyhow::{Context, Result, anyhow};
use clap::Args;
use hf_hub::api::Progress;
use hf_hub::api::sync::{ApiBuilder, ApiError};
use hf_hub::{Cache, Repo, RepoType};
use indicatif::{ProgressBar, ProgressStyle};

use crate::hub::{self, ModelRef};
use crate::settings::Settings;

#[derive(Args, Debug)]
pub struct PullArgs {
    /// The model: ORG/NAME (a Hugging Face model directory, or a repository of one .gguf),
    /// ORG/NAME:FILE (one file, e.g. one of several .gguf), @REV after the name for a branch,
    /// tag or commit; `hf:` in front is allowed.
    #[arg(value_name = "ORG/NAME[:FILE]")]
    pub model: String,
}

pub fn run(a: PullArgs, settings: &Settings) -> Result<()> {
    let spec = a.model.as_str();
    let r = ModelRef::parse(spec).ok_or_else(|| {
        anyhow!("{spec}: expected ORG/NAME, ORG/NAME:FILE or ORG/NAME@REV (a Hugging Face model)")
    })?;
    let cache = settings.hf_cache.clone().ok_or_else(|| {
        anyhow!("no Hugging Face cache directory: set HF_HUB_CACHE, HF_HOME or HOME")
    })?;
    let endpoint = &settings.hf_endpoint;
    let mut builder = ApiBuilder::from_cache(Cache::new(cache.clone()))
        .with_endpoint(endpoint.clone())
        .with_progress(false)
        .with_retries(3)
        .with_user_agent("yomi", env!("CARGO_PKG_VERSION"));
    if let Some(token) = &settings.hf_token {
        builder = builder.with_token(Some(token.clone()));
    }
    let api = builder.build().map_err(|e| api_error(e, &r, endpoint))?;
    let repo = api.repo(Repo::with_revision(
        r.repo.clone(),
        RepoType::Model,
        r.rev().to_string(),
    ));
    let info = repo.info().map_err(|e| api_error(e, &r, endpoint))?;
    let listing: Vec<String> = info.siblings.into_iter().map(|s| s.rfilename).collect();
    let files = hub::files_to_pull(&r, &listing)?;
    let snapshot = hub::repo_dir(&cache, &r.repo)
        .join("snapshots")
        .join(&info.sha);
    for (i, file) in files.iter().enumerate() {
        if snapshot.join(file).exists() {
            continue;
        }
        let bar = Bar::new(format!("[{}/{}] {file}", i + 1, files.len()));
        repo.download_with_progress(file, bar)
            .map_err(|e| api_error(e, &r, endpoint))
            .with_context(|| format!("downloading {file} of {}", r.name()))?;
    }
    // Make refs/REV name this commit even when every file was there already.
    if r.revision.as_deref() != Some(info.sha.as_str()) {
        Cache::new(cache.clone())
            .repo(Repo::with_revision(
                r.repo.clone(),
                RepoType::Model,
                r.rev().to_string(),
            ))
            .create_ref(&info.sha)
            .with_context(|| format!("writing the ref of {} in {}", r.name(), cache.display()))?;
    }
    let path = hub::resolve_in_cache(&cache, &r)?;
    println!("{}", path.display());
    let mut use_as = format!("hf:{}", r.name());
    if let Some(f) = &r.file {
        use_as = format!("{use_as}:{f}");
    }
    eprintln!("pulled {use_as}: run it with `yomi run --model {use_as} -m \"Hello\"`");
    Ok(())
}

/// One line saying what failed: the hub unreachable, the model not found, access refused.
fn api_error(e: ApiError, r: &ModelRef, endpoint: &str) -> anyhow::Error {
    let name = r.name();
    match e {
        ApiError::RequestError(e) => match *e {
            ureq_error @ ureq::Error::Transport(_) => anyhow!(
                "cannot reach the Hugging Face hub at {endpoint} (HF_ENDPOINT) to pull {name}: {}",
                ureq_error.to_string().replace('\n', " ")
            ),
            ureq::Error::Status(404, _) => {
                anyhow!("{name} is not on the Hugging Face hub at {endpoint} (404)")
            }
            ureq::Error::Status(code @ (401 | 403), _) => anyhow!(
                "the Hugging Face hub at {endpoint} refused {name} ({code}): a private or gated \
                 model needs a token (HF_TOKEN, or `hf auth login`) with access to it"
            ),
            ureq::Error::Status(code, resp) => anyhow!(
                "the Hugging Face hub at {endpoint} answered {code} {} for {name}",
                resp.status_text()
            ),
        },
        ApiError::TooManyRetries(inner) => api_error(*inner, r, endpoint),
        other => anyhow!("pulling {name} from {endpoint}: {other}"),
    }
}

/// A download progress bar on stderr (hidden when stderr is not a terminal).
struct Bar(ProgressBar);

impl Bar {
    fn new(msg: String) -> Bar {
        let bar = ProgressBar::new(0);
        bar.set_style(
            ProgressStyle::with_template(
                "{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} ({eta})",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        bar.set_message(msg);
        Bar(bar)
    }
}

impl Progress for Bar {
    fn init(&mut self, size: usize, _filename: &str) {
        self.0.set_length(size as u64);
        self.0.set_position(0);
    }
    fn update(&mut self, size: usize) {
        self.0.inc(size as u64);
    }
    fn finish(&mut self) {
        self.0.finish_and_clear();
    }
}
