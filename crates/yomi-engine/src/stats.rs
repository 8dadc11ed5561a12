//! Generation statistics with one definition everywhere (DESIGN §8), process memory, and CPU
//! energy from RAPL.
//!
//! - TTFT: from request arrival (templating and tokenizing included) to the first token.
//! - prefill tok/s: prompt tokens / prefill time.
//! - generation tok/s: (n − 1) / (t_last − t_first), 0.0 when n ≤ 1.
//! - tokens per pass: tokens emitted by verify passes / verify passes (the token from prefill
//!   excluded; plain decoding shows exactly 1.00).
//! - memory: the process's peak RSS (host memory), and on a device the memory in use there at
//!   the end of the request (weights, states and buffers, as the driver counts the device);
//!   energy: RAPL or n/a.
//! - passes by rows: per tree size (rows = drafted tokens + 1), the verify passes, the tokens
//!   they emitted and their wall time, each pass timed from the end of the one before (or the
//!   first token): drafting, the model pass, sampling, commit and emitting the text. It shows
//!   which tree sizes pay on this machine (a size pays when its tok/s beats one-row passes').

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::{Deserialize, Serialize};

/// Peak resident set size of this process (Linux `VmHWM`), in bytes.
pub fn peak_rss_bytes() -> Option<u64> {
    proc_status_bytes("VmHWM:")
}

/// Current resident set size of this process (Linux `VmRSS`), in bytes.
pub fn current_rss_bytes() -> Option<u64> {
    proc_status_bytes("VmRSS:")
}

fn proc_status_bytes(key: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    parse_status_kb(&status, key).map(|kb| kb * 1024)
}

/// The value of a `Key:   1234 kB` line of `/proc/*/status`, in kB.
fn parse_status_kb(status: &str, key: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with(key))?;
    let mut parts = line[key.len()..].split_whitespace();
    let value: u64 = parts.next()?.parse().ok()?;
    match parts.next() {
        Some("kB") | None => Some(value),
        Some(_) => None,
    }
}

/// Default root of the Linux powercap interface.
const POWERCAP_ROOT: &str = "/sys/class/powercap";

#[derive(Debug, Clone)]
struct RaplDomain {
    energy_path: PathBuf,
    /// The counter wraps at this value (`max_energy_range_uj`), when known.
    max_range_uj: Option<u64>,
    start_uj: u64,
}

/// CPU package energy from RAPL (`/sys/class/powercap/intel-rapl:N`, which AMD processors
/// expose too), summed over packages. Unreadable (no powercap, or no permission — the default
/// for non-root users since Linux 5.10) gives `None`, never 0.
#[derive(Debug, Clone, Default)]
pub struct EnergyMeter {
    domains: Vec<RaplDomain>,
}

impl EnergyMeter {
    /// Reads the package counters now.
    pub fn start() -> Self {
        Self::start_at(Path::new(POWERCAP_ROOT))
    }

    /// Like [`start`](Self::start) with another powercap root (tests).
    pub fn start_at(root: &Path) -> Self {
        let Ok(entries) = std::fs::read_dir(root) else {
            return Self::default();
        };
        let mut dirs: Vec<(String, PathBuf)> = entries
            .filter_map(|e| e.ok())
            .filter_map(|e| {
                let name = e.file_name().to_str()?.to_string();
                let index = name.strip_prefix("intel-rapl:")?;
                // Top-level domains only (`intel-rapl:0`, not the `intel-rapl:0:0` subzones).
                (!index.is_empty() && index.bytes().all(|b| b.is_ascii_digit()))
                    .then(|| (name, e.path()))
            })
            .collect();
        dirs.sort();
        let mut domains = Vec::new();
        for (_, dir) in dirs {
            // Skip non-package top-level zones (e.g. `psys`, which already covers the packages).
            if let Ok(zone) = std::fs::read_to_string(dir.join("name"))
                && !zone.trim().starts_with("package")
            {
                continue;
            }
            let energy_path = dir.join("energy_uj");
            let Some(start_uj) = read_u64(&energy_path) else {
                continue;
            };
            domains.push(RaplDomain {
                energy_path,
                max_range_uj: read_u64(&dir.join("max_energy_range_uj")),
                start_uj,
            });
        }
        Self { domains }
    }

    /// Whether any package counter was readable at start.
    pub fn is_available(&self) -> bool {
        !self.domains.is_empty()
    }

    /// Joules used by all packages since `start` (one counter wraparound per domain is
    /// handled). `None` when no counter is readable.
    pub fn joules(&self) -> Option<f64> {
        if self.domains.is_empty() {
            return None;
        }
        let mut total_uj: u64 = 0;
        for d in &self.domains {
            let now = read_u64(&d.energy_path)?;
            let delta = if now >= d.start_uj {
                now - d.start_uj
            } else {
                d.max_range_uj?.checked_sub(d.start_uj)? + now
            };
            total_uj = total_uj.saturating_add(delta);
        }
        Some(total_uj as f64 / 1e6)
    }
}

fn read_u64(path: &Path) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// The stats of one request (DESIGN §8), as printed by the CLI and reported by the server.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct GenerationStats {
    pub time_to_first_token_s: f64,
    pub prefill_tokens: usize,
    pub prefill_tokens_per_s: f64,
    pub generated_tokens: usize,
    pub generation_tokens_per_s: f64,
    pub verify_passes: usize,
    pub tokens_per_forward_pass: f64,
    /// Draft tokens a verify pass checked on average (its tree rows after the root): with
    /// `tokens_per_forward_pass`, how much of the drafting was accepted.
    pub drafted_tokens_per_pass: f64,
    /// Peak host memory (RSS).
    pub memory_bytes: Option<u64>,
    /// Device memory in use at the end of the request (None on the CPU).
    #[serde(default)]
    pub device_memory_bytes: Option<u64>,
    pub energy_j: Option<f64>,
    pub duration_s: f64,
    /// The verify passes by tree size, smallest first (sizes that ran only). Empty when read
    /// from the JSON of a yomi that did not report it.
    #[serde(default)]
    pub passes_by_rows: Vec<PassSize>,
    /// Why the drafter stopped proposing during the request, if it failed
    /// ([`yomi_spec::Drafter::failure`]); absent from the JSON otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drafter_failure: Option<String>,
}

/// The verify passes of one tree size (see the module notes).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PassSize {
    /// Tree rows: drafted tokens + 1.
    pub rows: usize,
    pub passes: usize,
    /// Tokens the passes emitted (accepted drafts plus each pass's own token).
    pub tokens: usize,
    /// Their wall time.
    pub seconds: f64,
}

/// Ranges of tree sizes that the human-readable stats sum up (the JSON keeps every size).
const ROW_BUCKETS: [(usize, usize); 6] =
    [(1, 1), (2, 4), (5, 8), (9, 16), (17, 32), (33, usize::MAX)];

/// Passes of a range of tree sizes, summed (see [`row_ranges`]).
#[derive(Debug, Clone, PartialEq)]
pub struct RowRange {
    /// `1 row`, `2-4 rows`, …, `33+ rows`.
    pub label: String,
    pub passes: usize,
    pub tokens: usize,
    pub seconds: f64,
}

impl RowRange {
    /// Tokens per second of these passes, `None` without time.
    pub fn tokens_per_s(&self) -> Option<f64> {
        (self.seconds > 0.0).then(|| self.tokens as f64 / self.seconds)
    }
}

/// `sizes` (any number of entries per size, e.g. of several requests) summed over the ranges
/// 1, 2–4, 5–8, 9–16, 17–32 and 33+ rows; ranges without passes are left out.
pub fn row_ranges(sizes: &[PassSize]) -> Vec<RowRange> {
    ROW_BUCKETS
        .iter()
        .filter_map(|&(lo, hi)| {
            let mut r = RowRange {
                label: match (lo, hi) {
                    (1, 1) => "1 row".to_string(),
                    (lo, usize::MAX) => format!("{lo}+ rows"),
                    (lo, hi) => format!("{lo}-{hi} rows"),
                },
                passes: 0,
                tokens: 0,
                seconds: 0.0,
            };
            for p in sizes.iter().filter(|p| (lo..=hi).contains(&p.rows)) {
                r.passes += p.passes;
                r.tokens += p.tokens;
                r.seconds += p.seconds;
            }
            (r.passes > 0).then_some(r)
        })
        .collect()
}

impl GenerationStats {
    /// One line of the passes by tree-size range, `None` when every pass had one row.
    fn passes_by_rows_line(&self) -> Option<String> {
        if self.passes_by_rows.iter().all(|p| p.rows <= 1) {
            return None;
        }
        let parts: Vec<String> = row_ranges(&self.passes_by_rows)
            .iter()
            .map(|r| {
                let rate = r
                    .tokens_per_s()
                    .map_or("n/a tok/s".to_string(), |t| format!("{t:.0} tok/s"));
                format!(
                    "{}: {} × {:.2} tok, {rate}",
                    r.label,
                    r.passes,
                    r.tokens as f64 / r.passes as f64
                )
            })
            .collect();
        Some(parts.join(" | "))
    }
}

fn format_bytes(bytes: u64) -> String {
    const KIB: f64 = 1024.0;
    let b = bytes as f64;
    if b >= KIB * KIB * KIB {
        format!("{:.2} GiB", b / (KIB * KIB * KIB))
    } else if b >= KIB * KIB {
        format!("{:.1} MiB", b / (KIB * KIB))
    } else if b >= KIB {
        format!("{:.1} KiB", b / KIB)
    } else {
        format!("{bytes} B")
    }
}

impl fmt::Display for GenerationStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "time to first token: {:.3} s",
            self.time_to_first_token_s
        )?;
        writeln!(
            f,
            "prefill:             {} tokens, {:.1} tok/s",
            self.prefill_tokens, self.prefill_tokens_per_s
        )?;
        writeln!(
            f,
            "generation:          {} tokens, {:.2} tok/s",
            self.generated_tokens, self.generation_tokens_per_s
        )?;
        writeln!(
            f,
            "tokens per pass:     {:.2} ({} verify passes, {:.2} drafted tokens per pass)",
            self.tokens_per_forward_pass, self.verify_passes, self.drafted_tokens_per_pass
        )?;
        if let Some(line) = self.passes_by_rows_line() {
            writeln!(f, "passes by rows:      {line}")?;
        }
        match self.memory_bytes {
            Some(b) => writeln!(f, "peak memory:         {}", format_bytes(b))?,
            None => writeln!(f, "peak memory:         n/a")?,
        }
        if let Some(b) = self.device_memory_bytes {
            writeln!(f, "device memory:       {} in use", format_bytes(b))?;
        }
        match self.energy_j {
            Some(j) => writeln!(f, "energy:              {j:.2} J")?,
            None => writeln!(f, "energy:              n/a")?,
        }
        if let Some(why) = &self.drafter_failure {
            writeln!(f, "drafting stopped:    {why}")?;
        }
        write!(f, "duration:            {:.3} s", self.duration_s)
    }
}

/// A clock in seconds (any origin; only differences are used).
pub type Clock = Box<dyn Fn() -> f64 + Send + Sync>;

/// Records the events of one request and turns them into [`GenerationStats`].
///
/// The generate loop calls: [`start`](Self::start) when the request arrives (before
/// templating), optionally [`prefill_started`](Self::prefill_started), then
/// [`prefill_done`](Self::prefill_done), [`first_token`](Self::first_token) for the token
/// sampled from the prefill logits, [`pass_emitted`](Self::pass_emitted) after every verify
/// pass (plain decoding: [`token_emitted`](Self::token_emitted), one token per pass), and
/// [`finish`](Self::finish).
pub struct StatsRecorder {
    clock: Clock,
    t_start: f64,
    t_prefill_start: Option<f64>,
    t_prefill_end: Option<f64>,
    prompt_tokens: usize,
    t_first: Option<f64>,
    t_last: Option<f64>,
    generated: usize,
    verify_passes: usize,
    drafted: usize,
    pass_tokens: usize,
    /// Rows of the pass about to be reported ([`Self::pass_drafted`] + 1).
    pending_rows: Option<usize>,
    /// End of the last pass (or the first token): where the next pass's time starts.
    t_pass: Option<f64>,
    by_rows: Vec<PassSize>,
    energy: EnergyMeter,
    device_memory: Option<u64>,
    drafter_failure: Option<String>,
    energy_override: Option<Option<f64>>,
}

impl fmt::Debug for StatsRecorder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StatsRecorder")
            .field("t_start", &self.t_start)
            .field("prompt_tokens", &self.prompt_tokens)
            .field("generated", &self.generated)
            .field("verify_passes", &self.verify_passes)
            .field("drafted", &self.drafted)
            .finish_non_exhaustive()
    }
}

impl StatsRecorder {
    /// Request arrival, on the monotonic clock; also starts the energy meter.
    pub fn start() -> Self {
        let origin = Instant::now();
        Self::with_clock(Box::new(move || origin.elapsed().as_secs_f64()))
    }

    /// Request arrival on a given clock (tests inject a fake one).
    pub fn with_clock(clock: Clock) -> Self {
        let t_start = clock();
        Self {
            clock,
            t_start,
            t_prefill_start: None,
            t_prefill_end: None,
            prompt_tokens: 0,
            t_first: None,
            t_last: None,
            generated: 0,
            verify_passes: 0,
            drafted: 0,
            pass_tokens: 0,
            pending_rows: None,
            t_pass: None,
            by_rows: Vec::new(),
            energy: EnergyMeter::start(),
            device_memory: None,
            drafter_failure: None,
            energy_override: None,
        }
    }

    /// Prefill begins (after templating and tokenizing). Without this call prefill time is
    /// counted from arrival.
    pub fn prefill_started(&mut self) {
        if self.t_prefill_start.is_none() {
            self.t_prefill_start = Some((self.clock)());
        }
    }

    /// Prefill of `prompt_tokens` tokens ended. Call once, or once per chunk with that chunk's
    /// count (the counts add up and the last call ends the prefill time).
    pub fn prefill_done(&mut self, prompt_tokens: usize) {
        self.prompt_tokens += prompt_tokens;
        self.t_prefill_end = Some((self.clock)());
    }

    /// The first token (sampled from the prefill logits) was emitted. It counts as a generated
    /// token but not as a verify-pass token.
    pub fn first_token(&mut self) {
        let t = (self.clock)();
        if self.t_first.is_none() {
            self.t_first = Some(t);
        }
        self.t_last = Some(t);
        self.t_pass = Some(t);
        self.generated += 1;
    }

    /// One verify pass emitted one token (plain decoding).
    pub fn token_emitted(&mut self) {
        self.pass_emitted(1);
    }

    /// One verify pass emitted `n_tokens` tokens (accepted draft tokens plus the bonus token,
    /// after any stop truncation).
    pub fn pass_emitted(&mut self, n_tokens: usize) {
        self.verify_passes += 1;
        self.pass_tokens += n_tokens;
        let t = (self.clock)();
        let rows = self.pending_rows.take().unwrap_or(1);
        let seconds = (t - self.t_pass.or(self.t_prefill_end).unwrap_or(t)).max(0.0);
        self.t_pass = Some(t);
        let at = match self.by_rows.binary_search_by_key(&rows, |p| p.rows) {
            Ok(i) => i,
            Err(i) => {
                self.by_rows.insert(
                    i,
                    PassSize {
                        rows,
                        ..PassSize::default()
                    },
                );
                i
            }
        };
        let size = &mut self.by_rows[at];
        size.passes += 1;
        size.tokens += n_tokens;
        size.seconds += seconds;
        if n_tokens > 0 {
            if self.t_first.is_none() {
                self.t_first = Some(t);
            }
            self.t_last = Some(t);
            self.generated += n_tokens;
        }
    }

    /// The verify pass about to be reported checked `n` draft tokens.
    pub fn pass_drafted(&mut self, n: usize) {
        self.drafted += n;
        self.pending_rows = Some(n + 1);
    }

    /// The device memory in use (see [`GenerationStats::device_memory_bytes`]).
    pub fn set_device_memory_bytes(&mut self, bytes: Option<u64>) {
        self.device_memory = bytes;
    }

    /// Why the drafter stopped proposing (see [`GenerationStats::drafter_failure`]).
    pub fn set_drafter_failure(&mut self, why: Option<String>) {
        self.drafter_failure = why;
    }

    /// Replaces the RAPL reading (e.g. with NVML energy on a GPU).
    pub fn set_energy_j(&mut self, joules: Option<f64>) {
        self.energy_override = Some(joules);
    }

    /// Tokens generated so far.
    pub fn generated_tokens(&self) -> usize {
        self.generated
    }

    /// The stats up to now.
    pub fn finish(&self) -> GenerationStats {
        let now = (self.clock)();
        let ratio = |num: f64, den: f64| {
            if den > 0.0 && num.is_finite() {
                num / den
            } else {
                0.0
            }
        };
        let prefill_time = self
            .t_prefill_end
            .map(|end| end - self.t_prefill_start.unwrap_or(self.t_start))
            .unwrap_or(0.0);
        let generation_tokens_per_s = match (self.t_first, self.t_last) {
            (Some(first), Some(last)) if self.generated > 1 => {
                ratio((self.generated - 1) as f64, last - first)
            }
            _ => 0.0,
        };
        GenerationStats {
            time_to_first_token_s: self.t_first.map_or(0.0, |t| t - self.t_start),
            prefill_tokens: self.prompt_tokens,
            prefill_tokens_per_s: ratio(self.prompt_tokens as f64, prefill_time),
            generated_tokens: self.generated,
            generation_tokens_per_s,
            verify_passes: self.verify_passes,
            tokens_per_forward_pass: ratio(self.pass_tokens as f64, self.verify_passes as f64),
            drafted_tokens_per_pass: ratio(self.drafted as f64, self.verify_passes as f64),
            memory_bytes: peak_rss_bytes(),
            device_memory_bytes: self.device_memory,
            energy_j: self.energy_override.unwrap_or_else(|| self.energy.joules()),
            duration_s: now - self.t_start,
            passes_by_rows: self.by_rows.clone(),
            drafter_failure: self.drafter_failure.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};

    /// A settable fake clock (milliseconds, so that the arithmetic is exact).
    fn fake_clock() -> (Arc<AtomicU64>, Clock) {
        let ms = Arc::new(AtomicU64::new(1000));
        let c = Arc::clone(&ms);
        (
            ms,
            Box::new(move || c.load(Ordering::SeqCst) as f64 / 1000.0),
        )
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    #[test]
    fn recorder_speculative_arithmetic() {
        let (ms, clock) = fake_clock();
        let set = |t: u64| ms.store(1000 + t, Ordering::SeqCst);
        let mut r = StatsRecorder::with_clock(clock);
        set(50); // templating + tokenizing
        r.prefill_started();
        set(250);
        r.prefill_done(100); // 100 tokens in 0.2 s
        set(300);
        r.first_token(); // TTFT 0.3 s
        set(400);
        r.pass_drafted(5);
        r.pass_emitted(3);
        set(500);
        r.pass_drafted(0);
        r.pass_emitted(1);
        set(700);
        r.pass_drafted(4);
        r.pass_emitted(4);
        set(900);
        r.set_device_memory_bytes(Some(1234));
        r.set_energy_j(Some(5.5));
        let s = r.finish();
        assert!(close(s.time_to_first_token_s, 0.3), "{s:?}");
        assert_eq!(s.prefill_tokens, 100);
        assert!(close(s.prefill_tokens_per_s, 500.0), "{s:?}");
        assert_eq!(s.generated_tokens, 9);
        // (9 − 1) tokens over 0.7 − 0.3 s.
        assert!(close(s.generation_tokens_per_s, 20.0), "{s:?}");
        assert_eq!(s.verify_passes, 3);
        assert!(close(s.tokens_per_forward_pass, 8.0 / 3.0), "{s:?}");
        assert!(close(s.drafted_tokens_per_pass, 3.0), "{s:?}");
        assert_eq!(s.device_memory_bytes, Some(1234));
        assert!(s.memory_bytes.is_some_and(|b| b > 0), "{s:?}");
        assert_eq!(s.energy_j, Some(5.5));
        assert!(close(s.duration_s, 0.9), "{s:?}");
        // Each pass timed from the end of the one before (the first from the first token).
        let sizes: Vec<(usize, usize, usize)> = s
            .passes_by_rows
            .iter()
            .map(|p| (p.rows, p.passes, p.tokens))
            .collect();
        assert_eq!(sizes, [(1, 1, 1), (5, 1, 4), (6, 1, 3)]);
        let secs: Vec<f64> = s.passes_by_rows.iter().map(|p| p.seconds).collect();
        assert!(
            close(secs[0], 0.1) && close(secs[1], 0.2) && close(secs[2], 0.1),
            "{secs:?}"
        );
        let text = s.to_string();
        assert!(
            text.contains(
                "passes by rows:      1 row: 1 × 1.00 tok, 10 tok/s | 5-8 rows: 2 × 3.50 tok, 23 tok/s\n"
            ),
            "{text}"
        );
    }

    #[test]
    fn row_ranges_sum_sizes_of_several_requests() {
        let size = |rows, passes, tokens, seconds| PassSize {
            rows,
            passes,
            tokens,
            seconds,
        };
        let sizes = [
            size(1, 4, 4, 0.02),
            size(3, 1, 2, 0.01),
            size(5, 2, 9, 0.03),
            size(3, 2, 5, 0.02),
            size(17, 1, 16, 0.04),
            size(40, 1, 0, 0.0),
        ];
        let got: Vec<(String, usize, usize)> = row_ranges(&sizes)
            .into_iter()
            .map(|r| (r.label, r.passes, r.tokens))
            .collect();
        let want = [
            ("1 row", 4, 4),
            ("2-4 rows", 3, 7),
            ("5-8 rows", 2, 9),
            ("17-32 rows", 1, 16),
            ("33+ rows", 1, 0),
        ];
        let want: Vec<(String, usize, usize)> = want
            .iter()
            .map(|&(l, p, t)| (l.to_string(), p, t))
            .collect();
        assert_eq!(got, want);
        let ranges = row_ranges(&sizes);
        assert!(close(ranges[1].tokens_per_s().expect("timed"), 7.0 / 0.03));
        assert_eq!(ranges[4].tokens_per_s(), None);
        assert!(row_ranges(&[]).is_empty());
    }

    #[test]
    fn recorder_plain_decoding_is_one_token_per_pass() {
        let (ms, clock) = fake_clock();
        let mut r = StatsRecorder::with_clock(clock);
        ms.fetch_add(100, Ordering::SeqCst);
        r.prefill_done(10); // no prefill_started: prefill time counts from arrival
        r.first_token();
        for _ in 0..5 {
            ms.fetch_add(20, Ordering::SeqCst);
            r.token_emitted();
        }
        let s = r.finish();
        assert!(close(s.prefill_tokens_per_s, 100.0), "{s:?}");
        assert!(close(s.time_to_first_token_s, 0.1), "{s:?}");
        assert_eq!(s.generated_tokens, 6);
        assert_eq!(s.verify_passes, 5);
        assert_eq!(s.tokens_per_forward_pass, 1.0);
        assert!(close(s.generation_tokens_per_s, 50.0), "{s:?}");
        assert_eq!(format!("{:.2}", s.tokens_per_forward_pass), "1.00");
        assert_eq!(
            s.passes_by_rows,
            [PassSize {
                rows: 1,
                passes: 5,
                tokens: 5,
                seconds: s.passes_by_rows[0].seconds
            }]
        );
        assert!(close(s.passes_by_rows[0].seconds, 0.1), "{s:?}");
        // Without drafts the line would say nothing new.
        assert!(!s.to_string().contains("passes by rows"));
    }

    #[test]
    fn recorder_degenerate_cases_are_zero_not_nan() {
        let (_ms, clock) = fake_clock();
        let r = StatsRecorder::with_clock(clock);
        let s = r.finish();
        assert_eq!(s.time_to_first_token_s, 0.0);
        assert_eq!(s.prefill_tokens_per_s, 0.0);
        assert_eq!(s.generation_tokens_per_s, 0.0);
        assert_eq!(s.tokens_per_forward_pass, 0.0);

        let (ms, clock) = fake_clock();
        let mut r = StatsRecorder::with_clock(clock);
        r.prefill_done(5); // zero prefill time
        ms.fetch_add(10, Ordering::SeqCst);
        r.first_token(); // a single token
        let s = r.finish();
        assert_eq!(s.generated_tokens, 1);
        assert_eq!(s.generation_tokens_per_s, 0.0);
        assert_eq!(s.prefill_tokens_per_s, 0.0);
        assert_eq!(s.verify_passes, 0);
        assert_eq!(s.tokens_per_forward_pass, 0.0);
        assert!(s.generation_tokens_per_s.is_finite());
    }

    #[test]
    fn stats_serialize_with_design_field_names() {
        let s = GenerationStats {
            energy_j: None,
            memory_bytes: Some(3 << 30),
            ..GenerationStats::default()
        };
        let v = serde_json::to_value(&s).expect("json");
        let keys: Vec<&str> = v
            .as_object()
            .expect("object")
            .keys()
            .map(String::as_str)
            .collect();
        assert_eq!(
            keys,
            [
                "time_to_first_token_s",
                "prefill_tokens",
                "prefill_tokens_per_s",
                "generated_tokens",
                "generation_tokens_per_s",
                "verify_passes",
                "tokens_per_forward_pass",
                "drafted_tokens_per_pass",
                "memory_bytes",
                "device_memory_bytes",
                "energy_j",
                "duration_s",
                "passes_by_rows"
            ]
        );
        assert!(v["energy_j"].is_null());
        // Stats written before `passes_by_rows` existed still read back.
        let mut old = v.clone();
        old.as_object_mut()
            .expect("object")
            .remove("passes_by_rows");
        let back: GenerationStats = serde_json::from_value(old).expect("older stats");
        assert_eq!(back, s);
        let text = s.to_string();
        assert!(text.contains("energy:              n/a"), "{text}");
        assert!(text.contains("3.00 GiB"), "{text}");
        assert_eq!(text.lines().count(), 7);
    }

    #[test]
    fn rss_is_read_and_parsed() {
        let status = "Name:\tx\nVmHWM:\t    1964 kB\nVmRSS:\t    1000 kB\n";
        assert_eq!(parse_status_kb(status, "VmHWM:"), Some(1964));
        assert_eq!(parse_status_kb(status, "VmRSS:"), Some(1000));
        assert_eq!(parse_status_kb(status, "VmSwap:"), None);
        if cfg!(target_os = "linux") {
            // Current first: other test threads may allocate between the two reads, and the
            // high-water mark never falls below any earlier resident size.
            let cur = current_rss_bytes().expect("VmRSS");
            let peak = peak_rss_bytes().expect("VmHWM");
            assert!(peak >= cur && cur > 0, "{peak} {cur}");
        }
    }

    /// A fake powercap tree removed on drop.
    struct FakePowercap(PathBuf);
    impl FakePowercap {
        fn new() -> Self {
            let p = std::env::temp_dir().join(format!("yomi-rapl-test-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&p);
            Self(p)
        }
        fn zone(&self, dir: &str, name: &str, energy: u64, max: u64) {
            let d = self.0.join(dir);
            std::fs::create_dir_all(&d).expect("mkdir");
            std::fs::write(d.join("name"), format!("{name}\n")).expect("write");
            std::fs::write(d.join("energy_uj"), format!("{energy}\n")).expect("write");
            std::fs::write(d.join("max_energy_range_uj"), format!("{max}\n")).expect("write");
        }
        fn set(&self, dir: &str, energy: u64) {
            std::fs::write(self.0.join(dir).join("energy_uj"), format!("{energy}\n"))
                .expect("write");
        }
    }
    impl Drop for FakePowercap {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn energy_meter_sums_packages_and_handles_wraparound() {
        let fake = FakePowercap::new();
        fake.zone("intel-rapl:0", "package-0", 9_000, 10_000);
        fake.zone("intel-rapl:0:0", "core", 5, 10_000); // subzone: ignored
        fake.zone("intel-rapl:1", "psys", 7, 10_000); // platform zone: ignored
        fake.zone("intel-rapl:2", "package-1", 1_000_000, 1 << 40);
        let meter = EnergyMeter::start_at(&fake.0);
        assert!(meter.is_available());
        assert_eq!(meter.joules(), Some(0.0));
        fake.set("intel-rapl:0", 500); // wrapped: 1_000 + 500
        fake.set("intel-rapl:0:0", 9_999);
        fake.set("intel-rapl:1", 9_999);
        fake.set("intel-rapl:2", 3_000_000);
        let j = meter.joules().expect("readable");
        assert!(close(j, 2.0015), "{j}");
        // A counter that becomes unreadable gives None, not 0.
        std::fs::remove_file(fake.0.join("intel-rapl:2/energy_uj")).expect("rm");
        assert_eq!(meter.joules(), None);
    }

    #[test]
    fn energy_meter_unreadable_is_none() {
        let missing = std::env::temp_dir().join("yomi-no-such-powercap");
        let meter = EnergyMeter::start_at(&missing);
        assert!(!meter.is_available());
        assert_eq!(meter.joules(), None);
        let real = EnergyMeter::start();
        match real.joules() {
            None => assert!(!real.is_available()),
            Some(j) => assert!(j >= 0.0),
        }
    }
}
