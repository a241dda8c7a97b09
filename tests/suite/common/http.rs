//! Plain HTTP/1.1 on loopback for the tests, below any library: a GET (or
//! any request, or raw bytes) that reports what came back (Envoy's answers, its admin interface, a metrics
//! endpoint), and an upstream server that answers `200 ok` to everything.

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// An HTTP server on loopback that answers `200 ok` to every request.
pub(crate) async fn start_upstream() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind upstream");
    let port = listener.local_addr().expect("upstream address").port();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buffer = Vec::new();
                let mut chunk = [0u8; 4096];
                // Keep-alive: answer each request head as it completes.
                while let Ok(read) = stream.read(&mut chunk).await {
                    if read == 0 {
                        return;
                    }
                    buffer.extend_from_slice(&chunk[..read]);
                    while let Some(end) = find(&buffer, b"\r\n\r\n") {
                        buffer.drain(..end + 4);
                        let reply = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
                        if stream.write_all(reply).await.is_err() {
                            return;
                        }
                    }
                }
            });
        }
    });
    port
}

/// What an HTTP request got back.
#[derive(Debug)]
pub(crate) struct HttpResponse {
    pub(crate) status: u16,
    /// Names in lower case.
    pub(crate) headers: Vec<(String, String)>,
    pub(crate) body: String,
}

impl HttpResponse {
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.as_str())
    }
}

/// The body of a GET that must succeed.
pub(crate) async fn get_body(port: u16, path: &str) -> String {
    let response = get(port, path, &[]).await.expect("an answer");
    assert_eq!(response.status, 200, "GET {path}: {response:?}");
    response.body
}

/// A GET on its own connection; `None` if nothing answered.
pub(crate) async fn get(port: u16, path: &str, headers: &[(&str, &str)]) -> Option<HttpResponse> {
    request(port, "GET", path, headers, "").await
}

/// A POST of `body` on its own connection; `None` if nothing answered.
pub(crate) async fn post(port: u16, path: &str, body: &str) -> Option<HttpResponse> {
    request(port, "POST", path, &[], body).await
}

/// A request on its own connection; `None` if nothing answered.
pub(crate) async fn request(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Option<HttpResponse> {
    let mut request =
        format!("{method} {path} HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n");
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    if !body.is_empty() {
        request.push_str(&format!("content-length: {}\r\n", body.len()));
    }
    request.push_str("\r\n");
    request.push_str(body);
    exchange(port, request.as_bytes()).await
}

/// Sends `raw` (a request as it goes on the wire, which should say
/// `connection: close`) on its own connection and reads the answer until
/// the server closes; `None` if nothing answered.
pub(crate) async fn exchange(port: u16, raw: &[u8]) -> Option<HttpResponse> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).await.ok()?;
    stream.write_all(raw).await.ok()?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await.ok()?;
    let head_end = find(&raw, b"\r\n\r\n")?;
    let head = String::from_utf8_lossy(&raw[..head_end]);
    let mut lines = head.split("\r\n");
    let status = lines.next()?.split(' ').nth(1)?.parse().ok()?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|line| line.split_once(':'))
        .map(|(name, value)| (name.trim().to_ascii_lowercase(), value.trim().to_owned()))
        .collect();
    let mut body = raw[head_end + 4..].to_vec();
    let chunked = headers_have(&headers, "transfer-encoding", "chunked");
    if chunked {
        body = dechunk(&body)?;
    }
    let body = String::from_utf8_lossy(&body).into_owned();
    Some(HttpResponse {
        status,
        headers,
        body,
    })
}

fn headers_have(headers: &[(String, String)], name: &str, value: &str) -> bool {
    headers
        .iter()
        .any(|(key, found)| key == name && found.eq_ignore_ascii_case(value))
}

/// Undoes `transfer-encoding: chunked`.
fn dechunk(mut raw: &[u8]) -> Option<Vec<u8>> {
    let mut body = Vec::new();
    loop {
        let line_end = find(raw, b"\r\n")?;
        let size_text = std::str::from_utf8(&raw[..line_end]).ok()?;
        let size = usize::from_str_radix(size_text.split(';').next()?.trim(), 16).ok()?;
        raw = &raw[line_end + 2..];
        if size == 0 {
            return Some(body);
        }
        body.extend_from_slice(raw.get(..size)?);
        raw = raw.get(size + 2..)?;
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack
        .windows(needle.len())
        .position(|window| window == needle)
}

/// A POST of JSON.
pub(crate) async fn post_json(port: u16, path: &str, body: &str) -> HttpResponse {
    request(
        port,
        "POST",
        path,
        &[("content-type", "application/json")],
        body,
    )
    .await
    .expect("an answer")
}

/// The response's body as JSON.
pub(crate) fn body_json(response: &HttpResponse) -> serde_json::Value {
    serde_json::from_str(&response.body)
        .unwrap_or_else(|err| panic!("not JSON ({err}): {response:?}"))
}

/// A refusal of the JSON API: `status`, naming `field`, its rule
/// containing `rule`.
pub(crate) fn assert_refused(response: &HttpResponse, status: u16, field: &str, rule: &str) {
    assert_eq!(response.status, status, "{response:?}");
    assert_eq!(response.header("content-type"), Some("application/json"));
    let body = body_json(response);
    assert_eq!(body["field"], field, "{response:?}");
    assert!(
        body["rule"]
            .as_str()
            .is_some_and(|text| text.contains(rule)),
        "rule should say {rule:?}: {response:?}"
    );
}

/// A JSON body over a 2048-byte `--max-request-bytes` to `path` is
/// refused with 413, whether its length is declared or found reading a
/// chunked body.
pub(crate) async fn assert_body_bounded_at_2048(port: u16, path: &str) {
    let declared = format!(
        "POST {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\
         content-type: application/json\r\ncontent-length: 2049\r\n\r\n"
    );
    let answer = exchange(port, declared.as_bytes())
        .await
        .expect("an answer");
    assert_refused(&answer, 413, "request", "at most 2048 bytes");
    let chunk = "x".repeat(3000);
    let chunked = format!(
        "POST {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\
         content-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n\
         {:x}\r\n{chunk}\r\n",
        chunk.len()
    );
    let answer = exchange(port, chunked.as_bytes()).await.expect("an answer");
    assert_refused(&answer, 413, "request", "at most 2048 bytes");
}
