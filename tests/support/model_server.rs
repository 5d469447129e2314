//! A loopback server that speaks OpenAI's chat completions and plays a
//! script: the "model" is a function of the request it receives (so a turn
//! can quote what the previous tool call really returned). A real HTTP
//! server and the real JSON wire format; shared by the fast and root tiers.
//! A turn is answered whole (`application/json`, as an endpoint that does
//! not stream does), or streamed as server-sent events, chunk by chunk at
//! the pace a script sets (as llama.cpp's server streams).

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};

/// What the scripted endpoint does with one request.
pub enum Turn {
    /// 200 with this chat-completions body.
    Reply(Value),
    /// Any status with a raw body.
    Status(u16, String),
    /// Wait, then answer (to provoke the client's timeout).
    Sleep(Duration, Box<Turn>),
    /// Stream this reply as server-sent events, one chunk per word of its
    /// content (and two per call), each after the pause given; a pause of
    /// `None` ends the stream there, unfinished and silent.
    Trickle(Value, Vec<Option<Duration>>),
}

type Script = dyn Fn(usize, &Value) -> Turn + Send + Sync;

/// A loopback chat-completions server: records each request (headers, body).
pub struct ModelServer {
    pub url: String,
    requests: Arc<Mutex<Vec<(String, Value)>>>,
}

impl ModelServer {
    /// `script(n, request)` answers the n-th request (0-based).
    pub fn start(script: impl Fn(usize, &Value) -> Turn + Send + Sync + 'static) -> ModelServer {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let requests: Arc<Mutex<Vec<(String, Value)>>> = Arc::default();
        let script: Arc<Script> = Arc::new(script);
        let recorded = requests.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { continue };
                let script = script.clone();
                let recorded = recorded.clone();
                std::thread::spawn(move || {
                    let mut reader = BufReader::new(conn.try_clone().unwrap());
                    let mut head = String::new();
                    let mut len = 0;
                    loop {
                        let mut line = String::new();
                        if reader.read_line(&mut line).unwrap_or(0) == 0 {
                            return;
                        }
                        if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                            len = v.trim().parse().unwrap_or(0);
                        }
                        if line == "\r\n" {
                            break;
                        }
                        head.push_str(&line);
                    }
                    let mut body = vec![0; len];
                    reader.read_exact(&mut body).unwrap();
                    let body: Value = serde_json::from_slice(&body).unwrap();
                    let n = {
                        let mut r = recorded.lock().unwrap();
                        r.push((head, body.clone()));
                        r.len() - 1
                    };
                    let mut turn = script(n, &body);
                    while let Turn::Sleep(d, then) = turn {
                        std::thread::sleep(d);
                        turn = *then;
                    }
                    let mut conn = conn;
                    if let Turn::Trickle(reply, pauses) = turn {
                        trickle(&mut conn, &reply, &pauses);
                        return;
                    }
                    let (status, text) = match turn {
                        Turn::Reply(v) => (200, v.to_string()),
                        Turn::Status(s, t) => (s, t),
                        Turn::Sleep(..) | Turn::Trickle(..) => unreachable!(),
                    };
                    let _ = write!(
                        conn,
                        "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                        text.len()
                    );
                    let _ = conn.write_all(text.as_bytes());
                });
            }
        });
        ModelServer {
            url: format!("http://127.0.0.1:{port}/v1"),
            requests,
        }
    }

    pub fn requests(&self) -> Vec<(String, Value)> {
        self.requests.lock().unwrap().clone()
    }

    /// `model:` for runwarden.yaml.
    pub fn settings(&self, extra: &str) -> String {
        self.settings_with("2s", 2, extra)
    }

    pub fn settings_with(&self, timeout: &str, retries: u32, extra: &str) -> String {
        format!(
            "model:\n  endpoint: {}\n  name: scripted-14b\n  api_key_env: RUNWARDEN_MODEL_KEY\n  timeout: {timeout}\n  retries: {retries}\n{extra}",
            self.url
        )
    }
}

/// A reply asking for these calls: (tool, arguments as the model writes them).
pub fn calls(list: &[(&str, String)]) -> Turn {
    let calls: Vec<Value> = list
        .iter()
        .enumerate()
        .map(|(i, (name, args))| {
            json!({ "id": format!("call_{i}"), "type": "function", "function": { "name": name, "arguments": args } })
        })
        .collect();
    Turn::Reply(json!({
        "choices": [{ "index": 0, "message": { "role": "assistant", "content": "", "tool_calls": calls }, "finish_reason": "tool_calls" }],
        "usage": { "prompt_tokens": 900, "completion_tokens": 30 }
    }))
}

pub fn call(tool: &str, args: Value) -> Turn {
    calls(&[(tool, args.to_string())])
}

pub fn answer(text: &str) -> Turn {
    Turn::Reply(json!({
        "choices": [{ "index": 0, "message": { "role": "assistant", "content": text }, "finish_reason": "stop" }],
        "usage": { "prompt_tokens": 1200, "completion_tokens": 80 }
    }))
}

/// The tool results of the request's last turn, unwrapped (the JSON between the markers).
pub fn results(req: &Value) -> Vec<Value> {
    let msgs = req["messages"].as_array().unwrap();
    let last_assistant = msgs.iter().rposition(|m| m["role"] == "assistant");
    msgs.iter()
        .skip(last_assistant.map_or(0, |i| i + 1))
        .filter(|m| m["role"] == "tool")
        .filter_map(|m| m["content"].as_str()?.lines().nth(1)?.parse().ok())
        .collect()
}

/// Stream `reply` (a whole chat completion) as server-sent events: its
/// content a word per chunk, then its calls, then usage and `[DONE]`; the
/// n-th chunk after `pauses[n]` (the last pause repeats), or never once a
/// pause is `None` (the connection then stays open and silent).
fn trickle(conn: &mut std::net::TcpStream, reply: &Value, pauses: &[Option<Duration>]) {
    let _ = write!(
        conn,
        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\nconnection: close\r\n\r\n"
    );
    let message = &reply["choices"][0]["message"];
    let mut chunks: Vec<Value> = message["content"]
        .as_str()
        .unwrap_or("")
        .split_inclusive(' ')
        .map(|w| json!({ "choices": [{ "index": 0, "delta": { "content": w } }] }))
        .collect();
    for (i, c) in message["tool_calls"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        let args = c["function"]["arguments"].as_str().unwrap_or("{}");
        let (a, b) = args.split_at(args.len() / 2);
        chunks.push(json!({ "choices": [{ "index": 0, "delta": { "tool_calls": [
            { "index": i, "id": c["id"], "type": "function", "function": { "name": c["function"]["name"], "arguments": a } }
        ] } }] }));
        chunks.push(json!({ "choices": [{ "index": 0, "delta": { "tool_calls": [
            { "index": i, "function": { "arguments": b } }
        ] } }] }));
    }
    chunks.push(json!({ "choices": [{ "index": 0, "delta": {}, "finish_reason": "stop" }], "usage": reply["usage"] }));
    for (n, chunk) in chunks.iter().enumerate() {
        match pauses.get(n).or(pauses.last()).copied().flatten() {
            Some(p) => std::thread::sleep(p),
            None => {
                std::thread::sleep(Duration::from_secs(3600));
                return;
            }
        }
        if write!(conn, "data: {chunk}\n\n").is_err() {
            return;
        }
        let _ = conn.flush();
    }
    let _ = write!(conn, "data: [DONE]\n\n");
}
