//! A small blocking HTTP/1.1 client for OpenAI-compatible servers: one request per
//! connection (`Connection: close`), fixed-length or chunked bodies, and server-sent events.
//! Enough for `yomi bench` against any such server (yomi, llama-server, vLLM, …) over plain
//! HTTP, and for the tests. No TLS.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};

/// Where a server is: `http://host[:port][/prefix]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoint {
    pub host: String,
    pub port: u16,
    /// Path prefix without a trailing slash (e.g. `/v1`, or empty).
    pub prefix: String,
}

impl Endpoint {
    /// Parses `http://host[:port][/prefix]` (a bare `host:port` is taken as http).
    pub fn parse(url: &str) -> Result<Self> {
        let url = url.trim();
        let rest = if let Some(r) = url.strip_prefix("http://") {
            r
        } else if url.starts_with("https://") {
            bail!("{url}: https is not supported (use an http:// endpoint)");
        } else if url.contains("://") {
            bail!("{url}: only http:// endpoints are supported");
        } else {
            url
        };
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, ""),
        };
        if authority.is_empty() {
            bail!("{url}: no host in the endpoint");
        }
        let (host, port) = if let Some(h) = authority.strip_prefix('[') {
            // [v6]:port
            let end = h
                .find(']')
                .ok_or_else(|| anyhow!("{url}: unterminated IPv6 address"))?;
            let port = match &h[end + 1..] {
                "" => 80,
                p => p
                    .strip_prefix(':')
                    .and_then(|p| p.parse().ok())
                    .ok_or_else(|| anyhow!("{url}: bad port"))?,
            };
            (h[..end].to_string(), port)
        } else {
            match authority.rsplit_once(':') {
                Some((h, p)) => (
                    h.to_string(),
                    p.parse()
                        .map_err(|_| anyhow!("{url}: bad port {p:?} (expected 1..=65535)"))?,
                ),
                None => (authority.to_string(), 80),
            }
        };
        if host.is_empty() {
            bail!("{url}: no host in the endpoint");
        }
        Ok(Endpoint {
            host,
            port,
            prefix: path.trim_end_matches('/').to_string(),
        })
    }

    /// The path of an API route: the prefix, then `route` (which starts with `/`).
    pub fn path(&self, route: &str) -> String {
        format!("{}{route}", self.prefix)
    }

    /// `/v1/<route>` under the prefix unless the prefix already ends with `/v1`.
    pub fn v1(&self, route: &str) -> String {
        if self.prefix.ends_with("/v1") {
            self.path(route)
        } else {
            self.path(&format!("/v1{route}"))
        }
    }

    fn authority(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "http://{}{}", self.authority(), self.prefix)
    }
}

/// A response whose body is read on demand.
pub struct Response {
    pub status: u16,
    /// Header names lower-cased.
    pub headers: Vec<(String, String)>,
    body: Box<dyn BufRead + Send>,
}

impl std::fmt::Debug for Response {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Response")
            .field("status", &self.status)
            .field("headers", &self.headers)
            .finish_non_exhaustive()
    }
}

/// Reads a chunked transfer-encoded body.
struct Chunked<R> {
    inner: R,
    left: usize,
    done: bool,
}

impl<R: BufRead> Read for Chunked<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.done || buf.is_empty() {
            return Ok(0);
        }
        if self.left == 0 {
            let mut line = String::new();
            self.inner.read_line(&mut line)?;
            let size = line.trim().split(';').next().unwrap_or("");
            if size.is_empty() && line.is_empty() {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "the connection closed inside a chunked body",
                ));
            }
            self.left = usize::from_str_radix(size, 16).map_err(|_| {
                std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("bad chunk size {size:?}"),
                )
            })?;
            if self.left == 0 {
                // Trailers, then the final empty line.
                loop {
                    line.clear();
                    if self.inner.read_line(&mut line)? == 0 || line.trim().is_empty() {
                        break;
                    }
                }
                self.done = true;
                return Ok(0);
            }
        }
        let n = buf.len().min(self.left);
        let got = self.inner.read(&mut buf[..n])?;
        if got == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "the connection closed inside a chunk",
            ));
        }
        self.left -= got;
        if self.left == 0 {
            let mut crlf = String::new();
            self.inner.read_line(&mut crlf)?;
        }
        Ok(got)
    }
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers
            .iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.as_str())
    }

    /// The whole body as text.
    pub fn text(mut self) -> Result<String> {
        let mut s = String::new();
        self.body
            .read_to_string(&mut s)
            .context("cannot read the response body")?;
        Ok(s)
    }

    /// The whole body as JSON.
    pub fn json(self) -> Result<serde_json::Value> {
        let status = self.status;
        let text = self.text()?;
        serde_json::from_str(&text).with_context(|| {
            format!(
                "the response (HTTP {status}) is not JSON: {}",
                text.chars().take(200).collect::<String>()
            )
        })
    }

    /// The data of the next server-sent event (its `data:` lines joined by newlines), or
    /// `None` at the end of the stream. Comments and other fields are skipped.
    pub fn next_event(&mut self) -> Result<Option<String>> {
        let mut data: Option<String> = None;
        let mut line = String::new();
        loop {
            line.clear();
            let n = self
                .body
                .read_line(&mut line)
                .context("cannot read the event stream")?;
            if n == 0 {
                return Ok(data);
            }
            let l = line.trim_end_matches(['\r', '\n']);
            if l.is_empty() {
                if data.is_some() {
                    return Ok(data);
                }
                continue;
            }
            if let Some(v) = l.strip_prefix("data:") {
                let v = v.strip_prefix(' ').unwrap_or(v);
                match &mut data {
                    Some(d) => {
                        d.push('\n');
                        d.push_str(v);
                    }
                    None => data = Some(v.to_string()),
                }
            }
        }
    }
}

/// Sends one request and reads the status line and headers. `timeout` bounds connecting and
/// each read.
pub fn request(
    ep: &Endpoint,
    method: &str,
    path: &str,
    body: Option<&[u8]>,
    api_key: Option<&str>,
    timeout: Duration,
) -> Result<Response> {
    let addrs: Vec<_> = (ep.host.as_str(), ep.port)
        .to_socket_addrs()
        .with_context(|| format!("cannot resolve {}", ep.host))?
        .collect();
    let mut last_err = None;
    let mut stream = None;
    for a in &addrs {
        match TcpStream::connect_timeout(a, timeout) {
            Ok(s) => {
                stream = Some(s);
                break;
            }
            Err(e) => last_err = Some(e),
        }
    }
    let mut stream = match stream {
        Some(s) => s,
        None => {
            let e = last_err.map_or_else(|| "no address".to_string(), |e| e.to_string());
            bail!("cannot connect to {}: {e}", ep.authority());
        }
    };
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    stream.set_nodelay(true)?;
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {}\r\nUser-Agent: yomi\r\nAccept: */*\r\nConnection: close\r\n",
        ep.authority()
    );
    if let Some(k) = api_key {
        head.push_str(&format!("Authorization: Bearer {k}\r\n"));
    }
    if let Some(b) = body {
        head.push_str(&format!(
            "Content-Type: application/json\r\nContent-Length: {}\r\n",
            b.len()
        ));
    }
    head.push_str("\r\n");
    let send = |s: &mut TcpStream| -> std::io::Result<()> {
        s.write_all(head.as_bytes())?;
        if let Some(b) = body {
            s.write_all(b)?;
        }
        s.flush()
    };
    // A server may answer (e.g. 413) and close before the whole body is sent: read the answer.
    let sent = send(&mut stream);
    let mut reader = BufReader::new(stream);
    let mut status_line = String::new();
    let read = reader.read_line(&mut status_line);
    if let Err(e) = sent
        && !matches!(read, Ok(n) if n > 0)
    {
        bail!("cannot send the request to {}: {e}", ep.authority());
    }
    read.with_context(|| format!("no response from {}", ep.authority()))?;
    if status_line.is_empty() {
        bail!("{} closed the connection without answering", ep.authority());
    }
    let mut parts = status_line.split_whitespace();
    let status: u16 = match (parts.next(), parts.next()) {
        (Some(v), Some(code)) if v.starts_with("HTTP/") => code
            .parse()
            .map_err(|_| anyhow!("bad status line {status_line:?}"))?,
        _ => bail!(
            "{} does not speak HTTP/1.1 (got {:?})",
            ep.authority(),
            status_line.trim_end()
        ),
    };
    let mut headers = Vec::new();
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 {
            break;
        }
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        if let Some((k, v)) = l.split_once(':') {
            headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
        }
    }
    let get = |name: &str| {
        headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    };
    let chunked =
        get("transfer-encoding").is_some_and(|v| v.to_ascii_lowercase().contains("chunked"));
    let body: Box<dyn BufRead + Send> = if chunked {
        Box::new(BufReader::new(Chunked {
            inner: reader,
            left: 0,
            done: false,
        }))
    } else if let Some(len) = get("content-length").and_then(|v| v.parse::<u64>().ok()) {
        Box::new(BufReader::new(reader.take(len)))
    } else {
        Box::new(reader)
    };
    Ok(Response {
        status,
        headers,
        body,
    })
}

/// POSTs a JSON value.
pub fn post_json(
    ep: &Endpoint,
    path: &str,
    body: &serde_json::Value,
    api_key: Option<&str>,
    timeout: Duration,
) -> Result<Response> {
    let bytes = serde_json::to_vec(body)?;
    request(ep, "POST", path, Some(&bytes), api_key, timeout)
}

/// GETs a path.
pub fn get(
    ep: &Endpoint,
    path: &str,
    api_key: Option<&str>,
    timeout: Duration,
) -> Result<Response> {
    request(ep, "GET", path, None, api_key, timeout)
}

/// The message of an OpenAI-style error body (`{"error": {"message": …}}`), else the text.
pub fn error_message(body: &str) -> String {
    serde_json::from_str::<serde_json::Value>(body)
        .ok()
        .and_then(|v| {
            let e = v.get("error")?;
            e.get("message")
                .and_then(|m| m.as_str())
                .or_else(|| e.as_str())
                .map(str::to_string)
        })
        .unwrap_or_else(|| body.trim().chars().take(300).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_parse() {
        let e = Endpoint::parse("http://127.0.0.1:8000").unwrap();
        assert_eq!(
            (e.host.as_str(), e.port, e.prefix.as_str()),
            ("127.0.0.1", 8000, "")
        );
        assert_eq!(e.v1("/chat/completions"), "/v1/chat/completions");
        let e = Endpoint::parse("http://localhost:8080/v1/").unwrap();
        assert_eq!(e.prefix, "/v1");
        assert_eq!(e.v1("/models"), "/v1/models");
        let e = Endpoint::parse("localhost").unwrap();
        assert_eq!(e.port, 80);
        let e = Endpoint::parse("http://[::1]:9000/api").unwrap();
        assert_eq!((e.host.as_str(), e.port), ("::1", 9000));
        assert_eq!(e.v1("/models"), "/api/v1/models");
        assert_eq!(e.to_string(), "http://[::1]:9000/api");
        assert!(Endpoint::parse("https://x").is_err());
        assert!(Endpoint::parse("ftp://x").is_err());
        assert!(Endpoint::parse("http://x:99999").is_err());
        assert!(Endpoint::parse("http://:80").is_err());
    }

    #[test]
    fn chunked_bodies_decode() {
        let raw = b"5\r\nhello\r\n7;ext=1\r\n, world\r\n0\r\nX-Trailer: 1\r\n\r\n";
        let mut r = Chunked {
            inner: &raw[..],
            left: 0,
            done: false,
        };
        let mut s = String::new();
        r.read_to_string(&mut s).unwrap();
        assert_eq!(s, "hello, world");
        let truncated = b"5\r\nhel";
        let mut r = Chunked {
            inner: &truncated[..],
            left: 0,
            done: false,
        };
        assert!(r.read_to_string(&mut String::new()).is_err());
    }

    #[test]
    fn events_parse() {
        let raw =
            ": keep-alive\n\ndata: {\"a\":1}\n\ndata: x\ndata: y\r\n\r\nevent: e\ndata: [DONE]\n\n";
        let mut r = Response {
            status: 200,
            headers: Vec::new(),
            body: Box::new(raw.as_bytes()),
        };
        assert_eq!(r.next_event().unwrap().as_deref(), Some("{\"a\":1}"));
        assert_eq!(r.next_event().unwrap().as_deref(), Some("x\ny"));
        assert_eq!(r.next_event().unwrap().as_deref(), Some("[DONE]"));
        assert_eq!(r.next_event().unwrap(), None);
        assert_eq!(
            error_message(r#"{"error":{"message":"bad","type":"x"}}"#),
            "bad"
        );
        assert_eq!(error_message("plain"), "plain");
    }
}
