//! Models by name from the local Hugging Face cache, the layout that `huggingface_hub` and the
//! `hf-hub` crate write:
//!
//! ```text
//! <cache>/models--ORG--NAME/refs/main                  the commit hash `main` points at
//! <cache>/models--ORG--NAME/snapshots/<hash>/FILE      each file (a symlink into blobs/)
//! <cache>/models--ORG--NAME/blobs/<etag>
//! ```
//!
//! `--model` takes `hf:ORG/NAME`, or `ORG/NAME` when no such path exists, with `@REV` (a branch,
//! tag or commit) and `:FILE` (one file of the snapshot, e.g. one of several `.gguf`) after it.
//! Pure functions of the cache root: the caller passes the directory that
//! [`crate::settings::Settings`] read from the environment.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use anyhow::{Result, bail};

/// The hub `HF_ENDPOINT` defaults to.
pub const DEFAULT_ENDPOINT: &str = "https://huggingface.co";

/// A model named on the hub: `ORG/NAME[@REV][:FILE]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelRef {
    /// `ORG/NAME` (or a bare legacy `NAME` after `hf:`).
    pub repo: String,
    /// `@REV`: a branch, tag or commit hash (default `main`).
    pub revision: Option<String>,
    /// `:FILE`: a path inside the snapshot.
    pub file: Option<String>,
}

impl ModelRef {
    /// Parses `[hf:]ORG/NAME[@REV][:FILE]`. Without `hf:` the name must be exactly `ORG/NAME`
    /// (so that paths such as `./x`, `/x/y` or `a/b/c` are never taken for one).
    pub fn parse(spec: &str) -> Option<ModelRef> {
        let (explicit, rest) = match spec.strip_prefix("hf:") {
            Some(rest) => (true, rest),
            None => (false, spec),
        };
        let (head, file) = match rest.split_once(':') {
            Some((head, file)) => (head, Some(file)),
            None => (rest, None),
        };
        let (repo, revision) = match head.split_once('@') {
            Some((repo, rev)) => (repo, Some(rev)),
            None => (head, None),
        };
        let parts: Vec<&str> = repo.split('/').collect();
        let shape_ok = parts.len() == 2 || (explicit && parts.len() == 1);
        if !shape_ok || !parts.iter().all(|p| is_name(p)) {
            return None;
        }
        if let Some(rev) = revision
            && (rev.is_empty() || rev.split('/').any(|c| c.is_empty() || c == ".."))
        {
            return None;
        }
        if let Some(file) = file
            && (file.is_empty()
                || file.starts_with('/')
                || file.split('/').any(|c| c.is_empty() || c == ".."))
        {
            return None;
        }
        Some(ModelRef {
            repo: repo.to_string(),
            revision: revision.map(str::to_string),
            file: file.map(str::to_string),
        })
    }

    /// `ORG/NAME[@REV]`, as the user wrote it.
    pub fn name(&self) -> String {
        match &self.revision {
            Some(rev) => format!("{}@{rev}", self.repo),
            None => self.repo.clone(),
        }
    }

    /// The revision, `main` unless `@REV` was given.
    pub fn rev(&self) -> &str {
        self.revision.as_deref().unwrap_or("main")
    }
}

/// A repository name part: letters, digits, `-`, `_`, `.`, not starting with `.` or `-`.
fn is_name(s: &str) -> bool {
    s.chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// The hub cache directory as `huggingface_hub` finds it: `HF_HUB_CACHE`, else
/// `$HF_HOME/hub`, else `$XDG_CACHE_HOME/huggingface/hub`, else `$HOME/.cache/huggingface/hub`
/// (a leading `~/` in `HF_HOME` or `HF_HUB_CACHE` is `$HOME/`). Empty values count as unset.
pub fn cache_dir_from(
    hub_cache: Option<OsString>,
    hf_home: Option<OsString>,
    xdg_cache_home: Option<OsString>,
    home: Option<OsString>,
) -> Option<PathBuf> {
    let set = |v: Option<OsString>| v.filter(|v| !v.is_empty()).map(PathBuf::from);
    let home = set(home);
    let expand = |p: PathBuf| match (p.strip_prefix("~"), &home) {
        (Ok(rest), Some(h)) => h.join(rest),
        _ => p,
    };
    if let Some(p) = set(hub_cache) {
        return Some(expand(p));
    }
    if let Some(p) = set(hf_home) {
        return Some(expand(p).join("hub"));
    }
    let cache = set(xdg_cache_home).or_else(|| home.as_ref().map(|h| h.join(".cache")))?;
    Some(cache.join("huggingface").join("hub"))
}

/// `<cache>/models--ORG--NAME`.
pub fn repo_dir(cache: &Path, repo: &str) -> PathBuf {
    cache.join(format!("models--{}", repo.replace('/', "--")))
}

/// The snapshot directory of `r`'s revision: `refs/REV` names its commit (a 40-hex `REV` is
/// the commit itself); with no `refs/main`, a repository holding one snapshot has that one.
pub fn snapshot_dir(cache: &Path, r: &ModelRef) -> Result<PathBuf> {
    let repo = repo_dir(cache, &r.repo);
    let missing = || {
        anyhow::anyhow!(
            "{} is not in the Hugging Face cache at {} (download it with `yomi pull {}`)",
            r.name(),
            cache.display(),
            r.name()
        )
    };
    if !repo.is_dir() {
        return Err(missing());
    }
    let snapshots = repo.join("snapshots");
    let rev = r.rev();
    if rev.len() == 40 && rev.chars().all(|c| c.is_ascii_hexdigit()) {
        let dir = snapshots.join(rev);
        return if dir.is_dir() {
            Ok(dir)
        } else {
            Err(missing())
        };
    }
    match std::fs::read_to_string(repo.join("refs").join(rev)) {
        Ok(hash) => {
            let dir = snapshots.join(hash.trim());
            if dir.is_dir() {
                Ok(dir)
            } else {
                bail!(
                    "{}: refs/{rev} names commit {} but {} has no such snapshot",
                    r.name(),
                    hash.trim(),
                    repo.display()
                )
            }
        }
        Err(_) if r.revision.is_none() => {
            let dirs: Vec<PathBuf> = std::fs::read_dir(&snapshots)
                .map(|rd| {
                    rd.filter_map(|e| e.ok().map(|e| e.path()))
                        .filter(|p| p.is_dir())
                        .collect()
                })
                .unwrap_or_default();
            match dirs.as_slice() {
                [one] => Ok(one.clone()),
                _ => Err(missing()),
            }
        }
        Err(_) => Err(missing()),
    }
}

/// The `.gguf` files of a snapshot, as paths relative to it, sorted.
pub fn gguf_files(dir: &Path) -> Vec<String> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) {
        let Ok(rd) = std::fs::read_dir(dir) else {
            return;
        };
        for e in rd.flatten() {
            let p = e.path();
            if e.file_name().to_string_lossy().starts_with('.') {
                continue;
            }
            if p.is_dir() {
                walk(root, &p, out);
            } else if p
                .extension()
                .is_some_and(|x| x.eq_ignore_ascii_case("gguf"))
                && let Ok(rel) = p.strip_prefix(root)
            {
                out.push(rel.to_string_lossy().into_owned());
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out.sort();
    out
}

/// What a cached model is to the loader: `:FILE` if given; else the snapshot directory when it
/// holds `config.json` (a Hugging Face model directory); else its one `.gguf` file.
pub fn resolve_in_cache(cache: &Path, r: &ModelRef) -> Result<PathBuf> {
    let snap = snapshot_dir(cache, r)?;
    let name = r.name();
    if let Some(file) = &r.file {
        let p = snap.join(file);
        if p.exists() {
            return Ok(p);
        }
        let ggufs = gguf_files(&snap);
        let have = if ggufs.is_empty() {
            String::new()
        } else {
            format!("; it has {}", ggufs.join(", "))
        };
        bail!(
            "{name} has no {file} in the Hugging Face cache at {} (download it with `yomi pull {name}:{file}`{have})",
            snap.display()
        );
    }
    if snap.join("config.json").is_file() {
        return Ok(snap);
    }
    let ggufs = gguf_files(&snap);
    match ggufs.as_slice() {
        [one] => Ok(snap.join(one)),
        [] => bail!(
            "{name} in the Hugging Face cache at {} has neither config.json nor a .gguf file",
            snap.display()
        ),
        many => bail!(
            "{name} has {} .gguf files; name one as {name}:FILE, one of: {}",
            many.len(),
            many.join(", ")
        ),
    }
}

/// What `--model` names: an existing path as it is; else `hf:ORG/NAME` or `ORG/NAME` (with
/// `@REV` and `:FILE`) from the Hugging Face cache; else the path unchanged (for the loader's
/// own error).
pub fn resolve_model(arg: &Path, cache: Option<&Path>) -> Result<PathBuf> {
    if arg.exists() {
        return Ok(arg.to_path_buf());
    }
    let Some(spec) = arg.to_str() else {
        return Ok(arg.to_path_buf());
    };
    let Some(r) = ModelRef::parse(spec) else {
        if spec.starts_with("hf:") {
            bail!("{spec}: expected hf:ORG/NAME, hf:ORG/NAME@REV or hf:ORG/NAME:FILE");
        }
        return Ok(arg.to_path_buf());
    };
    let explicit = spec.starts_with("hf:");
    let Some(cache) = cache else {
        bail!(
            "{spec}: no Hugging Face cache directory (set HF_HUB_CACHE, HF_HOME or HOME){}",
            if explicit {
                ""
            } else {
                ", and no such file or directory"
            }
        );
    };
    resolve_in_cache(cache, &r).map_err(|e| {
        if explicit {
            e
        } else {
            anyhow::anyhow!("{spec}: no such file or directory, and {e:#}")
        }
    })
}

/// The files `yomi pull` fetches of a repository listing: `:FILE` alone; else, for a Hugging
/// Face model directory (`config.json`), its top-level weights, configuration and tokenizer
/// files; else its one `.gguf` (several: an error listing them).
pub fn files_to_pull(r: &ModelRef, listing: &[String]) -> Result<Vec<String>> {
    let name = r.name();
    if let Some(file) = &r.file {
        if listing.iter().any(|f| f == file) {
            return Ok(vec![file.clone()]);
        }
        bail!("{name} has no file {file}");
    }
    if listing.iter().any(|f| f == "config.json") {
        let keep = |f: &&String| {
            !f.contains('/')
                && (f == &"tokenizer.model"
                    || [".json", ".safetensors", ".jinja", ".txt"]
                        .iter()
                        .any(|x| f.ends_with(x)))
        };
        return Ok(listing.iter().filter(keep).cloned().collect());
    }
    let ggufs: Vec<&String> = listing
        .iter()
        .filter(|f| f.to_ascii_lowercase().ends_with(".gguf"))
        .collect();
    match ggufs.as_slice() {
        [one] => Ok(vec![(*one).clone()]),
        [] => bail!("{name} has neither config.json nor a .gguf file"),
        many => bail!(
            "{name} has {} .gguf files; pull one with `yomi pull {name}:FILE`, one of: {}",
            many.len(),
            many.iter()
                .map(|s| s.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(repo: &str, revision: Option<&str>, file: Option<&str>) -> ModelRef {
        ModelRef {
            repo: repo.into(),
            revision: revision.map(Into::into),
            file: file.map(Into::into),
        }
    }

    #[test]
    fn parses_names() {
        assert_eq!(
            ModelRef::parse("hf:Qwen/Qwen3-0.6B"),
            Some(r("Qwen/Qwen3-0.6B", None, None))
        );
        assert_eq!(
            ModelRef::parse("Qwen/Qwen3-0.6B"),
            Some(r("Qwen/Qwen3-0.6B", None, None))
        );
        assert_eq!(
            ModelRef::parse("unsloth/Qwen3-GGUF@v2:q4/Qwen3-Q4_0.gguf"),
            Some(r(
                "unsloth/Qwen3-GGUF",
                Some("v2"),
                Some("q4/Qwen3-Q4_0.gguf")
            ))
        );
        assert_eq!(ModelRef::parse("hf:gpt2"), Some(r("gpt2", None, None)));
        for not in [
            "gpt2", "./a/b", "/a/b", "a/b/c", "~/m", "../m", ".a/b", "a/b:", "a/b:../x", "a/b@",
            "hf:a/b/c", "a b/c",
        ] {
            assert_eq!(ModelRef::parse(not), None, "{not}");
        }
    }

    #[test]
    fn cache_dir_follows_huggingface_hub() {
        let o = |s: &str| Some(OsString::from(s));
        let d = cache_dir_from;
        assert_eq!(d(o("/c"), o("/h"), o("/x"), o("/u")), Some("/c".into()));
        assert_eq!(d(o(""), o("/h"), o("/x"), o("/u")), Some("/h/hub".into()));
        assert_eq!(d(None, o("~/h"), None, o("/u")), Some("/u/h/hub".into()));
        assert_eq!(
            d(None, None, o("/x"), o("/u")),
            Some("/x/huggingface/hub".into())
        );
        assert_eq!(
            d(None, None, None, o("/u")),
            Some("/u/.cache/huggingface/hub".into())
        );
        assert_eq!(d(None, None, None, None), None);
    }

    /// A cache laid out as `huggingface_hub` writes it (the pytest builds one with its own
    /// functions): blobs, a snapshot of symlinks, refs/main.
    fn cache_with(repo: &str, files: &[&str]) -> tempfile::TempDir {
        let cache = tempfile::tempdir().unwrap();
        let dir = repo_dir(cache.path(), repo);
        let hash = "0123456789abcdef0123456789abcdef01234567";
        let snap = dir.join("snapshots").join(hash);
        for (i, f) in files.iter().enumerate() {
            let blob = dir.join("blobs").join(format!("blob{i}"));
            std::fs::create_dir_all(blob.parent().unwrap()).unwrap();
            std::fs::write(&blob, b"x").unwrap();
            let link = snap.join(f);
            std::fs::create_dir_all(link.parent().unwrap()).unwrap();
            #[cfg(unix)]
            std::os::unix::fs::symlink(&blob, &link).unwrap();
            #[cfg(not(unix))]
            std::fs::copy(&blob, &link).unwrap();
        }
        std::fs::create_dir_all(dir.join("refs")).unwrap();
        std::fs::write(dir.join("refs/main"), hash).unwrap();
        cache
    }

    #[test]
    fn resolves_a_model_directory_and_a_gguf() {
        let c = cache_with("o/hf", &["config.json", "model.safetensors"]);
        let p = resolve_in_cache(c.path(), &r("o/hf", None, None)).unwrap();
        assert_eq!(
            p,
            repo_dir(c.path(), "o/hf").join("snapshots/0123456789abcdef0123456789abcdef01234567")
        );
        assert!(p.join("config.json").is_file());
        let c = cache_with("o/g", &["README.md", "m-Q4_0.gguf"]);
        let p = resolve_model(Path::new("hf:o/g"), Some(c.path())).unwrap();
        assert!(p.ends_with("m-Q4_0.gguf") && p.is_file());
        let p = resolve_model(Path::new("o/g"), Some(c.path())).unwrap();
        assert!(p.ends_with("m-Q4_0.gguf"));
    }

    #[test]
    fn several_ggufs_need_a_file() {
        let c = cache_with("o/g", &["a.gguf", "sub/b.gguf"]);
        let e = resolve_in_cache(c.path(), &r("o/g", None, None)).unwrap_err();
        assert_eq!(
            e.to_string(),
            "o/g has 2 .gguf files; name one as o/g:FILE, one of: a.gguf, sub/b.gguf"
        );
        let p = resolve_in_cache(c.path(), &r("o/g", None, Some("sub/b.gguf"))).unwrap();
        assert!(p.ends_with("sub/b.gguf"));
        let e = resolve_in_cache(c.path(), &r("o/g", None, Some("c.gguf"))).unwrap_err();
        assert!(e.to_string().contains("has no c.gguf"), "{e}");
    }

    #[test]
    fn revisions() {
        let c = cache_with("o/g", &["a.gguf"]);
        let hash = "0123456789abcdef0123456789abcdef01234567";
        assert!(resolve_in_cache(c.path(), &r("o/g", Some(hash), None)).is_ok());
        let e = resolve_in_cache(c.path(), &r("o/g", Some("v2"), None)).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("o/g@v2 is not in the Hugging Face cache")
        );
        // Downloaded by commit (no refs/main): the one snapshot.
        std::fs::remove_file(repo_dir(c.path(), "o/g").join("refs/main")).unwrap();
        assert!(resolve_in_cache(c.path(), &r("o/g", None, None)).is_ok());
    }

    #[test]
    fn missing_repo_and_paths() {
        let c = tempfile::tempdir().unwrap();
        let e = resolve_model(Path::new("hf:o/none"), Some(c.path())).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "o/none is not in the Hugging Face cache at {} (download it with `yomi pull o/none`)",
                c.path().display()
            )
        );
        let e = resolve_model(Path::new("o/none"), Some(c.path())).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("o/none: no such file or directory, and o/none is not")
        );
        // Existing paths win; other paths are left for the loader.
        let local = c.path().join("o/none");
        std::fs::create_dir_all(&local).unwrap();
        assert_eq!(resolve_model(&local, None).unwrap(), local);
        assert_eq!(
            resolve_model(Path::new("/no/such/dir/x"), None).unwrap(),
            Path::new("/no/such/dir/x")
        );
        assert!(resolve_model(Path::new("hf:a/b/c"), None).is_err());
    }

    #[test]
    fn pull_picks_files() {
        let l = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let hf = l(&[
            ".gitattributes",
            "README.md",
            "config.json",
            "generation_config.json",
            "model.safetensors",
            "tokenizer.json",
            "onnx/model.onnx",
            "pytorch_model.bin",
        ]);
        assert_eq!(
            files_to_pull(&r("o/m", None, None), &hf).unwrap(),
            l(&[
                "config.json",
                "generation_config.json",
                "model.safetensors",
                "tokenizer.json"
            ])
        );
        let gg = l(&["README.md", "m-Q4_0.gguf", "m-Q8_0.gguf"]);
        let e = files_to_pull(&r("o/g", None, None), &gg).unwrap_err();
        assert!(e.to_string().contains("m-Q4_0.gguf, m-Q8_0.gguf"), "{e}");
        assert_eq!(
            files_to_pull(&r("o/g", None, Some("m-Q8_0.gguf")), &gg).unwrap(),
            l(&["m-Q8_0.gguf"])
        );
        assert!(files_to_pull(&r("o/g", None, Some("x.gguf")), &gg).is_err());
    }
}
