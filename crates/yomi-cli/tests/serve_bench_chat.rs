//! `yomi serve`, `yomi bench` and `yomi chat` end to end through the binary, with the
//! qwen35-tiny fixture: bench measures a running server, chat holds a session, and bad flags
//! (a taken port, an unreachable endpoint, an unknown model) give one-line errors.

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};

fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/fixtures/qwen35-tiny")
}

fn yomi(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_yomi"))
        .args(args)
        .output()
        .expect("run yomi")
}

/// Exit 1 with one `error:` line on stderr containing `needle`.
fn assert_one_line_error(out: &Output, needle: &str) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "stderr: {err}");
    assert!(!err.contains("panicked"), "{err}");
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "{err}");
    assert!(lines[0].starts_with("error: "), "{err}");
    assert!(err.contains(needle), "expected {needle:?} in {err}");
}

/// A `yomi serve` child on a free port (read from its start-up line), killed on drop.
struct Served {
    child: Child,
    url: String,
}

impl Served {
    fn start() -> Served {
        let mut child = Command::new(env!("CARGO_BIN_EXE_yomi"))
            .args(["serve", "--model"])
            .arg(fixture())
            .args(["--port", "0", "--served-model-name", "tiny"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn yomi serve");
        let stderr = child.stderr.take().expect("stderr");
        let mut lines = BufReader::new(stderr).lines();
        let url = loop {
            let line = lines
                .next()
                .expect("yomi serve ended before it was ready")
                .expect("read");
            if let Some(i) = line.find("http://") {
                break line[i..].split_whitespace().next().unwrap().to_string();
            }
        };
        Served { child, url }
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn bench_measures_a_running_server() {
    let s = Served::start();
    let out = yomi(&[
        "bench",
        "--endpoint",
        &s.url,
        "--model",
        "tiny",
        "-m",
        "def f(x):",
        "--runs",
        "2",
        "--warmup",
        "1",
        "--max-tokens",
        "8",
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value =
        serde_json::from_slice(out.stdout.trim_ascii()).expect("one JSON object");
    let samples = v["samples"].as_array().expect("samples");
    assert_eq!(samples.len(), 2);
    for smp in samples {
        let n = smp["completion_tokens"].as_u64().unwrap();
        assert!((1..=8).contains(&n), "{smp}");
        assert!(smp["ttft_s"].as_f64().unwrap() > 0.0);
        assert!(smp["e2e_s"].as_f64().unwrap() >= smp["ttft_s"].as_f64().unwrap());
        assert_eq!(smp["usage_reported"], true);
        // yomi drafts by default and reports its verify passes.
        assert!(smp["spec_verify_ct"].as_u64().is_some(), "{smp}");
    }
    assert!(v["median"]["ttft_s"].as_f64().is_some());
    // The table, from a prompts file.
    let dir = std::env::temp_dir().join(format!("yomi-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let prompts = dir.join("prompts.txt");
    std::fs::File::create(&prompts)
        .unwrap()
        .write_all(b"import os\n\nclass A:\n")
        .unwrap();
    let out = yomi(&[
        "bench",
        "--endpoint",
        &format!("{}/v1", s.url),
        "--model",
        "tiny",
        "--prompts",
        prompts.to_str().unwrap(),
        "--runs",
        "1",
        "--warmup",
        "0",
        "--max-tokens",
        "4",
    ]);
    assert!(out.status.success());
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.contains("2 request(s)"), "{table}");
    for row in [
        "time to first token",
        "end-to-end",
        "decode tok/s",
        "tokens per pass",
    ] {
        assert!(table.contains(row), "{table}");
    }
    let _ = std::fs::remove_dir_all(&dir);
    // A model the server does not serve.
    let out = yomi(&[
        "bench",
        "--endpoint",
        &s.url,
        "--model",
        "other",
        "-m",
        "hi",
    ]);
    assert_one_line_error(&out, "answered HTTP 404");
}

#[test]
fn bad_flags_give_one_line_errors() {
    // A port in use.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port().to_string();
    let out = yomi(&[
        "serve",
        "--model",
        fixture().to_str().unwrap(),
        "--port",
        &port,
    ]);
    assert_one_line_error(&out, "cannot listen on 127.0.0.1:");
    // Timeouts and limits that cannot work.
    for (flag, value) in [
        ("--header-timeout", "0"),
        ("--body-timeout", "1e9"),
        ("--header-timeout", "NaN"),
        ("--max-connections", "0"),
    ] {
        let out = yomi(&["serve", "--model", "/no/such/model", flag, value]);
        assert_one_line_error(&out, flag);
    }
    // No such model.
    let out = yomi(&["serve", "--model", "/no/such/model", "--port", "0"]);
    assert_one_line_error(&out, "/no/such/model");
    // An endpoint nobody listens on.
    drop(taken);
    let out = yomi(&[
        "bench",
        "--endpoint",
        &format!("http://127.0.0.1:{port}"),
        "--model",
        "m",
        "-m",
        "hi",
    ]);
    assert_one_line_error(&out, "cannot connect to 127.0.0.1:");
    let out = yomi(&[
        "bench",
        "--endpoint",
        "https://x",
        "--model",
        "m",
        "-m",
        "hi",
    ]);
    assert_one_line_error(&out, "https is not supported");
    let out = yomi(&["bench", "--endpoint", "http://x", "--model", "m"]);
    assert_one_line_error(&out, "--prompts");
}

#[test]
fn chat_holds_a_session() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_yomi"))
        .args(["chat", "--model"])
        .arg(fixture())
        .args(["--max-tokens", "8", "--temperature", "0"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn yomi chat");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"def f(x):\nreturn x\n/stats\n/nope\n/reset\nclass A:\n/exit\nnever read\n")
        .unwrap();
    let out = child.wait_with_output().expect("wait");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    // Three replies, each followed by its stats line; the second turn resumed the first.
    let stats: Vec<&str> = err.lines().filter(|l| l.starts_with('[')).collect();
    assert_eq!(stats.len(), 3, "{err}");
    assert!(stats[1].contains("cached"), "{err}");
    assert!(err.contains("time to first token:"), "{err}");
    assert!(err.contains("prefix cache:"), "{err}");
    assert!(err.contains("unknown command /nope"), "{err}");
    assert!(err.contains("(conversation cleared)"), "{err}");
    assert!(!String::from_utf8_lossy(&out.stdout).trim().is_empty());
}
